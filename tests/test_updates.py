"""Every optimizer step of algos/*.py moves its own objective the right way, from this step's gradient alone,
and touches nothing but its own network: the DQN files' TD update (`make_update`) and DDPG's critic and actor
updates (`make_updates`).

Each test builds the pieces as `main` builds them (networks seeded by `args.seed`, targets on the meta device
reading a copy of the parameters, fused Adam, for DQN with a tensor learning rate, DDPG's observation
normaliser): `build` runs the file's own `main` up to its `make_update(s)` call, takes what `main` hands it
and stops there (no environment step; the env is only created). The updates under test are the closures the
file's own `make_update(s)` returns, run on one fixed batch made by hand. Each test compares what a step did
with the documented objective computed here, independently:

- DQN: mean over the batch of huber(Q(s, a) - y) (per_dqn: weighted by the importance weights), where
  y = r + gamma * (1 - terminated) * max_a' Q_target(s', a') (per_dqn, nstep_dqn: r + discount * max ...);
  the gradient clipped to max_grad_norm before the step.
- DDPG critic: mean of (Q(s, a) - y)^2, y = r + discount * Q_target(s', actor_target(s')).
- DDPG actor: -mean Q(s, actor(s)) under the current critic (the actor climbs the critic).
  DDPG runs with normalize_obs=True and fixed statistics, so the observations each network sees matter.

The targets are moved away from the online networks first, so that a step that wrote them, or a loss that
used the online network as its target, shows. tests/README.md ("Mutations", "update directions") lists the
mistakes these tests were seen to catch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict, from_module

from tests.algo_utils import load_algo

SEED = 3  # args.seed (main seeds the networks with it) and the batch's generator
BATCH = 32
LR = 1e-5  # small: a step is close to first order, so the objective must fall (Adam moves each weight ~lr)
RTOL, ATOL = 1e-4, 1e-6  # applied gradient vs the gradient computed here (float32 rounding; gradients ~1e-3)
ALGOS: dict[str, ModuleType] = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn", "ddpg")}
CHANGES = {"ddpg": dict(normalize_obs=True)}  # the normaliser is on, with fixed statistics (see build)
STEPS = [("dqn", "td"), ("per_dqn", "td"), ("nstep_dqn", "td"), ("ddpg", "critic"), ("ddpg", "actor")]
IDS = [f"{name}-{step}" for name, step in STEPS]


pytestmark = pytest.mark.usefixtures("main_in_tmp_path")  # see conftest.py


# ---- the helper every test calls -------------------------------------------------------------------------


@dataclasses.dataclass
class Step:
    """One optimizer step of a file: its closure on the fixed batch, its optimizer, the network it must move,
    the objective it must lower (computed here at the current parameters) and the gradient norm it clips to."""

    update: Callable[[], TensorDict]
    optimizer: torch.optim.Optimizer
    network: nn.Module
    objective: Callable[[], torch.Tensor]
    clip: float | None


@dataclasses.dataclass
class Built:
    steps: dict[str, Step]
    networks: dict[str, nn.Module]  # the online networks: "q" (DQN) or "actor" and "qf" (DDPG)
    targets: dict[str, nn.Module]  # the target networks (meta-device modules reading the target parameters)


class _Stop(Exception):
    """Raised by the spy on make_update(s): main has built everything the updates need."""


def huber(error: torch.Tensor) -> torch.Tensor:
    return torch.where(error.abs() < 1, 0.5 * error.square(), error.abs() - 0.5)


def build(monkeypatch, name: str) -> Built:
    """The networks, targets and optimizers as the file's main builds them (args.seed = SEED, learning rate LR),
    the targets then moved away from the online networks, a fixed batch, and the file's own update closures."""
    algo = ALGOS[name]
    args = dataclasses.replace(algo.Args(), seed=SEED, learning_rate=LR, cuda=False, buffer_size=BATCH,
                               batch_size=BATCH, run_name="updates", **CHANGES.get(name, {}))
    maker = "make_updates" if name == "ddpg" else "make_update"
    real, seen, envs = getattr(algo, maker), [], []
    make_env = algo.Run.make_env

    def spy(*arguments):
        seen.append(arguments)
        raise _Stop

    def recorded_env(self):
        envs.append(make_env(self))
        return envs[-1]

    monkeypatch.setattr(algo, maker, spy)
    monkeypatch.setattr(algo.Run, "make_env", recorded_env)
    try:
        with pytest.raises(_Stop):
            algo.main(args)
    finally:
        for env in envs:
            env.close()
    (arguments,) = seen
    g = torch.Generator().manual_seed(SEED)

    with torch.no_grad():  # targets away from the online networks: a lagging target, as during training
        for target in arguments[2:4] if name == "ddpg" else arguments[1:2]:
            for key, tensor in from_module(target).items(True, True):
                if key[-1] in ("weight", "bias") and key[0] == "net":
                    tensor.add_(0.05 * torch.randn(tensor.shape, generator=g))

    terminated = torch.rand(BATCH, generator=g) < 0.25
    truncated = ~terminated & (torch.rand(BATCH, generator=g) < 0.1)
    if name == "ddpg":
        actor, qf, actor_target, qf_target, _, _, obs_norm, _ = arguments
        low, high = torch.tensor([-1.0, -1.0, -8.0]), torch.tensor([1.0, 1.0, 8.0])  # Pendulum's Box(3,)
        observe = lambda n: low + (high - low) * torch.rand(n, 3, generator=g)
        obs_norm.update(observe(256)[None])  # fixed statistics: not updated by the steps
        action = 4 * torch.rand(BATCH, 1, generator=g) - 2  # Box(1,) in [-2, 2]
        reward = -16 * torch.rand(BATCH, generator=g)
    else:
        q_network, target_network = arguments[0], arguments[1]
        observe = lambda n: torch.randn(n, 4, generator=g)  # CartPole's Box(4,)
        action = torch.randint(0, 2, (BATCH,), generator=g)
        reward = 3 * torch.randn(BATCH, generator=g)  # TD errors on both sides of the Huber bend
    folded = torch.randint(1, 4, (BATCH,), generator=g) if name in ("nstep_dqn", "per_dqn", "ddpg") else 1
    batch = TensorDict(obs=observe(BATCH), action=action, reward=reward, next_obs=observe(BATCH),
                       terminated=terminated, truncated=truncated,
                       discount=torch.where(terminated, 0.0, args.gamma ** folded),
                       weight=0.1 + 0.9 * torch.rand(BATCH, generator=g), batch_size=[BATCH]).unsqueeze(0)  # 1 seed
    b = batch[0]  # the seed's batch, for the objectives written for one network

    if name == "ddpg":
        update_critic, update_actor = real(*arguments)
        actor_optimizer, qf_optimizer = arguments[4], arguments[5]
        obs, next_obs = obs_norm(batch["obs"]), obs_norm(batch["next_obs"])

        def critic_objective() -> torch.Tensor:
            with torch.no_grad():
                y = batch["reward"] + batch["discount"] * qf_target(next_obs, actor_target(next_obs))
            return (qf(obs, batch["action"]) - y).square().mean()

        def actor_objective() -> torch.Tensor:
            return -qf(obs, actor(obs)).mean()

        steps = {"critic": Step(lambda: update_critic(batch), qf_optimizer, qf, critic_objective, None),
                 "actor": Step(lambda: update_actor(batch), actor_optimizer, actor, actor_objective, None)}
        return Built(steps, {"actor": actor, "qf": qf}, {"actor": actor_target, "qf": qf_target})

    update = real(*arguments)

    def td_objective() -> torch.Tensor:
        with torch.no_grad():
            bootstrap = args.gamma * (~b["terminated"]) if name == "dqn" else b["discount"]
            y = b["reward"] + bootstrap * target_network(b["next_obs"][None])[0].max(dim=1).values
        q = q_network(b["obs"][None])[0][torch.arange(BATCH), b["action"]]
        loss = (q - y).square() if args.loss == "mse" else huber(q - y)
        return (b["weight"] * loss if name == "per_dqn" else loss).mean()

    step = Step(lambda: update(batch), arguments[2], q_network, td_objective, args.max_grad_norm)
    return Built({"td": step}, {"q": q_network}, {"q": target_network})


