"""`export_run`: stream a run's done samples into one export folder, atomically.

The folder is built beside its destination (`.<name>.partial-<pid>`) and renamed into place at the end, so an
interrupted export leaves the previous export (or nothing) and never new shards beside an old manifest.
Layout: `<out>/manifest.json`, `<out>/samples.tsv` (per sample: id, ids source, verdict, tokens) and the data
under `<out>/data/` (point a trainer at that folder or file).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.export.parallel import prepare_parallel, prepare_serial
from app.export.policy import (ExportPolicy, held_back_advice, is_unverified_text, skip_reason, true_ids,
                               with_verification)
from app.export.report import ExportReport
from app.export.templates import load_chat_template, template_kwargs_of_run
from app.export.writers import DATA_DIR, WRITE_BUFFER, make_writer
from app.store.export_reads import ExportRow, iter_rows
from app.tokens.render_export import PromptRenderer

FORMATS = ("sglang-raw", "specforge", "specforge-text", "speculators", "modelopt", "eagle3-shards")
MANIFEST = "manifest.json"
SAMPLES = "samples.tsv"
SHARDED = ("eagle3-shards", "speculators")


def export_run(
    db: Path,
    out_dir: Path,
    fmt: str,
    *,
    run: str | None = None,
    policy: ExportPolicy = ExportPolicy(),
    shard_size: int = 1000,
    tokenizer_dir: Path | None = None,
    profile_name: str | None = None,
    chat_template: Path | None = None,
    template_kwargs: dict[str, Any] | None = None,
    overwrite: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Stream a run's done samples into `out_dir` in format `fmt` (built aside, renamed in at the end).

    workers > 1 renders prompts in that many processes (order and bounded memory kept).
    progress(seen, exported) is called after every sample. Raises InputError for a bad database, run,
    tokenizer, template, or an output directory that already holds an export (unless overwrite) or other files.
    """
    from app.store.queries import connect_readonly, resolve_run
    from app.tokens import get_profile, load_tokenizer

    if fmt not in FORMATS:
        raise InputError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if workers <= 0:
        raise InputError(f"--workers: must be at least 1, got {workers}")
    if shard_size <= 0:
        raise InputError(f"--shard-size: must be a positive number of samples, got {shard_size}")
    if policy.max_length is not None and policy.max_length <= 0:
        raise InputError(f"--max-length: must be a positive number of tokens, got {policy.max_length}")
    _check_destination(out_dir, overwrite)
    started = time.perf_counter()
    conn = connect_readonly(db)
    work = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    try:
        info = resolve_run(conn, run, db_label=str(db))
        config = info.config if isinstance(info.config, dict) else {}
        model = config.get("model") or {}
        tok_dir = tokenizer_dir or (Path(model["tokenizer"]) if model.get("tokenizer") else None)
        if tok_dir is None:
            raise InputError(f"run {info.name!r}: its stored config names no tokenizer; pass --tokenizer DIR")
        if not tok_dir.is_dir():
            raise InputError(f"{tok_dir}: tokenizer directory not found (from the run's config); pass --tokenizer DIR")
        tokenizer = load_tokenizer(tok_dir)
        profile = get_profile(profile_name or model.get("profile") or "kimi-k2.5")
        kwargs = template_kwargs if template_kwargs is not None else template_kwargs_of_run(config)
        renderer = PromptRenderer(tokenizer, profile, load_chat_template(tok_dir, chat_template, kwargs), kwargs)
        # ids rebuilt from text by an endpoint nothing verified are refused unless accepted (app.export.policy)
        verification = with_verification(conn, info.id, policy)
        policy = verification.policy
        accepted = 0
        held: Counter[tuple[str, str]] = Counter()

        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        writer = make_writer(fmt, work, tokenizer, profile, shard_size, renderer.template)
        samples_fh = (work / SAMPLES).open("w", encoding="utf-8", buffering=WRITE_BUFFER)
        samples_fh.write("id\tids_source\tverdict\ttokens\n")

        skipped: Counter[str] = Counter()
        sources: Counter[str] = Counter()
        exported = seen = tokens = loss_tokens = 0
        shortest: int | None = None
        longest: int | None = None

        def check(row: ExportRow) -> str | None:
            reason = skip_reason(row, policy)
            if reason is None and row.tokenizer_fingerprint and row.tokenizer_fingerprint != tokenizer.fingerprint:
                raise InputError(
                    f"sample {row.sample_id!r}: its ids were rebuilt with tokenizer {row.tokenizer_fingerprint[:12]}, "
                    f"not {tok_dir} ({tokenizer.fingerprint[:12]}); pass the run's tokenizer with --tokenizer, or "
                    "run `eaglewatch reprocess` with this one first"
                )
            return reason

        rows = iter_rows(conn, info.id)
        prepared = (prepare_parallel(rows, check, renderer, tok_dir, workers) if workers > 1
                    else prepare_serial(rows, check, renderer))
        for row, reason, prompt_ids in prepared:
            seen += 1
            output_ids, source = true_ids(row) if reason is None else ((), "")
            prompt = prompt_ids or []
            total = len(prompt) + len(output_ids)
            if reason is None and policy.max_length is not None and total > policy.max_length:
                reason = "too_long"
            if reason is None:
                reason = writer.write(row, prompt, output_ids, source)
            if reason == "suspect":
                held[(row.endpoint or "", row.provider or "")] += 1
            if reason is not None:
                skipped[reason] += 1
            else:
                accepted += policy.accept_unverified and is_unverified_text(row, policy)
                exported += 1
                sources[source] += 1
                tokens += total
                loss_tokens += len(output_ids)
                shortest = total if shortest is None else min(shortest, total)
                longest = total if longest is None else max(longest, total)
                samples_fh.write(f"{_tsv(row.sample_id)}\t{source}\t{row.category}\t{total}\n")
            if progress is not None:
                progress(seen, exported)
        files = writer.close()
        samples_fh.close()
        said = list(verification.advice) if skipped.get("unverified") or accepted else []
        if skipped.get("unverified"):
            said.insert(0, f"{skipped['unverified']} sample(s) rebuilt from text by unverified endpoints were refused "
                        "(pass --accept-unverified to export them anyway)")
        warnings = tuple(writer.warnings()) + tuple(said) + tuple(held_back_advice(verification.statuses, held))

        manifest: dict[str, Any] = {
            "format": fmt,
            "version": 2,
            "run": info.name,
            "profile": profile.name,
            "tokenizer": {"path": str(tok_dir), "fingerprint": tokenizer.fingerprint},
            "tokenizer_fingerprint": tokenizer.fingerprint,
            "prompt_renderer": renderer.kind,
            "chat_template": renderer.template.source if renderer.template is not None else None,
            "chat_template_kwargs": kwargs,
            "policy": policy.as_dict(),
            "data_dir": DATA_DIR,
            "samples_file": SAMPLES,
            "counts": {"seen": seen, "exported": exported, "skipped": dict(sorted(skipped.items()))},
            "ids_sources": dict(sorted(sources.items())),
            "verification": {
                "endpoints": [st.as_json() for st in verification.statuses],
                "unverified": {"refused": skipped.get("unverified", 0), "accepted": accepted},
            },
            "lengths": {
                "samples": exported,
                "tokens": tokens,
                "loss_tokens": loss_tokens,
                "min": shortest,
                "max": longest,
                "mean": round(tokens / exported, 2) if exported else None,
            },
            **writer.manifest_extra(),
            "warnings": list(warnings),
        }
        if fmt in SHARDED:
            manifest["shard_size"] = shard_size
            manifest["shards"] = files
        else:
            manifest["files"] = files
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        _move_into_place(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        conn.close()
    return ExportReport(
        run=info.name,
        format=fmt,
        out_dir=out_dir,
        exported=exported,
        skipped=dict(sorted(skipped.items())),
        tokens=tokens,
        loss_tokens=loss_tokens,
        min_length=shortest,
        max_length=longest,
        files=tuple(f["path"] for f in files) + (MANIFEST, SAMPLES),
        seconds=time.perf_counter() - started,
        ids_sources=dict(sorted(sources.items())),
        warnings=warnings,
    )


def _tsv(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ")


def _check_destination(out_dir: Path, overwrite: bool) -> None:
    """Refuse an export over an earlier one (unless overwrite) and over a folder of other files (always)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a folder; choose another --out")
    if (out_dir / MANIFEST).exists():
        if not overwrite:
            raise InputError(f"{out_dir}: already holds an export (manifest.json); pass --overwrite or another --out")
        return
    if any(out_dir.iterdir()):
        raise InputError(f"{out_dir}: is not empty and holds no eaglewatch export; choose an empty or new --out "
                         "(eaglewatch never deletes files it did not write)")


def _move_into_place(work: Path, out_dir: Path) -> None:
    """Swap the finished folder in: the old export (if any) is renamed away first, then deleted."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
    os.replace(work, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
