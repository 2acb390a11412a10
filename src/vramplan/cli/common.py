"""Helpers every command shares: error printing, flag-to-scenario merging, output paths, progress."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from vramplan.errors import Problem, ScenarioError, VramplanError

if TYPE_CHECKING:
    from vramplan.cli.flags import Given

__all__ = ["deep_merge", "fail", "guard_input", "guard_output", "progress", "refuse_other_task_options", "save_figure",
           "scenario_document", "set_path"]



def _stderr() -> Console:
    """Made when used, so it takes the width of that moment, not the width at import."""
    return Console(stderr=True)


def _flag_names(given: Given | None) -> dict[str, str]:
    """Scenario path -> the option the user gave for it (``parallel.tp`` -> ``--tp``)."""
    if given is None:
        return {}
    return {p: f.option for f in given.flags if given[f.name] is not None for p in f.paths}


def fail(exc: VramplanError, given: Given | None = None) -> NoReturn:
    """One line per problem on stderr (text printed verbatim, not as rich markup), then exit status 2.

    With ``given``, a problem found at a scenario key the user set by an option is named by that option
    (``--tp / parallel.tp: ...``), so the message points at what was typed and still names the key."""
    names = _flag_names(given)
    err = _stderr()
    problems = getattr(exc, "problems", None)
    for p in problems or [exc]:
        if isinstance(p, Problem) and p.where in names:
            p = Problem(f"{names[p.where]} / {p.where}", p.message, p.hint)
        # soft_wrap: one problem is one line, whatever the terminal's width
        err.print(f"[red]error:[/] {escape(str(p))}", highlight=False, soft_wrap=True)
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


def scenario_document(scenario: Path | None, given: Given) -> dict[str, Any]:
    """The scenario file (if any) with the given options laid over it; a model is required."""
    from vramplan.spec.load import read_document

    base: dict[str, Any] = read_document(scenario) if scenario is not None else {}
    task = given["task"] or base.get("task", "train")
    doc = deep_merge(base, given.document(task))
    refuse_other_task_options(given, task)
    if "model" not in doc:
        raise ScenarioError([Problem("model", "no model given", "pass a scenario file or --model")])
    return doc


def refuse_other_task_options(given: Given, task: object) -> None:
    """Options that set a section of another task than the scenario's are refused (spec.checks)."""
    from vramplan.spec.checks import section_conflicts

    paths = {f.path_for(task): f.option for f in given.flags if given[f.name] is not None}
    problems = section_conflicts(paths, str(task))
    if problems:
        raise ScenarioError(problems)


def guard_output(option: str, path: Path | None, suffixes: tuple[str, ...], shown: str = "") -> None:
    """Refuse, before any work, an output file whose format is unknown or whose folder is missing or not
    writable (issue 19: these raised FileNotFoundError or matplotlib's ValueError after the computation).
    ``shown``: the formats as the hint names them (default: every suffix)."""
    if path is None:
        return
    problems: list[Problem] = []
    if path.suffix.lower() not in suffixes:
        problems.append(Problem(option, f"unknown {option.lstrip('-')} format {path.suffix or '(none)'!r}",
                                f"use a {shown or ', '.join(suffixes)} file name"))
    folder = path.parent if str(path.parent) else Path(".")
    if len(str(path)) > 4096 or len(path.name) > 255:
        problems.append(Problem(option, "file name too long", "give a shorter path"))
    elif not folder.is_dir():
        problems.append(Problem(option, f"folder {folder} does not exist", "create it first or write elsewhere"))
    elif not os.access(folder, os.W_OK):
        problems.append(Problem(option, f"folder {folder} is not writable", "write elsewhere"))
    elif path.is_dir():
        problems.append(Problem(option, f"{path} is a folder", "name a file"))
    if problems:
        raise ScenarioError(problems)


def guard_input(option: str, path: Path | None, max_bytes: int) -> None:
    """Refuse, before a library reads it, an input that is not a regular file (``/dev/zero``, a folder) or is
    larger than ``max_bytes``; a missing file is left to the reader's own message."""
    import stat

    if path is None:
        return
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ScenarioError([Problem(option, f"cannot read {str(path)[:200]}: {exc.strerror or exc}", "")]) from None
    if stat.S_ISDIR(st.st_mode):
        return  # each reader words "is a folder" itself
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError([Problem(option, f"{path} is a device or special file, not a regular file",
                                     "give the path of a file")])
    if st.st_size > max_bytes:
        raise ScenarioError([Problem(option, f"{path} is {st.st_size:,} bytes, more than {max_bytes:,}",
                                     "check the path")])


def save_figure(fig: Any, path: Path, option: str) -> None:
    """``fig.savefig(path)`` with matplotlib's and the file system's errors as the package's."""
    try:
        fig.savefig(path)
    except (ValueError, OSError) as exc:
        raise ScenarioError([Problem(option, f"cannot write {path}: {str(exc).splitlines()[0]}",
                                     "name a .png, .svg or .pdf file in a writable folder")]) from None


def _interactive() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def progress(description: str, *, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A rich spinner on stderr while slow work runs (trace, measure, validate, plan, simulate); nothing when
    ``quiet`` (``--json``) or when stdout or stderr is not a terminal, so piped output stays clean.  Yields a
    function that updates the description."""
    if quiet or not _interactive():
        yield lambda _text: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=_stderr(), transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda text: bar.update(task, description=text)
