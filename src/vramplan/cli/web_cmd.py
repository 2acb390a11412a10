"""`vramplan web`: the page and its JSON API, served by uvicorn (the ``web`` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["register"]

Opt = typer.Option


def register(app: typer.Typer) -> None:
    """Add ``web`` to the top-level app."""

    @app.command()
    def web(
        host: Annotated[str, Opt(help="address to listen on (0.0.0.0 to expose it; see docs/web.md)")] = "127.0.0.1",
        port: Annotated[int, Opt(help="TCP port")] = 8000,
        workers: Annotated[int, Opt(min=1, help="worker processes (the app keeps no state between requests)")] = 1,
        allow_hub: Annotated[bool, Opt("--allow-hub", help="accept Hugging Face Hub ids not in the catalog: their "
                                       "config.json is read from the Hub (network)")] = False,
    ) -> None:
        """Serve the page (live estimate, which GPUs fit, compare, plan, serving) and its JSON API."""
        from vramplan.cli.common import fail
        from vramplan.errors import MissingExtraError

        try:
            from vramplan.web.common import require_web

            require_web()
        except MissingExtraError as exc:
            fail(exc)
        import os

        import uvicorn

        if allow_hub:
            # read by each worker's WebSettings.from_env (the workers are separate processes)
            os.environ["VRAMPLAN_WEB_ALLOW_HUB"] = "1"

        typer.echo(f"vramplan web: http://{host}:{port}/ (Ctrl+C stops it)")
        # an import string and a factory, so that each worker process builds its own app
        uvicorn.run("vramplan.web.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_level="warning")
