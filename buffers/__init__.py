"""Replay storage for off-policy RL: uniform and prioritized sampling, n-step returns.

    rb = ReplayBuffer(capacity, device="cpu", seed=0)
    idx = rb.extend(td)                 # TensorDict [B] -> int64 indices [B]
    batch = rb.sample(256)              # TensorDict [256] plus "index"

    prb = PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4)
    batch = prb.sample(256)             # plus "index" and "weight"
    prb.update_priority(batch["index"], td_error.abs())

    nstep = NStepReturns(n=3, gamma=0.99, num_envs=8)
    rb.extend(nstep.push(step))         # step: TensorDict [8] of one vector-env step

    loader = Prefetcher(prb, 256, device="cuda")    # host buffer, GPU learner: see prefetch.py
    rb = ReplayBuffer(capacity, frame_stack=4)   # Atari: each frame of the obs stacks stored once
    rb.extend(nstep.push(rb.add_frames(step)))   # add_frames: stacks -> positions; sample gives stacks

    rb = PrioritizedReplayBuffer(capacity, seed=1, num_seeds=N)   # seeds 1..N: storage [N, capacity], a tree each
    nstep = NStepReturns(3, 0.99, num_envs=E, num_seeds=N)        # steps [N * E]; transitions say their seed
    rb.extend(nstep.push(step)); batch = rb.sample(64)            # [N, 64]; row i is seed i's alone
"""

from .frames import FrameStore
from .nstep import NStepReturns
from .prefetch import Prefetcher
from .prioritized import PrioritizedReplayBuffer, SegmentTree
from .replay import ReplayBuffer
from .returns import lambda_returns

__all__ = ["FrameStore", "NStepReturns", "Prefetcher", "PrioritizedReplayBuffer", "ReplayBuffer", "SegmentTree",
           "lambda_returns"]
