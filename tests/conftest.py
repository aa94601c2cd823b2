"""Fixtures shared by every test area: where the repo's sample data and the real Kimi files are; the summary of
the real-tokenizer tests; `--cpu-durations N` (the N tests that took the most CPU, children included); the
xdist groups of tests that must not run beside each other (`scripts/test` runs two workers)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from app.libnoise import silence_library_noise

silence_library_noise()

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO_ROOT / "sample_data"
# The project's shared folder (real tokenizer files): ../shared beside the checkout, or EAGLEWATCH_SHARED.
SHARED_DIR = Path(os.environ.get("EAGLEWATCH_SHARED") or REPO_ROOT.parent / "shared")
KIMI_DIR = SHARED_DIR / "tokenizers" / "kimi-k2.5"
REAL_TOKENIZER_FIXTURES = {"kimi_tokenizer_dir"}
# Reports travel from xdist workers to the controller: what the summaries need rides in user_properties.
_REAL_TOKENIZER = ("eaglewatch_real_tokenizer", True)
_CPU = "eaglewatch_cpu"
_real_tokenizer_outcomes: dict[str, str] = {}
_cpu_rows: list[tuple[str, float, float, float]] = []  # (test, wall s, own CPU s, children's CPU s)

# Tests that run on one worker, one after another (xdist --dist loadgroup), by path prefix: one session fixture
# that is expensive to make twice (a started `transformers serve`). Besides these, the tests of a file that uses a
# module-scoped fixture (a 100k-row database, a built tokenizer, exported shards) are one group, so the fixture is
# made once, not once per worker.
XDIST_GROUPS: dict[str, str] = {  # the first prefix that matches wins
    # one vLLM server (a 30-80 s start, ~3.8 GB) serves every vLLM test: they run on one worker
    "tests/realserver/test_vllm": "vllm",
    "tests/realserver/": "realserver",
    # the trainers' own code runs in children forked from one warm process per trainer and test process
    # (tests/export/trainers/env.py): on one worker, each trainer's modules are imported once per run
    "tests/export/test_trainer_loaders.py": "trainers",
    "tests/export/test_smoke_training.py": "trainers",
    "tests/extract/test_layouts.py": "trainers",
    "tests/extract/test_arrow_stream.py": "trainers",
}


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="list the N tests that used the most CPU (this process and the children it waited for), "
        "with the suite's wall and CPU totals",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_TOKENIZER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("kimi"):
            item.user_properties.append(_REAL_TOKENIZER)
        rel = (
            Path(str(item.fspath)).resolve().relative_to(REPO_ROOT).as_posix()
            if str(item.fspath).startswith(str(REPO_ROOT))
            else ""
        )
        group = next((g for prefix, g in XDIST_GROUPS.items() if rel.startswith(prefix)), None)
        if group is None and rel and _uses_a_module_fixture(item):
            group = rel
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


def _cpu_now() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    item.stash[_cpu_key] = (time.perf_counter(), *_cpu_now())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _cpu_key in item.stash:
        wall0, own0, children0 = item.stash[_cpu_key]
        own, children = _cpu_now()
        report.user_properties.append((_CPU, (time.perf_counter() - wall0, own - own0, children - children0)))


_cpu_key = pytest.StashKey[tuple[float, float, float]]()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    if props.get(_REAL_TOKENIZER[0]) and (report.when == "call" or report.skipped):
        _real_tokenizer_outcomes[report.nodeid] = report.outcome
    if report.when == "teardown" and _CPU in props:
        _cpu_rows.append((report.nodeid, *props[_CPU]))


def pytest_terminal_summary(terminalreporter, config) -> None:
    """Say loudly how many tests ran on the real tokenizer files, so a clone without them is never mistaken for a
    full run; with --cpu-durations, where the CPU went."""
    n = config.getoption("--cpu-durations")
    if n is not None and _cpu_rows:
        rows = sorted(_cpu_rows, key=lambda r: r[2] + r[3], reverse=True)
        wall, own, children = (sum(r[i] for r in _cpu_rows) for i in (1, 2, 3))
        terminalreporter.write_sep(
            "=",
            f"CPU per test (own + children): {len(_cpu_rows)} tests, {wall:.0f} s of "
            f"test wall time, {own:.0f} + {children:.0f} s CPU",
        )
        for nodeid, w, o, c in rows[: n or len(rows)]:
            terminalreporter.write_line(f"{o + c:8.2f}s cpu {o:8.2f} own {c:8.2f} children {w:8.2f}s wall  {nodeid}")
    if not _real_tokenizer_outcomes:
        return
    ran = sum(1 for o in _real_tokenizer_outcomes.values() if o != "skipped")
    skipped = sum(1 for o in _real_tokenizer_outcomes.values() if o == "skipped")
    where = (
        KIMI_DIR
        if (KIMI_DIR / "tiktoken.model").exists()
        else f"{KIMI_DIR} (absent: set EAGLEWATCH_SHARED to the shared folder)"
    )
    terminalreporter.write_sep(
        "=",
        f"real-tokenizer tests: {ran} ran, {skipped} skipped; files: {where}",
        yellow=bool(skipped),
        green=not skipped,
    )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def sample_data_dir() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def sample_tokenizer_dir() -> Path:
    path = SAMPLE_DATA / "tokenizer"
    if not (path / "tokenizer.json").exists():
        pytest.fail(f"{path} is missing: run scripts/build_sample_tokenizer.py")
    return path


@pytest.fixture(scope="session")
def sample_reference() -> Path:
    return SAMPLE_DATA / "reference.jsonl"


@pytest.fixture(scope="session")
def kimi_tokenizer_dir() -> Path:
    if not (KIMI_DIR / "tiktoken.model").exists():
        pytest.skip(
            f"real Kimi K2.5 tokenizer files not found at {KIMI_DIR} (set EAGLEWATCH_SHARED to the shared folder)"
        )
    return KIMI_DIR
