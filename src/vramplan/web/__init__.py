"""The web page and its JSON API: the same documents as the command line's ``--json``, rendered live.

Needs the ``web`` extra (FastAPI, uvicorn): ``pip install 'vramplan[web]'``; ``vramplan web`` serves it.
Nothing is computed here: every route calls the library function the CLI calls and returns its
document; the page (``static/``) draws it.  ``import vramplan`` does not import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramplan.web.app import WebSettings, create_app

__all__ = ["WebSettings", "create_app"]


def __getattr__(name: str) -> Any:
    # FastAPI is imported on first use only, so that a missing extra fails with an install hint
    # (vramplan.web.app.require_web) instead of at ``import vramplan.web``.
    if name in __all__:
        from vramplan.web import app

        return getattr(app, name)
    raise AttributeError(name)
