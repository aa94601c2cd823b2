"""Every command of the README's Quickstart runs, in order, in a fresh folder, as a new user would type it.

The folder gets a copy of `sample_data/` (a clone's root has it) and every `/tmp/` path of the commands and of
the demo config is moved under the test's own temp dir, so runs never collide. Interactive verbs (the monitor)
run inside tmux at 80×24 until they draw, then get `q`; `serve` runs until it listens. A command whose trailing
comment carries `[gpu]` or `[network]` is skipped with that reason, and nothing else is. The commands run with
torch hidden (tests/torchless.py), as in the core install `scripts/demo` makes: the quickstart needs no extra.

The README itself stays a page one reads in one sitting: at most 15 KB, every relative link resolving to a file
(and a heading, for a link with an anchor).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.torchless import torchless_env

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TMUX = shutil.which("tmux")
INTERACTIVE = {"demo", "watch"}
README_MAX_BYTES = 15 * 1024
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    needs: str | None  # "gpu" | "network" | None

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def interactive(self) -> bool:
        argv = self.argv
        verb = argv[1] if len(argv) > 1 else ""
        return verb in INTERACTIVE or (verb == "run" and "--headless" not in argv)


def quickstart_commands(readme: Path = README) -> list[Command]:
    """The `eaglewatch ...` lines of the README's Quickstart code blocks, with their line numbers."""
    lines = readme.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "## Quickstart")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    out: list[Command] = []
    in_block = False
    for i in range(start, end):
        line = lines[i]
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block or not line.strip().startswith("eaglewatch"):
            continue
        text, _, comment = line.partition("  #")
        needs = re.search(r"\[(gpu|network)\]", comment)
        out.append(Command(i + 1, text.strip(), needs.group(1) if needs else None))
    return out


def _workspace(tmp: Path) -> Path:
    """A clone-like folder: sample_data/ with the demo config's /tmp paths moved under `tmp`."""
    work = tmp / "clone"
    shutil.copytree(REPO / "sample_data", work / "sample_data")
    demo = work / "sample_data" / "demo.toml"
    demo.write_text(demo.read_text().replace('"/tmp/', f'"{tmp}/'))
    return work


_NO_TORCH = Path("/nonexistent")  # set per test to a folder holding the torch-hiding sitecustomize


def _env() -> dict[str, str]:
    env = dict(os.environ, TEXTUAL_ANIMATIONS="none", TERM="xterm-256color")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return torchless_env(_NO_TORCH, env)


def _eaglewatch(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "app.cli", *argv[1:]]


def _run_interactive(cmd: list[str], cwd: Path, name: str, expect: str, timeout: float = 60.0) -> str:
    """Run a monitor command in tmux at 80×24 until `expect` shows, then quit it with q."""
    assert TMUX, "tmux is needed to run the interactive quickstart commands"
    env = _env()
    exports = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("PYTHONPATH", "TEXTUAL_ANIMATIONS", "TERM"))
    shell = f"cd {shlex.quote(str(cwd))} && env {exports} {shlex.join(cmd)}; echo EXITED $?; sleep 30"
    subprocess.run([TMUX, "new-session", "-d", "-s", name, "-x", "80", "-y", "24", shell], check=True)
    try:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run([TMUX, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            if re.search(expect, screen):
                break
            if "EXITED" in screen:
                pytest.fail(f"{shlex.join(cmd)} exited before drawing {expect!r}:\n{screen}")
            time.sleep(0.3)
        else:
            pytest.fail(f"{shlex.join(cmd)} never drew {expect!r} within {timeout} s:\n{screen}")
        subprocess.run([TMUX, "send-keys", "-t", name, "q"], check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            after = subprocess.run([TMUX, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            if m := re.search(r"EXITED (\d+)", after):
                assert m.group(1) == "0", f"{shlex.join(cmd)} exited {m.group(1)} after q:\n{after}"
                return screen
            if "quit?" in after:  # a live run asks before it stops
                subprocess.run([TMUX, "send-keys", "-t", name, "y"], check=True)
            time.sleep(0.3)
        pytest.fail(f"{shlex.join(cmd)} did not quit on q:\n{after}")
    finally:
        subprocess.run([TMUX, "kill-session", "-t", name], capture_output=True)


def _run_serve(cmd: list[str], cwd: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*cmd, "--port", str(port)], cwd=cwd, env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{shlex.join(cmd)} exited: {proc.stderr.read()}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        pytest.fail(f"{shlex.join(cmd)} did not listen within 30 s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(markdown: Path) -> set[str]:
    lines = markdown.read_text(encoding="utf-8").splitlines()
    heads, fenced = set(), False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            heads.add(_slug(line.lstrip("#").replace("`", "")))
    return heads


def relative_links(readme: Path = README) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link in the README that is not a URL or a mail address."""
    out = []
    for number, line in enumerate(readme.read_text(encoding="utf-8").splitlines(), 1):
        for target in _LINK.findall(line):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                out.append((number, target))
    return out


def test_the_readme_is_at_most_15_kb() -> None:
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move the detail into a docs/ page and link it"
    )


def test_every_relative_link_in_the_readme_resolves() -> None:
    links = relative_links()
    assert len(links) >= 10, links
    broken = []
    for line, target in links:
        path, _, anchor = target.partition("#")
        where = (REPO / path) if path else README
        if not where.exists():
            broken.append(f"README.md:{line}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"README.md:{line}: {target}: {path or 'README.md'} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text("# T\n\n## A real run\n[ok](#a-real-run) [web](https://x.org) [gone](docs/nope.md)\n")
    assert relative_links(page) == [(4, "#a-real-run"), (4, "docs/nope.md")]
    assert (
        "a-real-run" in _anchors(page)
        and _slug("What a provider may send (the hostile wire)") == "what-a-provider-may-send-the-hostile-wire"
    )


def test_the_quickstart_has_commands() -> None:
    commands = quickstart_commands()
    assert len(commands) >= 8, commands
    assert all(c.text.startswith("eaglewatch ") for c in commands)


@pytest.mark.slow
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed: the monitor commands need a real terminal")
def test_every_quickstart_command_works_in_a_fresh_folder_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "_NO_TORCH", tmp_path / "no-torch")
    work = _workspace(tmp_path)
    skipped: list[str] = []
    took: list[str] = []
    for n, command in enumerate(quickstart_commands()):
        text = command.text.replace("/tmp/", f"{tmp_path}/")
        argv = shlex.split(text)
        where = f"README.md:{command.line}: {command.text}"
        if command.needs:
            skipped.append(f"{where} (needs {command.needs})")
            continue
        cmd = _eaglewatch(argv)
        started = time.monotonic()
        if argv[1] == "serve":
            _run_serve(cmd, work)
        elif command.interactive:
            _run_interactive(cmd, work, f"ew-readme-{os.getpid()}-{n}", expect=r"(RUNNING|PAUSED|DONE)")
        else:
            proc = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (
                f"{where}\nexit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
            )
            assert "Traceback" not in proc.stderr, f"{where}\n{proc.stderr[-3000:]}"
            if argv[1] == "vocab":  # torch really is hidden: the .pt files are skipped, and said so
                assert "pip install -e '.[extract]' brings it" in proc.stdout, f"{where}\n{proc.stdout[-3000:]}"
        took.append(f"{time.monotonic() - started:6.1f} s  {command.text}")
    # the markers are the only way out, and the test says which commands took it
    for line in skipped:
        print("skipped:", line)
    print("each command's time, torch hidden:", *took, sep="\n  ")
