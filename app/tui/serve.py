"""The monitor in a web browser: textual-serve runs one viewer process per browser tab behind a websocket."""

from __future__ import annotations

from app.errors import InputError


def serve_command(command: str, *, host: str, port: int, title: str) -> None:
    """Serve `command` (a Textual app's command line) on host:port until Ctrl-C; InputError without textual-serve."""
    try:
        from textual_serve.server import Server
    except ImportError as exc:
        raise InputError(
            "`serve` needs textual-serve: pip install textual-serve (a core dependency; reinstall eaglewatch)"
        ) from exc
    Server(command, host=host, port=port, title=title).serve()