def expected_gradient(step: Step) -> list[torch.Tensor]:
    """The gradient of the step's objective at the current parameters, clipped as the step clips it."""
    grads = torch.autograd.grad(step.objective(), list(step.network.parameters()))
    if step.clip is not None:  # clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        grads = [g * min(1.0, step.clip / (float(norm) + 1e-6)) for g in grads]
    return list(grads)


def applied_gradients(step: Step) -> list[list[tuple[torch.Tensor, torch.Tensor | None]]]:
    """A spy on the step's optimizer: for every optimizer.step() call, (parameter, copy of its .grad) for each
    parameter the optimizer holds, as the step is about to apply them."""
    calls = []

    def hook(optimizer, _args, _kwargs):
        calls.append([(p, None if p.grad is None else p.grad.clone())
                      for group in optimizer.param_groups for p in group["params"]])

    step.optimizer.register_step_pre_hook(hook)
    return calls


def assert_applies(call: list[tuple[torch.Tensor, torch.Tensor | None]], step: Step, expected: list[torch.Tensor]):
    """The optimizer stepped exactly its network's parameters, each with the expected gradient."""
    assert [id(p) for p, _ in call] == [id(p) for p in step.network.parameters()], \
        "the optimizer steps other parameters than its network's"
    for (_, grad), want in zip(call, expected, strict=True):
        assert grad is not None, "a parameter of the network has no gradient at the step"
        torch.testing.assert_close(grad, want, rtol=RTOL, atol=ATOL)


