"""`Export`: stream a run's done samples into one export folder, atomically.

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
from dataclasses import dataclass, replace
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
from app.export.eval_overlap import EvalOverlap, prompt_hash
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
PROMPTS = "prompts.jsonl"  # per row: id, category, prompt_hash (and in OUT/eval the messages): eval reads it
SHARDED = ("eagle3-shards", "speculators")
MANIFEST_VERSION = 3


class _Folder:
    """One output folder of an export (OUT, or OUT/eval): its writer, samples.tsv, prompts.jsonl and running
    totals. `prompts.jsonl` holds each row's id, category and normalised prompt hash (`eval_overlap.prompt_hash`),
    and in the eval folder (`with_messages`) the prompt's messages and tools too: what `eaglewatch eval` reads
    (its `[eval] training`) for its default prompts and its overlap guard, whatever the trainer format."""

    def __init__(self, folder: Path, writer_of: Callable[[Path], Writer], with_messages: bool = False) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.writer = writer_of(folder)
        self.samples_fh = (folder / SAMPLES).open("w", encoding="utf-8", buffering=WRITE_BUFFER)
        self.samples_fh.write("id\tids_source\tverdict\ttokens\tturns\toff_policy\n")
        self.prompts_fh = (folder / PROMPTS).open("w", encoding="utf-8", buffering=WRITE_BUFFER)
        self.with_messages = with_messages
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
        self.samples_fh.write(
            f"{_tsv(row.sample_id)}\t{row.ids_source}\t{row.verdict}\t{total}\t{turns}\t{int(off_policy)}\n"
        )
        self._prompt(row)
        return None

    def _prompt(self, row: TrainingRow) -> None:
        src = row.source
        messages = getattr(src, "messages", None)
        if not isinstance(messages, list):
            return
        record: dict[str, Any] = {
            "id": row.sample_id,
            "category": getattr(src, "topic", None),
            "prompt_hash": prompt_hash(messages),
        }
        if self.with_messages:
            record["messages"] = messages
            if getattr(src, "tools", None):
                record["tools"] = src.tools
        self.prompts_fh.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> list[dict[str, Any]]:
        files = self.writer.close()
        self.samples_fh.close()
        self.prompts_fh.close()
        return files

    def lengths(self) -> dict[str, Any]:
        return {
            "samples": self.exported,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "min": self.shortest,
            "max": self.longest,
            "mean": round(self.tokens / self.exported, 2) if self.exported else None,
        }


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """How to export a run (every choice but the database, the destination and the format).

    `run`: its name or id (None: the only or latest one). `workers` > 1 renders prompts in that many processes
    (order and bounded memory kept). `eval_fraction` holds that share of the rows out under `out_dir/eval`
    (app.export.eval_split: by a stable hash of the sample id, a conversation's id for its rows). `conversations`:
    "per-turn" writes a row per done turn of a whole conversation, "merged" one row per conversation where its
    prefix property is proven, else its per-turn rows (app.export.conversation_rows; counted in the report's and
    manifest's `conversations`). `tokenizer_dir` / `profile_name` / `chat_template` / `template_kwargs` override
    what the run's stored config names; `overwrite` replaces an earlier export. `eval_prompts` (default: the run
    config's `[export] eval_prompts`) are files of prompts a training row must not equal: such rows are left out
    unless `keep_eval_overlap` (default: the config's), near-duplicates reported (app.export.eval_overlap; the
    report's and manifest's `eval_overlap`).
    """

    run: str | None = None
    policy: ExportPolicy = ExportPolicy()
    shard_size: int = 1000
    tokenizer_dir: Path | None = None
    profile_name: str | None = None
    chat_template: Path | None = None
    template_kwargs: dict[str, Any] | None = None
    overwrite: bool = False
    workers: int = 1
    eval_fraction: float = 0.0
    conversations: str = "per-turn"
    eval_prompts: tuple[Path, ...] | None = None
    keep_eval_overlap: bool | None = None

    def check(self, fmt: str) -> None:
        """Raise InputError (naming the option) for a format or an option the export cannot take."""
        if fmt not in FORMATS:
            raise InputError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
        if self.conversations not in CONVERSATION_MODES:
            raise InputError(f"--conversations: {self.conversations!r} is not one of {', '.join(CONVERSATION_MODES)}")
        if self.conversations == "merged" and fmt == "sglang-raw":
            raise InputError(
                "--conversations merged: sglang-raw holds one request and its output ids per record, so "
                "it cannot hold a merged conversation; export it per-turn, or choose a format of ids and "
                "masks (eagle3-shards, speculators, specforge)"
            )
        if self.workers <= 0:
            raise InputError(f"--workers: must be at least 1, got {self.workers}")
        if self.shard_size <= 0:
            raise InputError(f"--shard-size: must be a positive number of samples, got {self.shard_size}")
        if self.policy.max_length is not None and self.policy.max_length <= 0:
            raise InputError(f"--max-length: must be a positive number of tokens, got {self.policy.max_length}")
        try:
            check_fraction(self.eval_fraction)
        except ValueError as exc:
            raise InputError(f"--eval-fraction: {exc}") from None


_Turn = tuple[ExportRow, str | None, TrainingRow | None]  # a conversation's done turn: row, skip reason, row


class Export:
    """One export of a run's done samples into `out_dir` in format `fmt` (built aside, renamed in at the end).

    `run()` does it once and returns the ExportReport; progress(seen, exported) is called after every sample.
    Raises InputError for a bad database, run, tokenizer, template, or an output directory that already holds an
    export (unless options.overwrite) or other files.
    """

    def __init__(
        self,
        db: Path,
        out_dir: Path,
        fmt: str,
        options: ExportOptions = ExportOptions(),
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.db, self.out_dir, self.fmt, self.options, self.progress = db, out_dir, fmt, options, progress
        self.policy = options.policy
        self.accepted = self.seen = 0
        self.held: Counter[tuple[str, str]] = Counter()
        self.skipped: Counter[str] = Counter()
        self.tally = ConversationTally(mode=options.conversations)
        self.group: list[_Turn] = []  # one conversation's done turns
        self.evals: _Folder | None = None
        self.overlap: EvalOverlap | None = None

    def run(self) -> ExportReport:
        """Export once; see the class doc."""
        from app.store.queries import connect_readonly

        self.options.check(self.fmt)
        _check_destination(self.out_dir, self.options.overwrite)
        started = time.perf_counter()
        self.conn = connect_readonly(self.db)
        work = self.out_dir.parent / f".{self.out_dir.name}.partial-{os.getpid()}"
        try:
            self._open()
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            self.train = _Folder(work, self._writer_of)
            self.evals = (
                _Folder(work / EVAL_DIR, self._writer_of, with_messages=True)
                if self.options.eval_fraction > 0
                else None
            )
            self._stream()
            folders = [self.train] + ([self.evals] if self.evals is not None else [])
            train_files, *eval_files = [f.close() for f in folders]
            report = self._report(folders)
            self._write_manifests(work, report, train_files, eval_files)
            _move_into_place(work, self.out_dir)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        finally:
            self.conn.close()
        listed = [entry["path"] for entry in train_files] + [MANIFEST, SAMPLES]
        for entries in eval_files:
            listed += [f"{EVAL_DIR}/{entry['path']}" for entry in entries] + [
                f"{EVAL_DIR}/{MANIFEST}",
                f"{EVAL_DIR}/{SAMPLES}",
            ]
        return replace(report, files=tuple(listed), seconds=time.perf_counter() - started)

    def _open(self) -> None:
        """Resolve the run and load what rendering and checking its rows need (tokenizer, profile, template)."""
        from app.store.queries import resolve_run
        from app.tokens import get_profile, load_tokenizer

        o = self.options
        self.info = info = resolve_run(self.conn, o.run, db_label=str(self.db))
        config = info.config if isinstance(info.config, dict) else {}
        model = config.get("model") or {}
        tok_dir = o.tokenizer_dir or (Path(model["tokenizer"]) if model.get("tokenizer") else None)
        if tok_dir is None:
            raise InputError(f"run {info.name!r}: its stored config names no tokenizer; pass --tokenizer DIR")
        if not tok_dir.is_dir():
            raise InputError(f"{tok_dir}: tokenizer directory not found (from the run's config); pass --tokenizer DIR")
        self.tok_dir = tok_dir
        self.tokenizer = load_tokenizer(tok_dir)
        found = config.get("export")
        section: dict[str, Any] = found if isinstance(found, dict) else {}
        eval_files = (
            list(o.eval_prompts) if o.eval_prompts is not None else [Path(p) for p in section.get("eval_prompts") or ()]
        )
        keep = bool(section.get("keep_eval_overlap", False)) if o.keep_eval_overlap is None else o.keep_eval_overlap
        self.overlap = EvalOverlap.load(eval_files, keep) if eval_files else None
        self.profile = get_profile(o.profile_name or model.get("profile") or "kimi-k2.5")
        self.kwargs = o.template_kwargs if o.template_kwargs is not None else template_kwargs_of_run(config)
        self.renderer = PromptRenderer(
            self.tokenizer, self.profile, load_chat_template(tok_dir, o.chat_template, self.kwargs), self.kwargs
        )
        # ids reconstructed from text by an endpoint nothing verified are refused unless accepted (app.export.policy)
        self.verification = with_verification(self.conn, info.id, self.policy)
        self.policy = self.verification.policy

    def _sampling(self) -> dict[str, Any]:
        """How the run's answers were sampled (its stored [generation]; thinking from the template kwargs): what
        `eaglewatch eval` compares its own sampling with."""
        config = self.info.config if isinstance(self.info.config, dict) else {}
        found = config.get("generation")
        gen: dict[str, Any] = found if isinstance(found, dict) else {}
        thinking = next((self.kwargs[k] for k in ("enable_thinking", "thinking") if k in self.kwargs), None)
        return {
            "temperature": gen.get("temperature", 1.0),
            "top_p": gen.get("top_p", 1.0),
            "top_k": gen.get("top_k"),
            "thinking": thinking,
        }

    def _writer_of(self, folder: Path) -> Writer:
        return make_writer(self.fmt, folder, self.tokenizer, self.profile, self.options.shard_size)

    def _check(self, row: ExportRow) -> str | None:
        """Why `row` is skipped (None: exported); a row reconstructed with another tokenizer stops the export."""
        reason = skip_reason(row, self.policy)
        fp = self.tokenizer.fingerprint
        if reason is None and row.tokenizer_fingerprint and row.tokenizer_fingerprint != fp:
            raise InputError(
                f"sample {row.sample_id!r}: its ids were reconstructed with tokenizer "
                f"{row.tokenizer_fingerprint[:12]}, "
                f"not {self.tok_dir} ({fp[:12]}); pass the run's tokenizer with --tokenizer, or "
                "run `eaglewatch reprocess` with this one first"
            )
        if reason is None and self.overlap is not None and self.overlap.check(row.sample_id, row.messages):
            return "eval_overlap"
        return reason

    def _stream(self) -> None:
        """Read, render and write every done sample, a conversation's turns per turn or merged."""
        o = self.options
        rows = iter_rows(self.conn, self.info.id)
        prepared = (
            prepare_parallel(rows, self._check, self.renderer, self.tok_dir, o.workers)
            if o.workers > 1
            else prepare_serial(rows, self._check, self.renderer)
        )
        tally = self.tally
        current: str | None = None  # the conversation whose turns are being read (rows come in pk order, and
        # ingest gives a conversation's turns consecutive keys, so its done turns arrive together, in turn order)
        for row, reason, prompt_ids in prepared:
            self.seen += 1
            training = None
            if reason is None:
                output_ids, source = true_ids(row)
                training = TrainingRow.single_turn(row, prompt_ids or [], output_ids, source)
            if row.conversation_id != current:
                if self.group:
                    self._flush()
                current = row.conversation_id
                tally.conversations += current is not None
            if row.conversation_id is None:
                if reason is None and training is not None:
                    reason = self._emit(training)
                self._settle(row, reason)
            else:
                tally.turns += 1
                if o.conversations == "merged":
                    self.group.append((row, reason, training))
                else:
                    self._per_turn([(row, reason, training)])
            if self.progress is not None:
                self.progress(self.seen, self.train.exported + (self.evals.exported if self.evals is not None else 0))
        if self.group:
            self._flush()

    def _emit(self, training: TrainingRow, turns: str = "", off_policy: bool = False) -> str | None:
        """Write one row to its split (None), or say why not (too long, or the format cannot hold it)."""
        if self.policy.max_length is not None and len(training.input_ids) > self.policy.max_length:
            return "too_long"
        evals = self.evals
        folder = evals if evals is not None and held_out(training.split_key, self.options.eval_fraction) else self.train
        return folder.write(training, turns, off_policy)

    def _settle(self, row: ExportRow, reason: str | None) -> None:
        """Count one sample's outcome: skipped under its reason, or exported."""
        if reason is not None:
            self.skipped[reason] += 1
            if reason == "suspect":  # per endpoint: the advice says when the other path would keep more
                self.held[(row.endpoint or "", row.provider or "")] += 1
            return
        self.accepted += self.policy.accept_unverified and is_unverified_text(row, self.policy)
        if row.conversation_id is not None:
            self.tally.exported_turns += 1
            self.tally.off_policy_turns += row.off_policy

    def _per_turn(self, turns: list[_Turn]) -> None:
        for row, reason, training in turns:
            if reason is None and training is not None:
                reason = self._emit(training, str(row.turn), row.off_policy)
            self._settle(row, reason)

    def _flush(self) -> None:
        """Write the buffered conversation: one merged row where its prefix property is proven (module doc of
        app.export.conversation_rows), else its per-turn rows, counted under why."""
        turns = list(self.group)
        self.group.clear()
        tally = self.tally
        kept, contiguous = kept_prefix([(row, reason) for row, reason, _ in turns])
        if not kept:
            tally.none_kept += 1
            self._per_turn(turns)
            return
        cid = str(turns[0][0].conversation_id)
        why: str | None
        if conversation_is_open(self.conn, self.info.id, cid):
            why = "open"
        elif not contiguous:
            why = "turn_left_out"
        else:
            proven = [t for i in kept if (t := turns[i][2]) is not None]  # a kept turn has its row
            broken = prefix_break(proven)
            if broken is not None:
                why = why_not_prefix(proven[broken - 1], proven[broken], self.tokenizer)
            else:
                merged = merged_row(cid, proven)
                last = turns[kept[-1]][0]
                off = any(turns[i][0].off_policy for i in kept)
                why = self._emit(merged, f"1-{last.turn}" if last.turn and last.turn > 1 else "1", off)
                if why is None:
                    tally.merged += 1
                    tally.merged_turns += len(kept)
                    tally.merged_prefix += bool(last.turns and last.turn and last.turn < last.turns)
                    for row, reason, _ in turns:
                        self._settle(row, reason)
                    return
                why = "merged_too_long" if why == "too_long" else "not_reproducible"
        tally.per_turn[why] += 1
        self._per_turn(turns)

    def _warnings(self) -> tuple[str, ...]:
        """What the report and manifest warn of: the writers' warnings, then the verification advice."""
        skipped, evals = self.skipped, self.evals
        said = list(self.verification.advice) if skipped.get("unverified") or self.accepted else []
        if skipped.get("unverified"):
            said.insert(
                0,
                f"{skipped['unverified']} sample(s) reconstructed from text by unverified endpoints were refused "
                "(pass --accept-unverified to export them anyway)",
            )
        return (
            tuple(self.train.writer.warnings())
            + tuple(f"eval split ({EVAL_DIR}/): {w}" for w in (evals.writer.warnings() if evals is not None else ()))
            + tuple(said)
            + tuple(held_back_advice(self.verification.statuses, self.held))
        )

    def _report(self, folders: list[_Folder]) -> ExportReport:
        """The report of the written folders (files and seconds filled in by run)."""
        fmt, evals = self.fmt, self.evals
        longest = max((f.longest for f in folders if f.longest is not None), default=None)
        self.template_name = SPECFORGE_TEMPLATES.get(self.profile.name, (None,))[0]
        sources = Counter[str]()
        for f in folders:
            sources.update(f.sources)
        return ExportReport(
            run=self.info.name,
            format=fmt,
            out_dir=self.out_dir,
            exported=sum(f.exported for f in folders),
            skipped={k: self.skipped[k] for k in SKIP_REASONS if self.skipped.get(k)},
            tokens=sum(f.tokens for f in folders),
            loss_tokens=sum(f.loss_tokens for f in folders),
            min_length=min((f.shortest for f in folders if f.shortest is not None), default=None),
            max_length=longest,
            files=(),
            seconds=0.0,
            ids_sources=dict(sorted(sources.items())),
            warnings=self._warnings(),
            seen=self.seen,
            eval_exported=evals.exported if evals is not None else 0,
            eval_fraction=self.options.eval_fraction,
            conversations=self.tally.as_dict() if self.tally.conversations else None,
            eval_overlap=self.overlap.tally.as_dict() if self.overlap is not None else None,
            train=trainer_routes(
                fmt,
                self.out_dir,
                longest,
                specforge_template=self.template_name,
                evaluated=evals is not None,
                db=self.db,
                run=self.info.name,
            ),
        )

    def _write_manifests(
        self,
        work: Path,
        report: ExportReport,
        train_files: list[dict[str, Any]],
        eval_files: list[list[dict[str, Any]]],
    ) -> None:
        """The manifest of the train (or only) folder and, with an eval split, of the eval folder."""
        from app.store.queries import dataset_mix

        fmt, evals, renderer, shard_size = self.fmt, self.evals, self.renderer, self.options.shard_size
        warnings = report.warnings
        header: dict[str, Any] = {
            "format": fmt,
            "version": MANIFEST_VERSION,
            "run": self.info.name,
            "profile": self.profile.name,
            "tokenizer": {"path": str(self.tok_dir), "fingerprint": self.tokenizer.fingerprint},
            "tokenizer_fingerprint": self.tokenizer.fingerprint,
            "prompt_renderer": renderer.kind,
            "chat_template": renderer.template.source if renderer.template is not None else None,
            "chat_template_kwargs": self.kwargs,
            "sampling": self._sampling(),
            "prompts_file": PROMPTS,
            "policy": self.policy.as_dict(),
            "data_dir": DATA_DIR,
            "samples_file": SAMPLES,
            # the whole run's mix by dataset and category (the export's rows are those of it the policy kept)
            "run_mix": [row.as_json() for row in dataset_mix(self.conn, self.info.id)],
        }
        split = {
            "eval_fraction": self.options.eval_fraction,
            "key": "the prompt's opening: its normalised messages through the first user message "
            "(app.export.eval_overlap.split_key; equal prompts and a conversation's rows together)",
            "hash": "sha256, first 8 bytes below fraction",
            "eval_dir": EVAL_DIR if evals is not None else None,
        }
        _write_manifest(
            work,
            header,
            fmt,
            shard_size,
            self.train,
            train_files,
            {
                "counts": summary_counts(report),
                "verification": {
                    "endpoints": [st.as_json() for st in self.verification.statuses],
                    "unverified": {"refused": self.skipped.get("unverified", 0), "accepted": self.accepted},
                },
                "conversations": self.tally.as_dict(),
                "eval_overlap": report.eval_overlap,
                "split": {**split, "role": "train" if evals is not None else "all"},
                "train": report.train,
                "warnings": list(warnings),
            },
        )
        if evals is not None:
            eval_routes = trainer_routes(
                fmt,
                self.out_dir / EVAL_DIR,
                report.max_length,
                specforge_template=self.template_name,
                db=self.db,
                run=self.info.name,
            )
            _write_manifest(
                evals.folder,
                header,
                fmt,
                shard_size,
                evals,
                eval_files[0],
                {
                    "counts": {"exported": evals.exported},
                    "split": {**split, "role": "eval", "train_dir": ".."},
                    "train": eval_routes,
                    "warnings": [w for w in warnings if w.startswith("eval split")],
                },
            )


def _write_manifest(
    folder: Path,
    header: dict[str, Any],
    fmt: str,
    shard_size: int,
    split: _Folder,
    files: list[dict[str, Any]],
    extra: dict[str, Any],
) -> None:
    manifest: dict[str, Any] = {
        **header,
        **extra,
        "ids_sources": dict(sorted(split.sources.items())),
        "lengths": split.lengths(),
        **split.writer.manifest_extra(),
    }
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
        raise InputError(
            f"{out_dir}: is not empty and holds no eaglewatch export; choose an empty or new --out "
            "(eaglewatch never deletes files it did not write)"
        )


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
