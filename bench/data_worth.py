"""What a mismatch in the training data costs an EAGLE-3 drafter, measured end to end on the CPU and offline.

    python bench/data_worth.py WORK [--quick] [--seeds 3] [--arms exact,off-policy,...]

Stages (each writes its outputs under WORK and a `<stage>.done.json`; a stage whose marker exists is skipped, so a
stopped run resumes where it stopped):

  target    tests/realserver/tiny_qwen3.py's 2-layer Qwen3 (hidden 64, head_dim 32, its tokenizer and template),
            trained on bench/dataworth/corpus.py's answers (words drawn per example: structured, not memorised)
  prompts   training prompts (single turns and two-turn conversations) and held-out eval prompts, seeded
  generate  vLLM serves the target (fp32, qwen3 reasoning parser); `eaglewatch run` regenerates the prompts twice:
            as a vLLM endpoint (exact ids) and as a text-only one (server = "openai"); `eaglewatch export` of each
  arms      one training set per arm (bench/dataworth/arms.py), and its share of tokens differing from the exact one
  prepare   `speculators prepare-data` per arm (vLLM's venv)
  extract   `eaglewatch extract` per arm: [extraction] backend = "vllm", layout = "speculators"
  drafters  per arm and seed (seed by seed): speculators' own trainer (same recipe, seed and steps;
            bench/dataworth/train_eagle3.py), then vLLM serves the target with the drafter as its EAGLE-3 draft and
            `eaglewatch eval --headless` runs the held-out prompts (temperature 0, as the data was generated);
            each drafter's results are kept (a resumed run skips them) and table.partial.md follows
  table     WORK/table.json and WORK/table.md

Needs vLLM's venv (EAGLEWATCH_VLLM_PYTHON, else the newest scripts/vllm_venv.sh build in the test cache) and this
project's venv with the extract extra (torch, transformers) to run it. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dataworth import arms as armsmod  # noqa: E402
from bench.dataworth import corpus  # noqa: E402
from bench.dataworth.server import vllm_env, vllm_server  # noqa: E402

STAGES = ("target", "prompts", "generate", "arms", "prepare", "extract", "drafters", "table")
DRAFT_TOKENS = 3
AUX_LAYERS = [0, 1, 2]  # the "input" convention: embeddings, after layer 0, after layer 1 (= the last, pre-norm)
END = "<|im_end|>"
SEQ_LEN = 1024  # tokens per packed training batch
TRAIN_SHARE = 0.85  # speculators' default train/validation split, less what packing leaves unused
WRONG_END = "<|endoftext|>"  # the wrong special constant of arm (c): another special token of the same tokenizer


@dataclass(frozen=True)
class Plan:
    """What one run measures: sizes, arms, seeds, the training recipe."""

    quick: bool
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    target_cases: int = 120
    target_steps: int = 200
    single: int = 300
    conversations: int = 40
    heldout: int = 48
    max_tokens: int = 128
    train_steps: int = 150  # mid-range acceptance: at 500 the exact arm reached 3.58 of 4 (near the ceiling)
    lr: float = 3e-3  # 3x speculators' default: a few hundred steps must move the drafter
    epochs: int = 200  # an upper bound; train_steps ends training
    extra: dict[str, Any] = field(default_factory=dict)


def make_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        plan = Plan(True, ("exact", "off-policy"), (0,), single=96, conversations=12, heldout=24)
    else:
        plan = Plan(False, tuple(armsmod.ARMS), (0, 1, 2))
    if args.arms:
        unknown = [a for a in args.arms.split(",") if a not in armsmod.ARMS]
        if unknown:
            raise SystemExit(f"--arms: no arm called {unknown}; the arms are {list(armsmod.ARMS)}")
        plan = Plan(**{**asdict(plan), "arms": tuple(args.arms.split(","))})
    if args.seeds:
        plan = Plan(**{**asdict(plan), "seeds": tuple(range(args.seeds))})
    if args.train_steps:
        plan = Plan(**{**asdict(plan), "train_steps": args.train_steps})
    if args.lr:
        plan = Plan(**{**asdict(plan), "lr": args.lr})
    return plan


class Progress:
    """Stage lines a person can follow: name, counts, elapsed and an ETA from the items done so far."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self.started:6.0f}s] {text}"
        print(line, flush=True)
        with open(self.log, "a", encoding="utf-8") as out:
            out.write(line + "\n")

    def items(self, stage: str, names: list[str], work: Callable[[str], None]) -> None:
        """Run work(name) for each name with `k/n` and an ETA after each."""
        t0 = time.monotonic()
        for k, name in enumerate(names, 1):
            self.say(f"{stage}: {k}/{len(names)} {name} ...")
            work(name)
            spent = time.monotonic() - t0
            eta = spent / k * (len(names) - k)
            self.say(f"{stage}: {k}/{len(names)} {name} done ({spent:.0f} s so far, ETA {eta:.0f} s)")


