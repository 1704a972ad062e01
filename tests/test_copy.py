"""Copy one file and go: each algorithm file, copied with `buffers/`, `envs/` and `harness/` into an empty directory
(as a researcher copies it into their own code), runs there as a script and leaves a complete run directory;
renamed packages work after changing only their import lines (the file's, and harness's of envs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # each test starts Python processes that train for a few seconds

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "dqn": ["--env", "CartPole-v1", "--total-timesteps", "300", "--learning-starts", "100", "--train-frequency", "1",
            "--gradient-steps", "1", "--batch-size", "16"],
    "ddpg": ["--env", "Pendulum-v1", "--total-timesteps", "300", "--learning-starts", "100", "--batch-size", "16"],
}


def copied(tmp_path: Path, algo: str, buffers: str = "buffers", envs: str = "envs", harness: str = "harness") -> Path:
    """algos/<algo>.py (renamed research_<algo>.py) beside copies of buffers/, envs/ and harness/, in a fresh
    directory, each package under the name given."""
    work = tmp_path / "research"
    work.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    names = {"buffers": buffers, "envs": envs, "harness": harness}
    for package, name in names.items():
        shutil.copytree(ROOT / package, work / name, ignore=ignore)
    files = [ROOT / "algos" / f"{algo}.py", *sorted((work / harness).glob("*.py"))]
    for path in files:  # the only lines a renamed copy changes: `from <package> import`
        text = path.read_text()
        for package, name in names.items():
            text = text.replace(f"from {package} import", f"from {name} import")
        (work / f"research_{algo}.py" if path.parent.name == "algos" else path).write_text(text)
    return work


def run_copy(work: Path, algo: str) -> subprocess.CompletedProcess:
    # No PYTHONPATH and a cwd outside the repository: only the copies can be imported (the installed
    # package would shadow a missing copy, so the check below also asks where they came from).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"WANDB_MODE": "disabled"}
    argv = TINY["ddpg" if algo == "ddpg" else "dqn"] + ["--eval-episodes", "1", "--no-cuda", "--run-name", "r"]
    return subprocess.run([sys.executable, f"research_{algo}.py", *argv], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("algo", ["dqn", "per_dqn", "nstep_dqn", "ddpg"])
def test_an_algorithm_file_runs_from_a_copy_with_buffers_and_envs(tmp_path, algo):
    work = copied(tmp_path, algo)
    out = run_copy(work, algo)
    assert out.returncode == 0, out.stdout + out.stderr
    run = work / "runs" / "r"
    assert {p.name for p in run.iterdir()} >= {"config.yaml", "metrics.jsonl", "summary.json"}
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["exp_name"] == f"research_{algo}"  # a renamed copy logs under its own name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 300 and summary["updates"] > 0 and summary["eval_episodes"] == 1
    assert f"final evaluation: {summary['eval_return_mean']:.1f}" in out.stdout


def test_renamed_packages_work_after_changing_only_the_import_lines(tmp_path):
    """A research repository that already has `buffers`, `envs` and `harness` packages vendors ours under other
    names: the packages import their own modules relatively, so only the `from <package> import` lines change."""
    work = copied(tmp_path, "per_dqn", buffers="zoo_buffers", envs="zoo_envs", harness="zoo_harness")
    changed = [p.name for p in (work / "zoo_harness").glob("*.py") if "zoo_envs" in p.read_text()]
    assert sorted(changed) == ["args.py", "resume.py", "run.py"]  # the README names these three
    for name in ("buffers", "envs", "harness"):  # the research code's own packages of those names, in the way
        (work / name).mkdir()
        (work / name / "__init__.py").write_text("raise ImportError('the research code's own package')\n")
    out = run_copy(work, "per_dqn")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads((work / "runs" / "r" / "summary.json").read_text())["global_step"] == 300
