"""The one fetch-in-a-thread helper: results and failures come back as named messages on the UI thread."""

from __future__ import annotations

import asyncio
import sys
import threading

from textual import on
from textual.app import App
from textual.widgets import Static

from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread


class Loaded(Fetched):
    pass


class Failed(FetchFailed):
    pass


class Host(App):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, object, bool]] = []  # (what, payload, handled on the UI thread)

    def compose(self):
        yield Static(id="out")

    @on(Loaded)
    def loaded(self, message: Loaded) -> None:
        self.seen.append(("loaded", message.result, threading.get_ident() == self._thread_id))

    @on(Failed)
    def failed(self, message: Failed) -> None:
        self.seen.append(("failed", str(message.error), threading.get_ident() == self._thread_id))


async def test_a_result_and_a_failure_arrive_as_messages_on_the_ui_thread() -> None:
    app = Host()
    async with app.run_test() as pilot:
        fetch_threads: list[int] = []

        def fetch() -> int:
            fetch_threads.append(threading.get_ident())
            return 42

        def broken() -> int:
            raise ValueError("database is locked")

        fetch_in_thread(app, fetch, Loaded, Failed, group="a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        fetch_in_thread(app, broken, Loaded, Failed, group="b")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert fetch_threads and fetch_threads[0] != app._thread_id  # the read ran off the UI thread
    assert app.seen == [("loaded", 42, True), ("failed", "database is locked", True)]


async def test_a_replaced_exclusive_fetch_posts_nothing() -> None:
    app = Host()
    release = threading.Event()
    async with app.run_test() as pilot:
        slow_thread: list[int] = []

        def slow() -> str:
            slow_thread.append(threading.get_ident())
            release.wait(5)
            return "stale"

        first = fetch_in_thread(app, slow, Loaded, Failed, group="page", exclusive=True)
        while not slow_thread:  # the first read has started
            await pilot.pause()
        second = fetch_in_thread(
            app, lambda: "fresh", Loaded, Failed, group="page", exclusive=True
        )  # cancels the first
        await second.wait()
        assert first.is_cancelled
        release.set()  # the first read now ends, after the fresh one: its stale page must not be posted
        await _first_worker_returned(slow_thread)
        # a worker thread posts through the loop's call_soon_threadsafe; a message queued behind whatever it posted
        # is handled after it: once "after" is seen, a stale page would have been too
        asyncio.get_running_loop().call_soon(app.post_message, Loaded("after"))
        while ("loaded", "after", True) not in app.seen:
            await pilot.pause()
    assert app.seen == [("loaded", "fresh", True), ("loaded", "after", True)]


async def _first_worker_returned(thread_id: list[int], timeout: float = 10.0) -> None:
    """Wait until the worker thread that ran `slow` has left the fetch (its stack no longer holds fetch_in_thread's
    `work`): whatever it would post, it has posted."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        frame = sys._current_frames().get(thread_id[0])
        names = set()
        while frame is not None:
            names.add((frame.f_code.co_filename, frame.f_code.co_name))
            frame = frame.f_back
        if not any(name == "work" and file.endswith("fetch.py") for file, name in names):
            return
        assert loop.time() < end, "the first fetch did not end"
        await asyncio.sleep(0.01)
