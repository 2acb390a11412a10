"""What the web layer shares: its limits, the error document, the extra's check, the JSON text.

Imports nothing from FastAPI, so that ``vramplan web`` can say which extra is missing.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass
from typing import Any

from vramplan.errors import MissingExtraError, Problem, ScenarioError, VramplanError

__all__ = ["INSTALL_HINT", "WebSettings", "dumps", "problems_json", "pydantic_problems", "require_web", "zip_files"]

INSTALL_HINT = "the web page needs FastAPI and uvicorn: pip install 'vramplan[web]'"


def require_web() -> None:
    """Raise ``MissingExtraError`` with the install line when the ``web`` extra is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingExtraError(INSTALL_HINT) from None


@dataclass(frozen=True)
class WebSettings:
    """Limits of one server; read from ``VRAMPLAN_WEB_*`` environment variables by ``from_env``.

    ``max_body_bytes``: the largest request body (an uploaded config.json is a few kB; 1 MiB is
    ample).  ``time_limit_s``: a request that computes longer answers 503 (the planner on a
    large range of GPU counts is the slowest call, under 2 s in benchmarks/bench_plan.txt).
    ``max_compare``: setups one compare request may hold.  ``max_plan_counts``: GPU counts one plan
    request may search (a request abandoned at the time limit still runs to its end in its thread, so
    the search's size is bounded up front).  ``allow_hub``: a model may be a Hub id not in the catalog,
    whose config.json and safetensors headers are read from ``hub_url`` (empty: ``HF_ENDPOINT``, else
    huggingface.co) into the Hugging Face cache (``catalog/hub.py``; off unless ``vramplan web --allow-hub``)."""

    max_body_bytes: int = 1 << 20
    time_limit_s: float = 20.0
    max_compare: int = 4
    max_plan_counts: int = 32
    allow_hub: bool = False
    hub_url: str = ""

    @classmethod
    def from_env(cls) -> WebSettings:
        env = os.environ
        return cls(max_body_bytes=int(env.get("VRAMPLAN_WEB_MAX_BODY_BYTES", cls.max_body_bytes)),
                   time_limit_s=float(env.get("VRAMPLAN_WEB_TIME_LIMIT_S", cls.time_limit_s)),
                   max_compare=int(env.get("VRAMPLAN_WEB_MAX_COMPARE", cls.max_compare)),
                   max_plan_counts=int(env.get("VRAMPLAN_WEB_MAX_PLAN_COUNTS", cls.max_plan_counts)),
                   allow_hub=env.get("VRAMPLAN_WEB_ALLOW_HUB", "") == "1",
                   hub_url=env.get("VRAMPLAN_WEB_HUB_URL", cls.hub_url))


def problems_json(exc: VramplanError) -> list[dict[str, str]]:
    """Each problem as ``{where, message, hint, text}``; ``text`` is the CLI's line after ``error:``."""
    problems = getattr(exc, "problems", None) or [Problem("", str(exc))]
    return [{"where": p.where, "message": p.message, "hint": p.hint, "text": str(p)} for p in problems]


def pydantic_problems(exc: Any) -> ScenarioError:
    """A pydantic ``ValidationError`` as one ``ScenarioError``, worded as ``spec.load.parse_scenario`` words it."""
    return ScenarioError([Problem(".".join(str(x) for x in e["loc"]), e["msg"].replace("Input should be", "must be"))
                          for e in exc.errors()])


def zip_files(files: dict[str, str]) -> bytes:
    """The exported config files as one zip archive, in memory (nothing is written on the server)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            zf.writestr(name, files[name])
    return buf.getvalue()


def dumps(doc: Any) -> bytes:
    """The CLI's JSON text (``json.dumps(..., indent=2)``) so a page and a script read the same bytes."""
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")
