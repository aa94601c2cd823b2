"""The one way a screen reads its DataSource: a blocking fetch in a thread worker whose outcome comes back
as a named message (harlequin's habit). Only the message handlers, on the UI thread, change widgets.

    class PageLoaded(Fetched): ...          # named per screen: the handler's name says what arrived
    class PageFailed(FetchFailed): ...
    fetch_in_thread(self, lambda: source.mismatch_page(...), PageLoaded, PageFailed, group="mismatch-page")

A fetch that raises becomes its `FetchFailed` message (the screen says so; the monitor stays up). A
worker cancelled meanwhile (an `exclusive` group replaced it) posts nothing, so a stale page never
overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.dom import DOMNode
from textual.message import Message
from textual.worker import Worker, get_current_worker


class Fetched(Message):
    """A fetch finished with `result`; subclass it to name what was fetched."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result


class FetchFailed(Message):
    """A fetch raised `error`; subclass it to name what could not be fetched."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error


def fetch_in_thread(
    node: DOMNode,
    fetch: Callable[[], Any],
    done: type[Fetched],
    failed: type[FetchFailed],
    *,
    group: str,
    exclusive: bool = False,
) -> Worker[None]:
    """Run `fetch()` in a thread worker; post `done(result)` or `failed(error)` to `node` (thread-safe)."""

    def work() -> None:
        worker = get_current_worker()
        try:
            result = fetch()
        except Exception as exc:  # any read failure is shown by the screen, never a crash
            if not worker.is_cancelled:
                node.post_message(failed(exc))
            return
        if not worker.is_cancelled:
            node.post_message(done(result))

    return node.run_worker(work, name=group, group=group, thread=True, exclusive=exclusive, exit_on_error=False)