def grads(network: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in network.parameters()]


def same_grads(a: list[torch.Tensor | None], b: list[torch.Tensor | None]) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b, strict=True))


# ---- 1. direction ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "which"), STEPS, ids=IDS)
def test_a_small_step_lowers_its_own_objective(monkeypatch, name, which):
    """One step at learning rate 1e-5 on the fixed batch lowers the step's objective on that batch, computed
    here: the TD / critic loss falls, and the actor's -Q(s, actor(s)) falls, i.e. Q rises under the critic.
    Seed 3; a strict fall (Adam's first step moves each weight by ~1e-5 against its gradient's sign).
    Fails if the step climbs its loss (the sign flipped: `(-loss).backward()`, `qf(...).mean()` for the actor)
    or moves other parameters than its network's (the optimizer built over the wrong network)."""
    step = build(monkeypatch, name).steps[which]
    with torch.no_grad():
        before = step.objective().item()
    step.update()
    with torch.no_grad():
        after = step.objective().item()
    assert after < before, f"the {which} objective went from {before} to {after}"


@pytest.mark.parametrize(("name", "which"), STEPS, ids=IDS)
def test_the_step_applies_the_gradient_of_its_objective(monkeypatch, name, which):
    """The gradient the optimizer applies at the step (read from .grad by a pre-hook on optimizer.step) is the
    gradient of the documented objective, computed here with torch.autograd.grad (DQN: then clipped to
    max_grad_norm), sign included, over exactly the network's parameters; rtol 1e-4, atol 1e-6, seed 3.
    Fails if the loss's sign is flipped, the actor descends the critic, the loss or its target is another
    (online network as target, weights dropped, raw observations), or the optimizer holds other parameters."""
    step = build(monkeypatch, name).steps[which]
    expected = expected_gradient(step)
    calls = applied_gradients(step)
    step.update()
    assert len(calls) == 1
    assert_applies(calls[0], step, expected)


