"""`export_run`: stream a run's done samples into one export folder, atomically.

The folder is built beside its destination (`.<name>.partial-<pid>`) and renamed into place at the end, so an
interrupted export leaves the previous export (or nothing) and never new files beside an old manifest.
Layout: `<out>/manifest.json`, `<out>/samples.tsv` (per row: id, ids source, verdict, tokens) and the data
under `<out>/data/` (point a trainer at that folder or file); with an eval fraction, `<out>/eval/` holds the
held-out rows as an export folder of its own (its own manifest.json, samples.tsv and data/).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.export.conversation_rows import (
    CONVERSATION_MODES,
    ConversationTally,
    kept_prefix,
    merged_row,
    prefix_break,
    why_not_prefix,
)
from app.export.eval_split import EVAL_DIR, check_fraction, held_out
from app.export.parallel import prepare_parallel, prepare_serial
from app.export.policy import (
    SKIP_REASONS,
    ExportPolicy,
    held_back_advice,
    is_unverified_text,
    skip_reason,
    true_ids,
    with_verification,
)
from app.export.report import ExportReport, summary_counts
from app.export.templates import load_chat_template, template_kwargs_of_run
from app.export.trainer_routes import trainer_routes
from app.export.training_rows import TrainingRow
from app.export.writers import DATA_DIR, SPECFORGE_TEMPLATES, WRITE_BUFFER, Writer, make_writer
from app.store.export_reads import ExportRow, conversation_is_open, iter_rows
from app.tokens.render_export import PromptRenderer

FORMATS = ("sglang-raw", "specforge", "specforge-text", "speculators", "modelopt", "eagle3-shards")
MANIFEST = "manifest.json"
SAMPLES = "samples.tsv"
SHARDED = ("eagle3-shards", "speculators")
MANIFEST_VERSION = 3


class _Folder:
    """One output folder of an export (OUT, or OUT/eval): its writer, samples.tsv and running totals."""

    def __init__(self, folder: Path, writer_of: Callable[[Path], Writer]) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.writer = writer_of(folder)
        self.samples_fh = (folder / SAMPLES).open("w", encoding="utf-8", buffering=WRITE_BUFFER)
        self.samples_fh.write("id\tids_source\tverdict\ttokens\tturns\toff_policy\n")
        self.exported = self.tokens = self.loss_tokens = 0
        self.shortest: int | None = None
        self.longest: int | None = None
        self.sources: Counter[str] = Counter()

    def write(self, row: TrainingRow, turns: str = "", off_policy: bool = False) -> str | None:
        """Write a row (None) or say why its format cannot hold it; `turns` names a conversation's turns in it
        ("2", "1-3"; "" for a single-turn sample) and `off_policy` marks replayed tool results in its history."""
        reason = self.writer.write(row)
        if reason is not None:
            return reason
        total = len(row.input_ids)
        self.exported += 1
        self.sources[row.ids_source] += 1
        self.tokens += total
        self.loss_tokens += row.loss_tokens
        self.shortest = total if self.shortest is None else min(self.shortest, total)
        self.longest = total if self.longest is None else max(self.longest, total)
        self.samples_fh.write(f"{_tsv(row.sample_id)}\t{row.ids_source}\t{row.verdict}\t{total}\t{turns}\t"
                              f"{int(off_policy)}\n")
        return None

    def close(self) -> list[dict[str, Any]]:
        files = self.writer.close()
        self.samples_fh.close()
        return files

    def lengths(self) -> dict[str, Any]:
        return {"samples": self.exported, "tokens": self.tokens, "loss_tokens": self.loss_tokens,
                "min": self.shortest, "max": self.longest,
                "mean": round(self.tokens / self.exported, 2) if self.exported else None}


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
    eval_fraction: float = 0.0,
    conversations: str = "per-turn",
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Stream a run's done samples into `out_dir` in format `fmt` (built aside, renamed in at the end).

    workers > 1 renders prompts in that many processes (order and bounded memory kept). `eval_fraction` holds
    that share of the rows out under `out_dir/eval` (app.export.eval_split: by a stable hash of the sample id, a
    conversation's id for its rows). `conversations`: "per-turn" writes a row per done turn of a whole
    conversation, "merged" one row per conversation where its prefix property is proven, else its per-turn rows
    (app.export.conversation_rows; counted in the report's and manifest's `conversations`).
    progress(seen, exported) is called after every sample. Raises InputError for a bad database, run,
    tokenizer, template, or an output directory that already holds an export (unless overwrite) or other files.
    """
    from app.store.queries import connect_readonly, resolve_run
    from app.tokens import get_profile, load_tokenizer

    if fmt not in FORMATS:
        raise InputError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if conversations not in CONVERSATION_MODES:
        raise InputError(f"--conversations: {conversations!r} is not one of {', '.join(CONVERSATION_MODES)}")
    if conversations == "merged" and fmt == "sglang-raw":
        raise InputError("--conversations merged: sglang-raw holds one request and its output ids per record, so "
                         "it cannot hold a merged conversation; export it per-turn, or choose a format of ids and "
                         "masks (eagle3-shards, speculators, specforge)")
    if workers <= 0:
        raise InputError(f"--workers: must be at least 1, got {workers}")
    if shard_size <= 0:
        raise InputError(f"--shard-size: must be a positive number of samples, got {shard_size}")
    if policy.max_length is not None and policy.max_length <= 0:
        raise InputError(f"--max-length: must be a positive number of tokens, got {policy.max_length}")
    try:
        check_fraction(eval_fraction)
    except ValueError as exc:
        raise InputError(f"--eval-fraction: {exc}") from None
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

        def writer_of(folder: Path) -> Writer:
            return make_writer(fmt, folder, tokenizer, profile, shard_size)

        train = _Folder(work, writer_of)
        evals = _Folder(work / EVAL_DIR, writer_of) if eval_fraction > 0 else None
        skipped: Counter[str] = Counter()
        seen = 0

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
        tally = ConversationTally(mode=conversations)
        group: list[tuple[ExportRow, str | None, TrainingRow | None]] = []  # one conversation's done turns

        def emit(training: TrainingRow, turns: str = "", off_policy: bool = False) -> str | None:
            """Write one row to its split (None), or say why not (too long, or the format cannot hold it)."""
            if policy.max_length is not None and len(training.input_ids) > policy.max_length:
                return "too_long"
            folder = evals if evals is not None and held_out(training.split_key, eval_fraction) else train
            return folder.write(training, turns, off_policy)

        def settle(row: ExportRow, reason: str | None) -> None:
            """Count one sample's outcome: skipped under its reason, or exported."""
            nonlocal accepted
            if reason is not None:
                skipped[reason] += 1
                if reason == "suspect":  # per endpoint: the advice says when the other path would keep more
                    held[(row.endpoint or "", row.provider or "")] += 1
                return
            accepted += policy.accept_unverified and is_unverified_text(row, policy)
            if row.conversation_id is not None:
                tally.exported_turns += 1
                tally.off_policy_turns += row.off_policy

        def per_turn(turns: list[tuple[ExportRow, str | None, TrainingRow | None]]) -> None:
            for row, reason, training in turns:
                if reason is None and training is not None:
                    reason = emit(training, str(row.turn), row.off_policy)
                settle(row, reason)

        def flush() -> None:
            """Write the buffered conversation: one merged row where its prefix property is proven (module doc of
            app.export.conversation_rows), else its per-turn rows, counted under why."""
            turns = list(group)
            group.clear()
            kept, contiguous = kept_prefix([(row, reason) for row, reason, _ in turns])
            if not kept:
                tally.none_kept += 1
                per_turn(turns)
                return
            cid = str(turns[0][0].conversation_id)
            why: str | None
            if conversation_is_open(conn, info.id, cid):
                why = "open"
            elif not contiguous:
                why = "turn_left_out"
            else:
                proven = [t for i in kept if (t := turns[i][2]) is not None]  # a kept turn has its row
                broken = prefix_break(proven)
                if broken is not None:
                    why = why_not_prefix(proven[broken - 1], proven[broken], tokenizer)
                else:
                    merged = merged_row(cid, proven)
                    last = turns[kept[-1]][0]
                    off = any(turns[i][0].off_policy for i in kept)
                    why = emit(merged, f"1-{last.turn}" if last.turn and last.turn > 1 else "1", off)
                    if why is None:
                        tally.merged += 1
                        tally.merged_turns += len(kept)
                        tally.merged_prefix += bool(last.turns and last.turn and last.turn < last.turns)
                        for row, reason, _ in turns:
                            settle(row, reason)
                        return
                    why = "merged_too_long" if why == "too_long" else "not_reproducible"
            tally.per_turn[why] += 1
            per_turn(turns)

        current: str | None = None  # the conversation whose turns are being read (rows come in pk order, and
        # ingest gives a conversation's turns consecutive keys, so its done turns arrive together, in turn order)
        for row, reason, prompt_ids in prepared:
            seen += 1
            training = None
            if reason is None:
                output_ids, source = true_ids(row)
                training = TrainingRow.single_turn(row, prompt_ids or [], output_ids, source)
            if row.conversation_id != current:
                if group:
                    flush()
                current = row.conversation_id
                tally.conversations += current is not None
            if row.conversation_id is None:
                if reason is None and training is not None:
                    reason = emit(training)
                settle(row, reason)
            else:
                tally.turns += 1
                if conversations == "merged":
                    group.append((row, reason, training))
                else:
                    per_turn([(row, reason, training)])
            if progress is not None:
                progress(seen, train.exported + (evals.exported if evals is not None else 0))
        if group:
            flush()
        folders = [train] + ([evals] if evals is not None else [])
        train_files, *eval_files = [f.close() for f in folders]
        said = list(verification.advice) if skipped.get("unverified") or accepted else []
        if skipped.get("unverified"):
            said.insert(0, f"{skipped['unverified']} sample(s) rebuilt from text by unverified endpoints were refused "
                        "(pass --accept-unverified to export them anyway)")
        warnings = tuple(train.writer.warnings()) + tuple(
            f"eval split ({EVAL_DIR}/): {w}" for w in (evals.writer.warnings() if evals is not None else ())) + tuple(
            said) + tuple(held_back_advice(verification.statuses, held))
        longest = max((f.longest for f in folders if f.longest is not None), default=None)
        template_name = SPECFORGE_TEMPLATES.get(profile.name, (None,))[0]
        exported = sum(f.exported for f in folders)
        ordered_skips = {k: skipped[k] for k in SKIP_REASONS if skipped.get(k)}
        sources = Counter[str]()
        for f in folders:
            sources.update(f.sources)
        report = ExportReport(
            run=info.name,
            format=fmt,
            out_dir=out_dir,
            exported=exported,
            skipped=ordered_skips,
            tokens=sum(f.tokens for f in folders),
            loss_tokens=sum(f.loss_tokens for f in folders),
            min_length=min((f.shortest for f in folders if f.shortest is not None), default=None),
            max_length=longest,
            files=(),
            seconds=0.0,
            ids_sources=dict(sorted(sources.items())),
            warnings=warnings,
            seen=seen,
            eval_exported=evals.exported if evals is not None else 0,
            eval_fraction=eval_fraction,
            conversations=tally.as_dict() if tally.conversations else None,
            train=trainer_routes(fmt, out_dir, longest, specforge_template=template_name, evaluated=evals is not None,
                                 db=db, run=info.name),
        )
        header: dict[str, Any] = {
            "format": fmt,
            "version": MANIFEST_VERSION,
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
        }
        split = {"eval_fraction": eval_fraction, "key": "sample id (a whole conversation's id for its rows)", "hash": "sha256, first 8 bytes below fraction",
                 "eval_dir": EVAL_DIR if evals is not None else None}
        _write_manifest(work, header, fmt, shard_size, train, train_files, {
            "counts": summary_counts(report),
            "verification": {
                "endpoints": [st.as_json() for st in verification.statuses],
                "unverified": {"refused": skipped.get("unverified", 0), "accepted": accepted},
            },
            "conversations": tally.as_dict(),
            "split": {**split, "role": "train" if evals is not None else "all"},
            "train": report.train,
            "warnings": list(warnings),
        })
        if evals is not None:
            eval_routes = trainer_routes(fmt, out_dir / EVAL_DIR, longest, specforge_template=template_name, db=db,
                                         run=info.name)
            _write_manifest(evals.folder, header, fmt, shard_size, evals, eval_files[0], {
                "counts": {"exported": evals.exported},
                "split": {**split, "role": "eval", "train_dir": ".."},
                "train": eval_routes,
                "warnings": [w for w in warnings if w.startswith("eval split")],
            })
        _move_into_place(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        conn.close()
    listed = [entry["path"] for entry in train_files] + [MANIFEST, SAMPLES]
    for entries in eval_files:
        listed += [f"{EVAL_DIR}/{entry['path']}" for entry in entries] + [f"{EVAL_DIR}/{MANIFEST}", f"{EVAL_DIR}/{SAMPLES}"]
    return replace(report, files=tuple(listed), seconds=time.perf_counter() - started)


def _write_manifest(folder: Path, header: dict[str, Any], fmt: str, shard_size: int, split: _Folder,
                    files: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    manifest: dict[str, Any] = {**header, **extra, "ids_sources": dict(sorted(split.sources.items())),
                                "lengths": split.lengths(), **split.writer.manifest_extra()}
    if fmt in SHARDED:
        manifest["shard_size"] = shard_size
        manifest["shards"] = files
    else:
        manifest["files"] = files
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


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
