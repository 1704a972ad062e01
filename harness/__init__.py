"""The run around an algorithm file: its arguments, run directories, metrics, W&B, progress bar, evaluations,
checkpoints, signals, --resume, --evaluate and packs of seeds. It knows no algorithm: a file hands it its
networks, its evaluation policy and the parts a checkpoint saves.

    @dataclass
    class Args(RunArgs):                   # the algorithm's hyper-parameters; RunArgs: the run's options
        learning_rate: float = 1e-3        # Adam's learning rate

    args = parse_args(Args, __doc__)       # tyro; --config, the Atari preset, --resume, --evaluate
    run = Run(args, extended)              # see run.py for the calls a loop makes
    net = run.networks(make)               # the plain network; a pack: each seed's, stacked (seeds.py)

Like buffers/ and envs/, it imports its own modules relatively; it uses envs/ (one import line in each of args.py,
run.py and resume.py).
"""

from .args import Packable, RunArgs, fail, parse_args, type_name, typed
from .kinds import PackError
from .members import chosen, per_leaf
from .optim import SeedAdam, adam, clip_grad_norm
from .precision import pixels
from .products import SeedConv2d, SeedLinear
from .run import Run, crossed
from .seeds import seed_state_dict, stacked

__all__ = ["Packable", "PackError", "Run", "RunArgs", "SeedAdam", "SeedConv2d", "SeedLinear", "adam", "chosen",
           "clip_grad_norm", "crossed", "fail", "parse_args", "per_leaf", "pixels", "seed_state_dict", "stacked",
           "type_name", "typed"]
