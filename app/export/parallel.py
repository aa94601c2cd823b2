"""Prompt rendering for an export, in store order: in this process, or in a pool of processes (batches,
at most 2 x workers in flight, so memory stays bounded)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.store.export_reads import ExportRow
from app.tokens.render_export import ChatTemplate, PromptRenderer

_WORKER_RENDERER: PromptRenderer | None = None
_BATCH = 64

Prepared = tuple[ExportRow, str | None, list[int] | None]


def _worker_init(
    tokenizer_dir: str, profile_name: str, template: ChatTemplate | None, kwargs: dict[str, Any] | None = None
) -> None:
    global _WORKER_RENDERER
    from app.libnoise import silence_library_noise

    silence_library_noise()
    from app.tokens import get_profile, load_tokenizer

    _WORKER_RENDERER = PromptRenderer(load_tokenizer(tokenizer_dir), get_profile(profile_name), template, kwargs)


def _worker_render(jobs: list[tuple[str, list[dict[str, Any]], list[Any] | None]]) -> list[list[int]]:
    assert _WORKER_RENDERER is not None
    return [_WORKER_RENDERER.prompt_ids(messages, tools, sid) for sid, messages, tools in jobs]


def prepare_serial(
    rows: Iterator[ExportRow], check: Callable[[ExportRow], str | None], renderer: PromptRenderer
) -> Iterator[Prepared]:
    """(row, skip reason, prompt ids) in store order, prompts rendered here."""
    for row in rows:
        reason = check(row)
        yield row, reason, (renderer.prompt_ids(row.messages, row.tools, row.sample_id) if reason is None else None)


def prepare_parallel(
    rows: Iterator[ExportRow],
    check: Callable[[ExportRow], str | None],
    renderer: PromptRenderer,
    tokenizer_dir: Path,
    workers: int,
) -> Iterator[Prepared]:
    """(row, skip reason, prompt ids) in store order, prompts rendered by a process pool in batches."""
    import multiprocessing as mp
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor
    from itertools import islice

    context = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_worker_init,
        initargs=(str(tokenizer_dir), renderer.profile.name, renderer.template, renderer.profile_kwargs),
    )
    pending: deque = deque()

    def drain(item):
        checked, future = item
        prompts = iter(future.result())
        for row, reason in checked:
            yield row, reason, (next(prompts) if reason is None else None)

    try:
        while batch := list(islice(rows, _BATCH)):
            checked = [(row, check(row)) for row in batch]
            jobs = [(row.sample_id, row.messages, row.tools) for row, reason in checked if reason is None]
            pending.append((checked, pool.submit(_worker_render, jobs)))
            while len(pending) > 2 * workers:
                yield from drain(pending.popleft())
        while pending:
            yield from drain(pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
