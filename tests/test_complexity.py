"""Size and complexity limits of the analytic engine (issue: no god function in the engine).

Every function under ``src/vramplan/analytic/`` is at most 80 lines long (docstring included,
``end_lineno - lineno + 1``) and has a cyclomatic complexity of at most 25 as radon computes it
(McCabe's count: 1 + one per branch point, boolean operator and comprehension clause).
"""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_visit

ANALYTIC = Path(__file__).resolve().parents[1] / "src" / "vramplan" / "analytic"
MAX_LINES = 80
MAX_COMPLEXITY = 25


def _functions() -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for path in sorted(ANALYTIC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                out.append((f"{path.relative_to(ANALYTIC)}:{node.lineno} {node.name}",
                            node.end_lineno - node.lineno + 1))
    return out


def test_functions_are_short() -> None:
    long = [(name, n) for name, n in _functions() if n > MAX_LINES]
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_functions_are_simple() -> None:
    complex_ = []
    for path in sorted(ANALYTIC.rglob("*.py")):
        for block in cc_visit(path.read_text()):
            if block.complexity > MAX_COMPLEXITY:
                complex_.append((f"{path.relative_to(ANALYTIC)}:{block.lineno} {block.name}", block.complexity))
    assert not complex_, f"blocks over complexity {MAX_COMPLEXITY}: {complex_}"


def test_the_limits_bite() -> None:
    # a function of 81 lines and one with 26 branch points would be caught
    body = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(25))
    src = f"def f(x):\n{body}\n    return -1\n"
    (block,) = cc_visit(src)
    assert block.complexity == 26  # 1 + 25 ifs
    tree = ast.parse(src)
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef) and fn.end_lineno == 52  # 1 def line + 2 x 25 + 1 return