class Bench:
    def __init__(self, work: Path, plan: Plan, vllm_python: str) -> None:
        self.work = work
        self.plan = plan
        self.python = vllm_python
        self.progress = Progress(work / "progress.log")
        self.timings: dict[str, float] = {}

    # ---- bookkeeping ------------------------------------------------------------------------------------------

    def marker(self, stage: str) -> Path:
        return self.work / f"{stage}.done.json"

    def stage(self, k: int, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        done = self.marker(name)
        if done.exists():
            self.progress.say(f"stage {k}/{len(STAGES)} {name}: done before, skipped")
            return json.loads(done.read_text())
        self.progress.say(f"stage {k}/{len(STAGES)} {name}: start")
        t0 = time.monotonic()
        result = body()
        result["wall_s"] = round(time.monotonic() - t0, 1)
        done.write_text(json.dumps(result, indent=1))
        self.progress.say(f"stage {k}/{len(STAGES)} {name}: done in {result['wall_s']} s")
        return result

    def eaglewatch(self, *argv: str, env: dict[str, str] | None = None, log: Path | None = None) -> str:
        """Run an eaglewatch verb in this Python; return its stdout; fail with its stderr."""
        proc = subprocess.run(
            [sys.executable, "-m", "app.cli", *argv], cwd=ROOT, capture_output=True, text=True, env=env
        )  # fmt: skip
        if log is not None:
            log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        if proc.returncode not in (0, 4):  # 4: a threshold (eval's gate) not met, still a report
            raise SystemExit(f"eaglewatch {' '.join(argv[:2])} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        return proc.stdout

    def vllm_run(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        """A command in vLLM's Python (speculators' CLIs), its output in `log`; fail with its tail."""
        scratch = Path(tempfile.mkdtemp(prefix="ew-dw-", dir="/tmp"))
        try:
            with open(log, "w", encoding="utf-8") as out:
                proc = subprocess.run(
                    [self.python, *argv], stdout=out, stderr=subprocess.STDOUT, cwd=self.work,
                    env={**vllm_env(scratch), "COLUMNS": "2000", **(env or {})},  # rich: one line a log record
                )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(argv[:3])} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # ---- stages -----------------------------------------------------------------------------------------------

    def target(self) -> dict[str, Any]:
        import torch

        from tests.realserver import tiny_qwen3

        torch.set_num_threads(max(1, os.cpu_count() or 1))
        folder = self.work / "target"
        shutil.rmtree(folder, ignore_errors=True)
        cases = corpus.target_cases(self.plan.target_cases, seed=1)
        tiny_qwen3.build(folder, steps=self.plan.target_steps, seed=0, head_dim=32, cases=cases)
        return json.loads((folder / "eaglewatch-build.json").read_text())

    def prompts(self) -> dict[str, Any]:
        folder = self.work / "prompts"
        folder.mkdir(exist_ok=True)
        held = corpus.prompts(self.plan.heldout, 0, seed=3, prefix="h")
        unseen = frozenset(p.users[0] for p in held)
        train = corpus.prompts(self.plan.single, self.plan.conversations, seed=2, prefix="t", exclude=unseen)
        single = [p for p in train if len(p.users) == 1]
        convs = [p for p in train if len(p.users) > 1]
        corpus.write_dataset(single, folder / "single.jsonl", with_answers=True)  # regenerate "last" drops it
        corpus.write_dataset(convs, folder / "conversations.jsonl", with_answers=True)
        corpus.write_dataset(held, folder / "heldout.jsonl", with_answers=False)
        (folder / "originals.json").write_text(json.dumps({p.id: p.originals for p in train}))
        return {"single": len(single), "conversations": len(convs), "heldout": len(held)}

    def _run_config(self, name: str, base_url: str, server: str) -> Path:
        folder = self.work / "generate"
        p = self.work / "prompts"
        config = folder / f"{name}.toml"
        config.write_text(f"""
[run]
name = "{name}"
database = "{folder / f"{name}.db"}"
output_dir = "{folder / f"{name}-out"}"

[[data.datasets]]
path = "{p / "single.jsonl"}"
format = "openai-messages"

[[data.datasets]]
path = "{p / "conversations.jsonl"}"
format = "openai-messages"
regenerate = "all"

[model]
name = "target"
tokenizer = "{self.work / "target"}"
profile = "qwen3"

[[endpoints]]
name = "{name}"
base_url = "{base_url}"
server = "{server}"
timeout_s = 600.0

[generation]
max_tokens = {self.plan.max_tokens}
temperature = 0.0
stream = false

[limits]
concurrency_initial = 8
concurrency_max = 8
""")
        return config

    def generate(self) -> dict[str, Any]:
        folder = self.work / "generate"
        folder.mkdir(exist_ok=True)
        result: dict[str, Any] = {}
        runs = [("exact", "vllm")] + ([("text", "openai")] if "text-path" in self.plan.arms else [])
        with vllm_server(
            self.python, self.work / "target", ["--reasoning-parser", "qwen3"], folder / "vllm.log"
        ) as url:
            self.progress.say(f"generate: vLLM up at {url}")
            for name, server in runs:
                config = self._run_config(name, url, server)
                t0 = time.monotonic()
                self.eaglewatch("run", "--headless", str(config), log=folder / f"{name}-run.log")
                status = json.loads(self.eaglewatch("status", "--db", str(folder / f"{name}.db"), "--json"))
                result[name] = {"wall_s": round(time.monotonic() - t0, 1), "status": _brief_status(status)}
                self.progress.say(f"generate: {name} run done in {result[name]['wall_s']} s")
        for name, _ in runs:
            out = folder / f"{name}-export"
            shutil.rmtree(out, ignore_errors=True)
            report = self.eaglewatch(
                "export", "--db", str(folder / f"{name}.db"), "--format", "eagle3-shards", "--out", str(out), "--json"
            )
            result[name]["export"] = _brief_export(json.loads(report))
            self.progress.say(f"generate: {name} export: {len(armsmod.read_rows(out))} rows")
        return result

    def arms(self) -> dict[str, Any]:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.work / "target")
        exact = armsmod.read_rows(self.work / "generate" / "exact-export")
        originals = {k: tuple(v) for k, v in json.loads((self.work / "prompts" / "originals.json").read_text()).items()}
        made: dict[str, list[armsmod.Row]] = {}
        for arm in self.plan.arms:
            if arm == "exact":
                made[arm] = exact
            elif arm == "reencoded":
                made[arm] = armsmod.reencoded(exact, tok)
            elif arm == "wrong-eos":
                made[arm] = armsmod.wrong_eos(
                    exact, tok.convert_tokens_to_ids(END), tok.convert_tokens_to_ids(WRONG_END)
                )
            elif arm == "off-policy":
                made[arm] = armsmod.off_policy(exact, originals, tok, END)
            elif arm == "text-path":
                made[arm] = armsmod.read_rows(self.work / "generate" / "text-export")
        result = {}
        for arm, rows in made.items():
            armsmod.write_arm(rows, self.work / "arms" / arm)
            result[arm] = armsmod.differing_share(rows, exact) | {"tokens": sum(len(r["input_ids"]) for r in rows)}
            self.progress.say(f"arms: {arm}: {result[arm]}")
        return result

    def prepare(self) -> dict[str, Any]:
        def one(arm: str) -> None:
            folder = self.work / "arms" / arm
            shutil.rmtree(folder / "prepared", ignore_errors=True)
            argv = ["-m", "speculators", "prepare-data", "--model", str(self.work / "target")]
            argv += ["--data", str(folder / "data" / "rows.jsonl"), "--output", str(folder / "prepared")]
            argv += ["--seq-length", "1024", "--no-skip-token-freq", "--num-preprocessing-workers", "1"]
            self.vllm_run(argv, folder / "prepare.log")

        self.progress.items("prepare", list(self.plan.arms), one)
        return {"arms": list(self.plan.arms)}

    def extract(self) -> dict[str, Any]:
        def one(arm: str) -> None:
            folder = self.work / "arms" / arm
            shutil.rmtree(folder / "job", ignore_errors=True)
            (folder / "job").mkdir()
            cfg = folder / "job" / "extract.toml"
            cfg.write_text(f"""
[run]
name = "extract-{arm}"
database = "{folder / "job" / "run.db"}"
[data]
[[data.datasets]]
path = "{self.work / "prompts" / "single.jsonl"}"
[model]
name = "target"
tokenizer = "{self.work / "target"}"
[[endpoints]]
name = "none"
base_url = "http://127.0.0.1:9"
[extraction]
model_path = "{self.work / "target"}"
output_dir = "{folder / "hidden"}"
gpus = 0
backend = "vllm"
python = "{self.python}"
layout = "speculators"
aux_layers = {json.dumps(AUX_LAYERS)}
layer_convention = "input"
""")
            scratch = Path(tempfile.mkdtemp(prefix="ew-dw-", dir="/tmp"))
            env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
            env |= {"TMPDIR": str(scratch), "VLLM_RPC_BASE_PATH": str(scratch), "CUDA_VISIBLE_DEVICES": ""}
            try:
                out = self.eaglewatch(
                    "extract", str(cfg), "--manifest", str(folder / "manifest.json"), "--interval", "1", "--json",
                    env=env, log=folder / "job" / "extract.log",
                )  # fmt: skip
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            job = json.loads(out)
            states = [s["state"] for s in job["shards"]]
            if states != ["done"]:
                raise SystemExit(f"extract {arm}: shards {states}; see {folder / 'job' / 'extract.log'}")

        self.progress.items("extract", list(self.plan.arms), one)
        return {"arms": list(self.plan.arms)}

    def train_one(self, name: str) -> dict[str, Any]:
        """Train drafter `name` (`<arm>-s<seed>`) unless its result is there; its figures."""
        done = self.work / "train" / name / "result.json"
        if done.exists():
            return json.loads(done.read_text())
        if True:
            arm, seed = name.rsplit("-s", 1)
            folder = self.work / "arms" / arm
            out = self.work / "train" / name
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            argv = [str(ROOT / "bench" / "dataworth" / "train_eagle3.py")]
            argv += ["--verifier-name-or-path", str(self.work / "target"), "--data-path", str(folder / "prepared")]
            argv += ["--hidden-states-path", str(folder / "hidden" / "hidden_states"), "--on-missing", "raise"]
            argv += ["--total-seq-len", str(SEQ_LEN), "--target-layer-ids", *map(str, AUX_LAYERS), "--seed", seed]
            argv += ["--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--full-attention-indices", "0"]
            # speculators' --max-steps stops the steps but not the epoch loop (each later epoch still validates and
            # saves): the epochs are sized to the steps, from the arm's tokens packed into total-seq-len batches
            tokens = json.loads(self.marker("arms").read_text())[arm]["tokens"]
            per_epoch = max(1, int(tokens * TRAIN_SHARE / SEQ_LEN))
            epochs = min(self.plan.epochs, -(-self.plan.train_steps // per_epoch))
            argv += ["--ttt-steps", str(DRAFT_TOKENS), "--epochs", str(epochs)]
            argv += ["--max-steps", str(self.plan.train_steps), "--save-path", str(out / "ckpt")]
            argv += ["--num-workers", "0", "--log-freq", "10", "--lr", str(self.plan.lr)]
            # the schedule spans the steps run, not `epochs` (its default warm-up would hold the rate near 0)
            argv += ["--scheduler-total-steps", str(self.plan.train_steps)]
            argv += ["--scheduler-warmup-steps", str(max(1, self.plan.train_steps // 10))]
            t0 = time.monotonic()
            self.vllm_run(argv, out / "train.log")
            wall = time.monotonic() - t0
            draft = _final_checkpoint(out / "ckpt")
            result = {"wall_s": round(wall, 1), "draft": str(draft)} | _train_figures(out / "train.log")
        done.write_text(json.dumps(result, indent=1))
        return result

    def eval_one(self, name: str, draft: str) -> dict[str, Any]:
        """Serve the target with drafter `name` as its EAGLE-3 draft and run `eaglewatch eval` on the held-out
        prompts, unless its summary is there; the summary."""
        folder = self.work / "eval"
        folder.mkdir(exist_ok=True)
        done = folder / f"{name}.summary.json"
        if done.exists():
            return json.loads(done.read_text())
        if True:
            spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": DRAFT_TOKENS}
            more = ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
            with vllm_server(self.python, self.work / "target", more, folder / f"{name}-vllm.log") as url:
                config = folder / f"{name}.toml"
                (folder / f"{name}.db").unlink(missing_ok=True)
                config.write_text(f"""
[run]
name = "eval-{name}"
database = "{folder / f"{name}.db"}"
[[data.datasets]]
path = "{self.work / "prompts" / "heldout.jsonl"}"
format = "openai-messages"
[model]
name = "target"
tokenizer = "{self.work / "target"}"
profile = "qwen3"
[[endpoints]]
name = "vllm-eagle3"
base_url = "{url}"
server = "vllm"
timeout_s = 600.0
[generation]
stream = false
[limits]
concurrency_max = 4
[eval]
drafter = "{name}"
num_draft_tokens = {DRAFT_TOKENS}
max_tokens = {self.plan.max_tokens}
temperature = 0.0
""")
                report = json.loads(self.eaglewatch("eval", "--headless", str(config), "--json"))
            (folder / f"{name}.json").write_text(json.dumps(report, indent=1))
            fig = report["overall"]["figures"]
            result = {k: fig.get(k) for k in ("mean_acceptance_length", "per_position_acceptance", "requests")}
            result |= {k: v for k, v in fig.items() if "ci95" in k}
            result["verdicts"] = [v["verdict"] for v in report.get("verdicts", [])]
        done.write_text(json.dumps(result, indent=1))
        return result

    def drafters(self) -> dict[str, Any]:
        """Train, then serve and evaluate, each drafter; seed by seed (every arm's seed 0 first, so a stopped run
        has a table of every arm), `table.partial.md` rewritten after each."""
        done: dict[str, dict[str, Any]] = {"train": {}, "eval": {}, "arms": json.loads(self.marker("arms").read_text())}

        def one(name: str) -> None:
            done["train"][name] = self.train_one(name)
            done["eval"][name] = self.eval_one(name, done["train"][name]["draft"])
            write_table(self.work, self.plan, done, partial=True)

        names = [f"{a}-s{s}" for s in self.plan.seeds for a in self.plan.arms]
        self.progress.items("drafters", names, one)
        return {"train": done["train"], "eval": done["eval"]}

    def run(self) -> dict[str, Any]:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "plan.json").write_text(json.dumps(asdict(self.plan), indent=1))
        self.progress.say(f"data worth: {'quick' if self.plan.quick else 'full'} plan {asdict(self.plan)}")
        done: dict[str, dict[str, Any]] = {}
        steps: dict[str, Callable[[], dict[str, Any]]] = {
            "target": self.target,
            "prompts": self.prompts,
            "generate": self.generate,
            "arms": self.arms,
            "prepare": self.prepare,
            "extract": self.extract,
            "drafters": self.drafters,
            "table": lambda: write_table(self.work, self.plan, {**done, **done["drafters"]}),
        }
        for k, name in enumerate(STAGES, 1):
            done[name] = self.stage(k, name, steps[name])
        return done


# ---- reading what the tools wrote -------------------------------------------------------------------------------


def _brief_status(status: dict[str, Any]) -> dict[str, Any]:
    """What `eaglewatch status --json` says of the run's ids: states, verdicts, what its text path measured."""
    run = status["runs"][0]
    keep = ("state", "samples", "verdicts", "verification", "measured", "suspects", "truncated", "strategies")
    return {k: run[k] for k in keep if k in run}


def _brief_export(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if isinstance(v, (int, float, str, dict)) and k != "manifest"}


def _final_checkpoint(ckpt: Path) -> Path:
    """The last epoch's checkpoint folder (speculators saves one per epoch, numbered) that holds a config.json."""
    found = [p.parent for p in ckpt.rglob("config.json")]
    if not found:
        raise SystemExit(f"training wrote no checkpoint under {ckpt}")

    def key(p: Path) -> tuple[int, str]:
        digits = re.findall(r"\d+", p.name)
        return (int(digits[-1]) if digits else -1, str(p))

    return max(found, key=key)


def _train_figures(log: Path) -> dict[str, Any]:
    """The trainer's own figures from its log: the last epoch's validation accuracies (`val/full_acc_k_epoch`: the
    share of positions whose first k+1 draft tokens are all right, on its held-out tail) and the mean step time."""
    val: dict[str, float] = {}
    steps_ms: list[float] = []
    text = log.read_text(errors="replace")
    for key, value in re.findall(r"val/(full_acc_\d+)_epoch=([0-9.e+-]+)", text):
        val[key] = float(value)  # the last epoch's wins
    for value in re.findall(r"profile/step_ms=([0-9.e+-]+)", text):
        steps_ms.append(float(value))
    # the first logged step holds the warm-up (allocation, first val): the median is the steady step
    return {"val": val, "step_ms_median": round(statistics.median(steps_ms), 1) if steps_ms else None}


# ---- the table ----------------------------------------------------------------------------------------------------


def _eval_figures(work: Path, name: str) -> dict[str, Any]:
    """`eaglewatch eval`'s overall figures for one drafter, as its report stored them."""
    return json.loads((work / "eval" / f"{name}.json").read_text())["overall"]["figures"]


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def seed_interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, low, high): a 95 % Student-t interval of the mean over seeds (None with one seed)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None, None
    half = T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def write_table(work: Path, plan: Plan, done: dict[str, Any], *, partial: bool = False) -> dict[str, Any]:
    """table.json and table.md from the stages' results (`done`: "arms", "train", "eval" and each stage's record);
    with `partial`, table.partial.* from the drafters measured so far."""
    rows = []
    for arm in plan.arms:
        names = [f"{arm}-s{s}" for s in plan.seeds if f"{arm}-s{s}" in done["eval"]]
        if not names:
            continue
        lengths = [done["eval"][n]["mean_acceptance_length"] for n in names]
        lengths = [v for v in lengths if v is not None]
        mean, low, high = seed_interval(lengths) if lengths else (None, None, None)
        boot = [_eval_figures(work, n).get("mean_acceptance_length_ci95") for n in names]
        positions = [done["eval"][n]["per_position_acceptance"] for n in names]
        per_pos = [round(statistics.mean(p[i] for p in positions if p[i] is not None), 3) for i in range(DRAFT_TOKENS)]
        vals = [done["train"][n]["val"] for n in names]
        offline = {}
        for key in sorted({k for v in vals for k in v}):
            got = [v[key] for v in vals if key in v]
            offline[key] = round(statistics.mean(got), 3)
        steps = [done["train"][n]["step_ms_median"] for n in names if done["train"][n]["step_ms_median"]]
        rows.append(
            {
                "arm": arm,
                "what": armsmod.ARMS[arm],
                "acceptance_length": round(mean, 3) if mean is not None else None,
                "interval_95": [round(low, 3), round(high, 3)] if low is not None else None,
                "per_seed": lengths,
                "per_seed_request_ci95": boot,  # eaglewatch eval's bootstrap over held-out requests, per seed
                "per_position": per_pos,
                "trainer_offline": offline,
                "token_share_differing": done["arms"][arm]["token_share_differing"],
                "samples": done["arms"][arm]["samples"],
                "samples_changed": done["arms"][arm]["samples_changed"],
                "train_step_ms": round(statistics.mean(steps), 1) if steps else None,
                "train_wall_s": round(statistics.mean(done["train"][n]["wall_s"] for n in names), 1),
            }
        )
    walls = {s: done[s].get("wall_s") for s in STAGES if isinstance(done.get(s), dict)}
    table = {"plan": asdict(plan), "rows": rows, "stage_wall_s": walls}
    stem = "table.partial" if partial else "table"
    (work / f"{stem}.json").write_text(json.dumps(table, indent=1))
    (work / f"{stem}.md").write_text(markdown(table))
    if not partial:
        print(markdown(table))
    return {"rows": len(rows)}


def markdown(table: dict[str, Any]) -> str:
    plan = table["plan"]
    lines = [
        f"{'quick' if plan['quick'] else 'full'} run: {len(plan['seeds'])} seed(s) planned, "
        f"{plan['train_steps']} training steps, {plan['single']} single-turn + {plan['conversations']} two-turn "
        f"prompts, {plan['heldout']} held-out",
        "",
        "| arm | acceptance length | 95 % interval | per position | trainer val (offline) | tokens ≠ exact "
        "| samples changed | train ms/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table["rows"]:
        if r["interval_95"]:
            iv = f"{r['interval_95'][0]:.2f}–{r['interval_95'][1]:.2f} over {len(r['per_seed'])} seeds"
        elif r["per_seed_request_ci95"] and r["per_seed_request_ci95"][0]:
            lo, hi = r["per_seed_request_ci95"][0]
            iv = f"{lo:.2f}–{hi:.2f} over requests (1 seed)"
        else:
            iv = "(1 seed)"
        pos = " / ".join(f"{p:.2f}" for p in r["per_position"])
        off = ", ".join(f"{k} {v:.2f}" for k, v in r["trainer_offline"].items() if "full_acc" in k) or "-"
        share = "-" if r["token_share_differing"] is None else f"{100 * r['token_share_differing']:.2f} %"
        lines.append(
            f"| {r['arm']} | {r['acceptance_length']:.3f} | {iv} | {pos} | {off} | {share} | "
            f"{r['samples_changed']}/{r['samples']} | {r['train_step_ms']} |"
        )
    lines += ["", "Stage wall time (s): " + ", ".join(f"{k} {v}" for k, v in table["stage_wall_s"].items() if v)]
    return "\n".join(lines) + "\n"


def vllm_python() -> str:
    named = os.environ.get("EAGLEWATCH_VLLM_PYTHON")
    if named:
        return named
    from tests.realserver.tiny_qwen3 import cache_root

    built = sorted((p.parent for p in cache_root().glob("vllm-*/.eaglewatch-stamp")), key=lambda p: p.stat().st_mtime)
    if not built:
        raise SystemExit("no vLLM environment: build it with scripts/vllm_venv.sh and set EAGLEWATCH_VLLM_PYTHON")
    return str(built[-1] / "bin" / "python")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path, help="work folder (resumable: stages whose outputs exist are skipped)")
    parser.add_argument("--quick", action="store_true", help="exact and off-policy arms, one seed, fewer steps")
    parser.add_argument("--arms", help=f"comma-separated arms ({', '.join(armsmod.ARMS)})")
    parser.add_argument("--seeds", type=int, help="seeds per arm (full: 3)")
    parser.add_argument("--train-steps", type=int, help="optimizer steps per drafter")
    parser.add_argument("--lr", type=float, help="the trainer's learning rate")
    args = parser.parse_args(argv)
    plan = make_plan(args)
    work = args.work.resolve()
    planned = work / "plan.json"
    if planned.exists() and json.loads(planned.read_text()) != json.loads(json.dumps(asdict(plan))):
        raise SystemExit(f"{work} holds a run with another plan ({planned}); use another work folder")
    Bench(work, plan, vllm_python()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
