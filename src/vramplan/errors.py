"""Errors that reach the user.

Every message says what was needed, what was found, and the option to change,
following vLLM's KV-cache error as a model.  A scenario with several problems
reports all of them at once (``ScenarioError.problems``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where (an option path), what, and how to fix it."""

    where: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        return f"{text} ({self.hint})" if self.hint else text


class VramplanError(Exception):
    """Base class of every error vramplan raises on purpose."""


class ScenarioError(VramplanError):
    """The inputs cannot be used; ``problems`` lists every reason found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


LISTED_KINDS = frozenset({"model", "gpu"})
"""Kinds of name with a command that lists them (``vramplan models``, ``vramplan gpus``)."""


class UnknownNameError(ScenarioError):
    """A model or GPU name that is not in the catalog."""

    def __init__(self, kind: str, name: str, candidates: Iterable[str], option: str) -> None:
        pool = list(dict.fromkeys(candidates))
        close = suggest(name, pool)
        # only models and GPUs have a listing command (`vramplan models`, `vramplan gpus`); other kinds list
        # their few names
        listing = f"see `vramplan {kind}s`" if kind in LISTED_KINDS else f"choose one of: {', '.join(pool)}"
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else listing
        super().__init__([Problem(option, f"unknown {kind} {name!r}", hint)])
        self.name = name
        self.suggestions = close


class MissingExtraError(VramplanError):
    """An optional dependency is needed for the asked feature."""


def suggest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Close names for a typo, case-insensitively (difflib ratio >= 0.6), best first."""
    pool = list(dict.fromkeys(candidates))
    lowered = {c.lower(): c for c in pool}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
    # substring matches help for partial names such as "llama-3-8" or "h100"
    subs = [c for low, c in lowered.items() if name.lower() in low and c not in hits]
    out = [lowered[h] for h in hits] + subs
    return list(dict.fromkeys(out))[:n]
