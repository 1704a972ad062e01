"""No module uses another package's private names: what one package (algos, buffers, envs, harness, launcher,
benchmarks, tests) takes from another is that package's public API, so a copied or renamed folder keeps working and
a private helper can change without breaking a caller it never knew of. Within a package, private names are free."""

from __future__ import annotations

import ast

from tests.algo_utils import ROOT

PACKAGES = ("algos", "buffers", "envs", "harness", "launcher", "benchmarks", "tests")
SOURCES = [path for package in PACKAGES[:-1] for path in sorted((ROOT / package).rglob("*.py"))] + [ROOT / "run.py"]


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def crossings(path, tree: ast.AST) -> list[str]:
    """`from <pkg>.<mod> import _x` and `<pkg>.<mod>._x` where <pkg> is another package than the file's own."""
    own = path.relative_to(ROOT).parts[0] if path.parent != ROOT else None
    found, modules = [], {}  # modules: the local name of an `import <pkg>...` -> its package
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            package = node.module.split(".")[0]
            if package in PACKAGES and package != own:
                found += [f"from {node.module} import {alias.name}" for alias in node.names if private(alias.name)]
                found += [f"from {node.module} import ..." for part in node.module.split(".") if private(part)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                package = alias.name.split(".")[0]
                if package in PACKAGES and package != own:
                    modules[alias.asname or package] = package
                    found += [f"import {alias.name}" for part in alias.name.split(".") if private(part)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules and any(private(part) for part in chain):
                found.append(".".join([base.id, *chain]))
    return [f"{path.relative_to(ROOT)}:{line}" for line in found]


def test_no_module_imports_another_packages_private_names():
    found = [hit for path in SOURCES for hit in crossings(path, ast.parse(path.read_text(), str(path)))]
    assert not found, "private names across a package line:\n" + "\n".join(found)


def test_the_check_sees_a_private_import_and_a_private_attribute():
    """The check itself, on the two forms it looks for (and not on a package's own private names)."""
    source = ("from harness.args import _typed\nimport harness.run\nharness.run._flush()\n"
              "from .make import _env_spec\n")
    hits = crossings(ROOT / "launcher" / "space.py", ast.parse(source))
    assert hits == ["launcher/space.py:from harness.args import _typed", "launcher/space.py:harness.run._flush"]
    assert crossings(ROOT / "harness" / "x.py", ast.parse("from harness.args import _typed\n")) == []
