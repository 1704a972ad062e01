"""benchmarks/README.md opens with an index of claims: each number the README and docs/ state, with its command.
These tests keep that index honest without running a measurement: each command names a script that is there and
takes the flags given (its own argparse, or the algorithm file's parser, stopped right after parsing), every script
in benchmarks/ backs a row of the index, every results file is cited somewhere, and the pages' references to
benchmark scripts and to sections of the benchmark pages resolve."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), BENCHMARKS / "README.md",
         BENCHMARKS / "results.md", ROOT / "tests" / "README.md"]


def index_commands() -> list[list[str]]:
    """The commands of the index's table: each code span that runs a script, as its words (environment variables
    and `/usr/bin/time -v` left off, the interpreter first)."""
    text = (BENCHMARKS / "README.md").read_text()
    index = text.split("\n## Index of claims\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for span in re.findall(r"`([^`]+)`", "\n".join(line for line in index.splitlines() if line.startswith("|"))):
        words = shlex.split(span)
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            words.pop(0)
        if words[:2] == ["/usr/bin/time", "-v"]:
            words = words[2:]
        if len(words) >= 2 and (words[0] in ("python", "bash") or words[0].endswith("/python")):
            commands.append(["bash" if words[0] == "bash" else "python", *words[1:]])
    return commands


def test_the_index_has_a_command_for_each_script_and_each_names_a_script_that_is_there():
    commands = index_commands()
    assert len(commands) >= 30
    named = {command[1] for command in commands}
    for script in named:
        assert (ROOT / script).is_file(), f"the index runs {script}, which is not there"
    scripts = {f"benchmarks/{p.name}" for p in [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*.sh")]}
    assert scripts - {"benchmarks/__init__.py"} <= named, "scripts in benchmarks/ that back no row of the index"


def test_every_command_of_the_index_takes_its_flags():
    """Each command parsed as its script parses it, in one fresh process (the scripts set process-wide state)."""
    commands = index_commands()
    python = [c[1:] for c in commands if c[0] == "python"]
    for command in (c[1:] for c in commands if c[0] == "bash"):
        script, parts = command[0], command[1:command.index("--")] if "--" in command else command[1:]
        offered = re.search(r"^PARTS=\((.*)\)$", (ROOT / script).read_text(), re.M).group(1).split()
        assert set(parts) <= set(offered), f"{shlex.join(command)}: {script} has no part {set(parts) - set(offered)}"
        if "--" in command:  # the pong part's flags go to per_dqn.py after its own defaults
            python.append(["algos/per_dqn.py", "--env", "PongNoFrameskip-v4", "--cuda", "--compile", "--cudagraphs",
                           "--train-frequency", "1", "--threads", "8", *command[command.index("--") + 1:]])
        out = subprocess.run(["bash", str(ROOT / script), "--help"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and all(part in out.stdout for part in offered), out.stderr
    out = subprocess.run([sys.executable, __file__, json.dumps(python)], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    refused = {command: error for command, error in json.loads(out.stdout.splitlines()[-1]).items() if error}
    assert not refused, "\n".join(f"{command}: {error}" for command, error in refused.items())


class Parsed(Exception):
    """Raised in place of running a script once its arguments parsed."""


def parse_only(commands: list[list[str]]) -> dict[str, str]:
    """Each command's arguments parsed by its script, which then stops: {command: "" or the parser's error}."""
    sys.path.insert(0, str(ROOT))
    from tests.algo_utils import load_algo, parse

    parse_args = argparse.ArgumentParser.parse_args

    def parsed(self, args=None, namespace=None):
        raise Parsed(parse_args(self, args, namespace))

    argparse.ArgumentParser.parse_args = parsed
    errors = {}
    for script, *argv in commands:
        key, said = shlex.join([script, *argv]), io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                if script.startswith("algos/"):
                    parse(load_algo(Path(script).stem), argv)
                    raise Parsed
                sys.argv = [script, *argv]
                runpy.run_path(str(ROOT / script), run_name="__main__")
            errors[key] = "ran without parsing its arguments"
        except Parsed:
            errors[key] = ""
        except SystemExit as e:  # argparse and tyro exit on a flag they do not take, saying why
            errors[key] = " ".join(said.getvalue().split()[-40:]) or f"exit {e.code}"
    return errors


def test_the_pages_name_only_benchmark_scripts_that_are_there():
    for page in PAGES:
        for script in re.findall(r"benchmarks/[\w.]+\.(?:py|sh)\b", page.read_text()):
            assert (ROOT / script).is_file(), f"{page.relative_to(ROOT)} names {script}, which is not there"


def test_every_results_file_is_cited():
    """A file in benchmarks/results/ is named (or its folder is) in a page, a benchmark script or a test."""
    texts = [p.read_text() for p in [*PAGES, *BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*.sh"),
                                     *(ROOT / "tests").glob("*.py")]]
    for path in sorted((BENCHMARKS / "results").iterdir()):
        name = path.name + ("/" if path.is_dir() else "")
        assert any(name in text for text in texts), f"benchmarks/results/{name} is cited nowhere"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_to_sections_of_the_benchmark_pages_resolve():
    targets = {BENCHMARKS / "README.md", BENCHMARKS / "results.md"}
    for page in PAGES:
        for path, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([\w-]+)\)", page.read_text()):
            target = (page.parent / path).resolve()
            if target in targets:
                anchors = {slug(line.lstrip("#")) for line in target.read_text().splitlines() if line.startswith("#")}
                assert anchor in anchors, f"{page.relative_to(ROOT)}: {path}#{anchor} is no section there"


if __name__ == "__main__":  # the fresh process of test_every_command_of_the_index_takes_its_flags
    results = parse_only(json.loads(sys.argv[1]))
    sys.stdout.flush()
    print(json.dumps(results))
