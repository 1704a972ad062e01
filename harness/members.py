"""A pack's members: each its own seed and, with --pack, its own values of the settings its file can pack.

    python algos/per_dqn.py --pack alpha=0,0,0.6,0.6 seed=1,2,1,2    # 4 members: each (alpha, seed) pair

`--pack KEY=V1,V2,...` gives one value per member (as many as --num-seeds; without --num-seeds, their count is the
pack's size); values are read as YAML, like a config's. Members without `seed` in --pack take seeds seed, seed + 1,
.... Only the settings the file marks `Packable[...]` in its Args (those that change neither a tensor's shape nor
when the loop's events happen), `seed` and `run_name` may differ; any other is refused in one line naming it.

Each member is a complete run, as if launched alone with its own values: `members(args)` gives those arguments
(its config.yaml), and `carried(args, members)` the pack's arguments as its file reads them: a setting whose values
differ is a float64 tensor [members, 1] on the run's device (exact, so cast it to a formula's dtype: `per_leaf`,
`clip_grad_norm` and the buffers do), a string setting a NumPy array [members, 1]; a setting all members share
stays a plain value. `each(members, f, ...)` computes a value in Python on each member's own numbers (schedules
with min and max, NumPy noise): a float64 tensor [members, 1] on the CPU, or the one value they share.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import yaml

from .args import fail, instance, packable

ALWAYS = ("seed", "run_name")  # every file's members may differ in these


def packed(args) -> dict[str, list[str]]:
    """{setting: its raw values, one per member} from args.pack (checked: packable, one value per member)."""
    raw: dict[str, list[str]] = {}
    allowed = (*ALWAYS, *packable(type(args)))
    for item in args.pack:
        key, eq, text = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not eq or not key or not text:
            fail(f"--pack takes KEY=V1,V2,... (one value per member), got {item!r}")
        if key not in {field.name for field in dataclasses.fields(args)}:
            fail(f"--pack {key}: there is no such setting (see --help)")
        if key not in allowed:
            fail(f"--pack {key}: {key} changes a tensor's shape or when the loop's events happen, so the members of a "
                 f"pack cannot differ in it (packable: {', '.join(allowed)}); run.py --sweep launches a pack per value")
        if key in raw:
            fail(f"--pack {key} is given twice; list all its values in one KEY=V1,V2,...")
        raw[key] = [value.strip() for value in text.split(",")]
    sizes = {len(values) for values in raw.values()}
    if len(sizes) > 1 or sizes and args.num_seeds > 1 and sizes != {args.num_seeds}:
        counts = ", ".join(f"{key} {len(values)}" for key, values in raw.items())
        fail(f"--pack needs one value per member of the pack (--num-seeds {args.num_seeds}), got {counts}")
    return raw


def members(args) -> list:
    """Each member's arguments, as a lone run of it would have them (one seed, its own values, no --pack)."""
    raw = packed(args)
    size = len(next(iter(raw.values()))) if raw else args.num_seeds
    plain = replace(args, pack=(), num_seeds=1)  # its config.yaml reruns it alone
    runs = []
    for i in range(size):
        values = {key: yaml.safe_load(texts[i]) for key, texts in raw.items()}
        values.setdefault("seed", args.seed + i)
        runs.append(instance(type(args), dataclasses.asdict(plain) | values, "--pack"))
    return runs


def names(args, runs: list, raw: dict[str, list[str]], stamp: int) -> list[str]:
    """Each member's run directory name: --pack run_name's, or --run-name with {seed} and {KEY} replaced by the
    member's values (KEY=value and the seed appended to a name without them), or <env>__<exp_name>[__KEY=value...]
    __<seed>__<time>; the swept values as given."""
    swept = [key for key in raw if key not in ALWAYS]
    if "run_name" in raw:
        return raw["run_name"]
    result = []
    for i, run in enumerate(runs):
        values = {key: safe(raw[key][i]) for key in swept} | {"seed": str(run.seed)}
        tags = "".join(f"__{key}={values[key]}" for key in swept)
        if args.run_name and (len(runs) == 1 or "{" in args.run_name):
            name = args.run_name
        elif args.run_name:
            name = f"{args.run_name}{tags}__{{seed}}"
        else:
            name = f"{args.env.replace('/', '-')}__{args.exp_name}{tags}__{{seed}}__{stamp}"
        result.append(re.sub(r"\{(\w+)\}", lambda m, v=values: v.get(m.group(1), m.group(0)), name))
    if len(set(result)) < len(result):
        fail(f"the members of the pack would share run directories ({', '.join(result)}): name them apart, with "
             "{seed} and {KEY} in --run-name")
    return result


