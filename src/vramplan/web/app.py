"""The ASGI application: JSON routes over the library, and the page.

Each route reads a JSON body (bounded in size), checks that it names no server file
(``requests.check_scenario``), runs the library call the CLI makes for its ``--json`` in a worker
thread under a time limit, and returns that document.  A ``VramplanError`` becomes a 422 whose
``detail`` lists each problem with its field path (``where``), message and hint, the same text
``vramplan`` prints after ``error:``.  The app keeps no state between requests, so any number of
workers can run behind any proxy.
"""

from __future__ import annotations

from typing import Any

from vramplan.web.common import WebSettings, require_web

__all__ = ["WebSettings", "app_from_env", "create_app"]


def create_app(settings: WebSettings | None = None) -> Any:
    """The FastAPI application (typed ``Any``: FastAPI is an optional dependency)."""
    require_web()
    from vramplan.web.routes import build_app

    return build_app(settings or WebSettings.from_env())


def app_from_env() -> Any:
    """Factory for ``uvicorn --factory vramplan.web.app:app_from_env`` (each worker builds its own)."""
    return create_app(WebSettings.from_env())