# ---- 2. fresh gradients -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "which"), STEPS, ids=IDS)
def test_a_second_step_applies_its_own_gradient_alone(monkeypatch, name, which):
    """Two consecutive steps on the same batch: at the second, the optimizer applies the gradient of the
    objective at the parameters the first step left (computed here), not that plus the first step's (the two
    are nearly equal at this learning rate, so a carried-over gradient about doubles it; DQN's clip at
    max_grad_norm 10 stays inactive for this batch, whose gradient norm is about 1); rtol 1e-4, seed 3.
    Fails if the step's zero_grad is missing (DQN `optimizer.zero_grad()`, DDPG `qf_optimizer.zero_grad()`
    or `actor_optimizer.zero_grad()`)."""
    step = build(monkeypatch, name).steps[which]
    calls = applied_gradients(step)
    step.update()
    expected = expected_gradient(step)
    if step.clip is not None:  # an active clip would scale a doubled gradient back to the same norm
        assert 2 * torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected])) < step.clip
    step.update()
    assert len(calls) == 2
    assert_applies(calls[1], step, expected)


@pytest.mark.parametrize(("name", "which"), STEPS, ids=IDS)
def test_a_step_leaves_the_other_networks_gradients_alone(monkeypatch, name, which):
    """After the other DDPG step has run (so the other network holds a gradient), this step leaves that
    .grad exactly as it was: the actor step does not add to the critic's .grad nor clear it, the critic step
    the actor's. Every step leaves the target networks without a gradient (the TD target is a constant).
    Exact (bit for bit), seed 3.
    Fails if the actor's `loss.backward(inputs=list(actor.parameters()))` becomes `loss.backward()`, if an
    optimizer holds the other network's parameters (its zero_grad clears them), or if the TD target is
    computed with gradients (`torch.no_grad()` dropped)."""
    built = build(monkeypatch, name)
    step = built.steps[which]
    others = [s for key, s in built.steps.items() if key != which]
    for other in others:
        other.update()
    before = {key: grads(network) for key, network in built.networks.items() if network is not step.network}
    step.update()
    for key, network in built.networks.items():
        if network is not step.network:
            assert same_grads(grads(network), before[key]), f"the {which} step changed {key}'s .grad"
    for key, target in built.targets.items():
        assert all(p.grad is None for p in target.parameters()), f"the {which} step gave target {key} a .grad"


# ---- 3. what each optimizer updates ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "which"), STEPS, ids=IDS)
def test_a_step_moves_its_own_network_and_nothing_else(monkeypatch, snapshot, name, which):
    """After the other DDPG step has run (so the other optimizer holds state), this step changes its own
    network's parameters and leaves every other network's parameters, every other optimizer's state and all
    target parameters bit for bit as they were: targets move only through main's target update (lerp_).
    Exact (bytes compared), seed 3.
    Fails if an update writes the target parameters (a lerp_ inside the update), or an optimizer is built
    over the other network's parameters (or both)."""
    built = build(monkeypatch, name)
    step = built.steps[which]
    others = [s for key, s in built.steps.items() if key != which]
    for other in others:
        other.update()

    def picture():
        return ({key: snapshot(from_module(n).data) for key, n in built.networks.items()},
                {key: snapshot(from_module(t).data) for key, t in built.targets.items()},
                [snapshot(other.optimizer.state_dict()) for other in others])

    (networks, targets, optimizers), own = picture(), next(k for k, n in built.networks.items() if n is step.network)
    step.update()
    networks_after, targets_after, optimizers_after = picture()
    assert networks_after[own] != networks[own], f"the {which} step did not move {own}"
    assert {k: v for k, v in networks_after.items() if k != own} == {k: v for k, v in networks.items() if k != own}
    assert targets_after == targets, f"the {which} step changed target parameters"
    assert optimizers_after == optimizers, f"the {which} step changed the other optimizer's state"