def safe(text: str) -> str:
    """Text fit for a directory name on any filesystem (and a W&B run name)."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "-", text)


def carried(args, runs: list, device: torch.device):
    """The pack's arguments as its file reads them: a setting the members differ in as a value with the pack's
    leading dimension, [members, 1] (floats: float64 tensors on `device`; others: a NumPy array)."""
    changes: dict[str, Any] = {"pack": (), "num_seeds": len(runs), "seed": runs[0].seed}
    for field in dataclasses.fields(args):
        values = [getattr(run, field.name) for run in runs]
        if field.name in ("seed", "run_name", "pack", "num_seeds"):
            continue
        if all(v == values[0] for v in values):  # (--pack alpha=0,0: every member's alpha is 0)
            changes[field.name] = values[0]
            continue
        if any(v is None for v in values):  # (td_lambda: a member without one would train another algorithm)
            fail(f"--pack {field.name}: the members of a pack must all have a value, or all none")
        numbers = all(isinstance(v, float | int) and not isinstance(v, bool) for v in values)
        changes[field.name] = torch.tensor(values, dtype=torch.float64, device=device).view(-1, 1) if numbers \
            else np.array(values, dtype=object).reshape(-1, 1)
    return replace(args, **changes)


def each(runs: list, f, *inputs):
    """f(*inputs, member's args) for every member (a string f: that setting): one value when all members agree
    (a lone run: its value), else a float64 tensor [members, 1]. Schedules computed in Python so, on each member's
    own numbers, give each member the value it has alone."""
    values = [getattr(run, f) if isinstance(f, str) else f(*inputs, run) for run in runs]
    if all(v == values[0] for v in values):
        return values[0]
    return torch.tensor(values, dtype=torch.float64).view(-1, 1)


def repacked(args, runs: list):
    """The pack's arguments (--pack) that give these members (after a resume extended each on its own)."""
    changes, pack = {}, []
    for field in dataclasses.fields(args):
        values = [getattr(run, field.name) for run in runs]
        if field.name in ("pack", "num_seeds"):
            continue
        if all(v == values[0] for v in values) and (field.name != "seed" or len(runs) == 1):  # (seeds: 1, 1 or 1, 2)
            changes[field.name] = values[0]
        else:
            pack.append(f"{field.name}={','.join(repr(v) if isinstance(v, float) else str(v) for v in values)}")
    return replace(args, **changes, pack=tuple(pack), num_seeds=len(runs))


def per_leaf(value, like):
    """A value for an elementwise formula with each tensor of `like` (a TensorDict of a pack's stacked tensors): a
    number as it is, a per-member [members, 1] value as a TensorDict of [members, 1, ...] in each tensor's dtype
    (target_params.lerp_(params, per_leaf(tau, params)))."""
    if not isinstance(value, torch.Tensor):
        return value
    return like.apply(lambda x: value.to(x.device, x.dtype).view(-1, *[1] * (x.dim() - 1)))


def chosen(value, **options):
    """options[value] (a function); a pack whose members differ in it ([members, 1] names): a function that computes
    each option named and gives each member the rows of its own, torch.where over the leading dimension (so a
    member's values, and its gradient, are those of its option alone)."""
    if not isinstance(value, np.ndarray):
        return options[value]
    names = value.reshape(-1)

    def each_own(*inputs, **kwargs):
        out = None
        for name in dict.fromkeys(names):
            result = options[name](*inputs, **kwargs)
            mine = torch.as_tensor(names == name, device=result.device).view(-1, *[1] * (result.dim() - 1))
            out = result if out is None else torch.where(mine, result, out)
        return out

    return each_own
