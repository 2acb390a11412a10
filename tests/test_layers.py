"""The dependency order of README.md's Architecture section, enforced.

``[tool.importlinter]`` in pyproject.toml declares three contracts, checked here with import-linter's
own engine (the same check as running ``lint-imports``):

* ``layers``: each package of vramplan imports only the layers below it (cli on top, then validate,
  measure, export, plan, engine, serve, trace, analytic, alloc, catalog, spec, facts, and report,
  units, errors and monotone as the ground floor);
* ``core``: analytic, spec, catalog, alloc and facts import none of the tools built on them;
* ``acyclic``: no import cycle between the modules (or subpackages) of any package.

Plus two checks import-linter has no contract for: README's diagram lists the layers in the enforced
order, and no module takes a private name from another module.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from importlinter import configuration
from importlinter.application import use_cases

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vramplan"


def _config() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        tool = tomllib.load(f)["tool"]["importlinter"]
    assert isinstance(tool, dict)
    return tool


def _layers() -> list[str]:
    contracts = _config()["contracts"]
    assert isinstance(contracts, list)
    (layers,) = [c for c in contracts if c["id"] == "layers"]
    return [name.strip() for layer in layers["layers"] for name in layer.split("|")]


def test_import_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    # the use case behind `lint-imports`, without the command's logging set-up (its dictConfig would
    # disable every logger created before it, vramplan's included, for the rest of the test run)
    configuration.configure()
    kept = use_cases.lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
    out = capsys.readouterr().out
    assert kept, out
    assert out.count(" KEPT") == 3, out


def test_every_top_level_module_has_a_layer() -> None:
    """Also checked by the contract's ``exhaustive = true``; here with the names spelled out."""
    modules = {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    assert set(_layers()) == modules | packages


def test_readme_draws_the_enforced_order() -> None:
    """README's Architecture block lists the packages top to bottom in the contract's order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("The architecture, dependencies flowing down", 1)[1].split("```", 2)[1]
    drawn = re.findall(r"^([a-z]+)(?:/|\.py)", block, flags=re.MULTILINE)
    assert drawn == _layers()


# Private names still taken across modules, each with why it is still there.  Entries may go stale once
# fixed; a new crossing fails the test below.
PRIVATE_IMPORTS_ALLOWED = {
    # the compiled allocator replay: a private module of its own package
    ("vramplan.alloc.native", "vramplan.alloc", "_replay"),
}


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    for path in SRC.rglob("*.py"):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vramplan"):
                found.update((module, node.module, a.name) for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__"))
    return found


def test_no_module_takes_a_private_name_from_another() -> None:
    assert _private_imports() - PRIVATE_IMPORTS_ALLOWED == set()


def test_the_private_import_scan_sees_one() -> None:
    """The scan itself: the compiled replay's import is found (so an empty difference means something)."""
    assert ("vramplan.alloc.native", "vramplan.alloc", "_replay") in _private_imports()
