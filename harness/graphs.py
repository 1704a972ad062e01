"""--cudagraphs: a learner step captured as CUDA graphs and replayed (Run.graphed hands it out).

    learn = LearnerGraphs(learn, buffer)      # learn(*counts) -> metrics; buffer: one that reads only device tensors
    metrics = learn(steps, moves)             # eager for the first calls of each (steps, moves), then a replay
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class LearnerGraphs:
    """A learner step replayed from CUDA graphs: one graph per value of its host-int arguments (e.g. (gradient steps,
    target moves) of a loop iteration: (8, 0) and (8, 1) with 8 envs), captured after `warmup` eager calls with
    those arguments, then replayed. Nothing is read back to the host: the graph's outputs are its static tensors,
    valid until the next call. The buffer must read only device tensors while sampling and writing priorities
    (PrioritizedReplayBuffer with deferred validation does), its generators are registered with each graph so that
    every replay draws afresh, and its deferred checks, which no replay runs, are made every `check_interval` calls.
    Graphs share one memory pool."""

    def __init__(self, learn: Callable, buffer, warmup: int = 3, check_interval: int = 100):
        self.learn, self.buffer, self.warmup, self.check_interval = learn, buffer, warmup, check_interval
        self.graphs, self.calls, self.pool, self.count = {}, {}, None, 0

    def __call__(self, *counts: int):
        self.count += 1
        if self.count % self.check_interval == 0 and hasattr(self.buffer, "check"):
            self.buffer.check()  # bad priorities: raise here, as an eager run would (one host read)
        if counts in self.graphs:
            graph, out = self.graphs[counts]
            graph.replay()
            return out
        self.calls[counts] = self.calls.get(counts, 0) + 1
        if self.calls[counts] <= self.warmup:  # eager, on a side stream as capture requires (lazy state, cuBLAS)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.learn(*counts)
            torch.cuda.current_stream().wait_stream(side)
            return out
        graph = torch.cuda.CUDAGraph()
        for generator in self.buffer.generators:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph, pool=self.pool):  # capture records the kernels without running them
            out = self.learn(*counts)
        self.pool, self.graphs[counts] = graph.pool(), (graph, out)
        graph.replay()  # this call's work
        return out
