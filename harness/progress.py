"""What a run prints while it trains: a progress bar on a terminal; where stderr is not one (a batch job's log,
nohup, a pipe) a plain line every PLAIN_EVERY_S seconds instead, since a bar redrawn with carriage returns is
unreadable in a file; and one line for each periodic evaluation, on both."""

from __future__ import annotations

import sys
import time

import numpy as np
from tqdm import tqdm

PLAIN_EVERY_S = 300.0  # a two-hour run in a log file: about 25 progress lines


class Progress:
    def __init__(self, total: int, initial: int):
        self.total, self.said = total, time.time()
        self.bar = tqdm(total=total, initial=initial, unit="step", mininterval=1.0, disable=not sys.stderr.isatty())

    def update(self, step: int, sps: float, recent: list[float]) -> None:
        """At each 1000 steps: the bar, or the plain line when PLAIN_EVERY_S have passed since the last."""
        recent_return = f"{np.mean(recent):.1f}" if recent else "-"
        if not self.bar.disable:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(SPS=f"{sps:.0f}", recent_return=recent_return)
        elif time.time() - self.said >= PLAIN_EVERY_S:
            self.said = time.time()
            left = duration((self.total - step) / max(sps, 1e-9))
            print(f"step {step:,} of {self.total:,} ({100 * step / self.total:.0f}%) | {sps:.0f} steps/s | "
                  f"recent return {recent_return} | about {left} of training left", flush=True)

    def evaluation(self, step: int, returns: list[list[float]]) -> None:
        say(evaluation_line(step, returns))

    def close(self) -> None:
        self.bar.close()


def say(line: str) -> None:
    """A line between the bar's redraws, seen at once also where stdout is a file (block-buffered there)."""
    tqdm.write(line)
    sys.stdout.flush()


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (0 for a single value)."""
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def spread(values: list[float], unit: str) -> str:
    mean, std = mean_std(values)
    return f"{mean:.1f} ± {std:.1f} over {len(values)} {unit}"


def evaluation_line(step: int, returns: list[list[float]]) -> str:
    """One seed: the mean ± sample std of its episodes; a pack: of its seeds' means, each seed's mean beside."""
    if len(returns) == 1:
        return f"evaluation at step {step:,}: {spread(returns[0], 'episodes')}"
    means = [float(np.mean(episodes)) for episodes in returns]
    return f"evaluation at step {step:,}: {spread(means, 'seeds')} ({', '.join(f'{mean:.1f}' for mean in means)})"


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"
