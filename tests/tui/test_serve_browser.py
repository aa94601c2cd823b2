"""`eaglewatch serve` in a real browser: headless Chromium loads the page, the served viewer draws the dashboard.

The page renders the terminal on a canvas, so the test records the terminal bytes the websocket delivers
to the page (an init script wraps the page's WebSocket) and replays them into a terminal emulator (pyte) to
read the screen the browser shows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.commands.serve import is_loopback, watch_command

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

CAPTURE_FRAMES = """
window.__frames = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = function (...args) {
  const ws = new NativeWebSocket(...args);
  const url = new URL(args[0], window.location.href);
  window.__size = [Number(url.searchParams.get('width')), Number(url.searchParams.get('height'))];
  const send = ws.send.bind(ws);
  ws.send = (data) => {
    if (typeof data === 'string' && data.startsWith('["resize"')) {
      const size = JSON.parse(data)[1];
      window.__size = [size.width, size.height];
    }
    return send(data);
  };
  ws.addEventListener('message', (event) => {
    if (event.data instanceof ArrayBuffer) {
      window.__frames.push(Array.from(new Uint8Array(event.data)));
    }
  });
  return ws;
};
window.WebSocket.prototype = NativeWebSocket.prototype;
Object.assign(window.WebSocket, NativeWebSocket);
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"serve did not listen on 127.0.0.1:{port} within {timeout} s")


def _screen(frames: list[list[int]], cols: int, rows: int) -> str:
    import pyte

    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    for frame in frames:
        stream.feed(bytes(frame))
    return "\n".join(screen.display)


def test_watch_command_is_read_only_unless_control(tmp_path: Path) -> None:
    db = tmp_path / "run db.db"
    assert watch_command(db, "r1", control=False).endswith("--readonly")
    assert "--readonly" not in watch_command(db, None, control=True)
    assert f"'{db.resolve()}'" in watch_command(db, None, control=False)  # quoted: a space cannot split it


def test_only_loopback_hosts_count_as_private() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")


def test_serve_refuses_a_missing_database(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", str(tmp_path / "nope.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no such run database" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it as root)")
@pytest.mark.parametrize("control", [False, True], ids=["view-only", "control"])
def test_a_browser_shows_the_dashboard_with_control_keys_only_when_asked(
    tmp_path: Path, run_db: Path, control: bool
) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    pytest.importorskip("pyte")
    port = _free_port()
    env = dict(os.environ, TEXTUAL_ANIMATIONS="none")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            str(run_db),
            "--port",
            str(port),
            *(["--control"] if control else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        _wait_listening(port, proc)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.add_init_script(CAPTURE_FRAMES)
                page.goto(f"http://127.0.0.1:{port}/")
                cols = rows = 0
                text = ""
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                    size = page.evaluate("() => window.__size || null")
                    frames = page.evaluate("() => window.__frames")
                    if frames:
                        cols, rows = _size_from_page(page)
                        text = _screen(frames, cols, rows)
                        # the footer can draw before the first snapshot has filled the status line (a loaded
                        # machine): wait for the whole dashboard, not its first frame
                        # and the run keys, which show once the first record is polled (a second redraw)
                        full = "demo" in text and "Quit" in _footer(text) and "RUNNING" in text and "240/240" in text
                        if full and (not control or "pause" in _footer(text).lower()):
                            break
                assert size is not None, "the page never opened its websocket"
            finally:
                browser.close()
        assert "demo" in text, f"the served dashboard never drew the run's name:\n{text}"
        assert "RUNNING" in text and "240/240" in text, f"the dashboard's status line is missing:\n{text}"
        offers_pause = "pause" in _footer(text).lower()
        assert offers_pause == control, f"footer offers pause={offers_pause} with --control={control}:\n{_footer(text)}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _size_from_page(page) -> tuple[int, int]:
    """The terminal size the page last told the app (the websocket URL, then its resize messages)."""
    cols, rows = page.evaluate("() => window.__size")
    return int(cols), int(rows)


def _footer(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
