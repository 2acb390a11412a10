"""Helpers every command shares: error printing, flag-to-scenario merging."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from vramplan.errors import VramplanError

__all__ = ["deep_merge", "fail", "set_path"]

_err = Console(stderr=True)


def fail(exc: VramplanError) -> NoReturn:
    """One line per problem on stderr (text printed verbatim, not as rich markup), then exit status 2."""
    problems = getattr(exc, "problems", None)
    for p in problems or [exc]:
        _err.print(f"[red]error:[/] {escape(str(p))}", highlight=False)
    raise typer.Exit(2)


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    """Set ``d["a"]["b"] = value`` for ``path`` "a.b", creating the mappings; ``None`` leaves ``d`` alone."""
    if value is None:
        return
    keys = path.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys laid on top, mapping by mapping (flags override the file)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
