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
        from vramplan.errors import MissingExtraError, ScenarioError

        try:
            from vramplan.web.common import require_web

            require_web()
            _check_address(host, port, workers)
        except (MissingExtraError, ScenarioError) as exc:
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


MAX_WORKERS = 64  # worker processes: more than a machine's cores is no faster, and each is a whole interpreter


def _check_address(host: str, port: int, workers: int) -> None:
    """Refuse, before uvicorn starts, a port outside 0-65535 (socket's OverflowError), too many workers, and an
    address this machine cannot listen on (a name that does not resolve, a port in use or privileged):
    uvicorn would print its own error and exit 1 or 3, which this CLI keeps for "does not fit" (issue 19)."""
    import socket

    from vramplan.errors import Problem, ScenarioError
    from vramplan.spec.checks import number_problems

    problems = [*number_problems("--port", port, 0, 65535, hint="give a TCP port in [0, 65,535] (0: any free one)"),
                *number_problems("--workers", workers, 1, MAX_WORKERS)]
    if problems:
        raise ScenarioError(problems)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds (config.bind_socket)
            probe.bind(address)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ScenarioError([Problem("--host", f"cannot listen on {host}:{port}: {reason}",
                                     "give an address of this machine (127.0.0.1, 0.0.0.0) and a free port")]) from None
