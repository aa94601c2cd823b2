"""From export to a trained drafter, on the CPU: eaglewatch's rows and hidden states (the built-in extractor on a
tiny random Llama whose vocabulary is the sample tokenizer's) go through each trainer's own code.

- speculators: the real `speculators prepare-data` command (it shuffles), the built-in extractor numbering
  `hs_<k>` by the prepared rows, then speculators' trainer dataset and train loader: every sample loads, ids,
  masks and hidden states equal eaglewatch's, the reduced draft vocabulary applied. Its `train` needs an
  accelerator: the optimizer steps run only where one is, else the test skips with the trainer's own error.
- SpecForge: its offline reader, EAGLE-3 normaliser and collator give the first batch; its vocabulary count
  equals eaglewatch's; its draft loads eaglewatch's mapping. Its EAGLE-3 step imports a Triton loss kernel: the
  optimizer steps skip with that import error where Triton or CUDA is missing.
- Model-Optimizer: a few optimizer steps of a tiny EAGLE-3 drafter through its recipe, model conversion, offline
  dataset, collator and transformers' Trainer, on the CPU: the loss decreases and the first batch equals
  eaglewatch's.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from app.export import Export, ExportOptions, ExportPolicy
from app.extract.manifest import read_manifest, read_shard
from tests.export.trainers.env import proven, run_consumer, run_trainer_cli, trainer_site

torch = pytest.importorskip("torch")

from app.extract.output import load_shard_output, shard_data_path  # noqa: E402
from app.extract.progress_lines import ProgressLog  # noqa: E402
from app.extract.runner import ExtractOptions, run_extraction  # noqa: E402

DRAFT_VOCAB = 512
SMOKE_MAX_LENGTH = 1024  # rows up to this many tokens (CPU memory: logits are rows x tokens x vocabulary)


def _extract(manifest: Path, out: Path, model: Path, layout: str) -> None:
    shards = [e.index for e in read_manifest(manifest).shards]
    run_extraction(
        manifest,
        shards,
        ExtractOptions(model_path=model, out_dir=out, batch_tokens=4096, device="cpu", layout=layout),
        ProgressLog(io.StringIO()),
    )


@pytest.fixture(scope="module")
def target(tmp_path_factory, sample_tokenizer_dir) -> Path:
    """A random 8-layer Llama (hidden 64) over the sample tokenizer's vocabulary, with the tokenizer files (the
    trainers load the verifier's processor and config from its folder)."""
    trainer_site()
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    path = tmp_path_factory.mktemp("tiny-target")
    vocab = len(AutoTokenizer.from_pretrained(str(sample_tokenizer_dir)))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    for f in sample_tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def run_db(tmp_path_factory, sample_reference, sample_tokenizer_dir, sample_cases):
    from tests.export.conftest import build_run_db

    return build_run_db(
        tmp_path_factory.mktemp("smoke-run") / "run.db",
        sample_reference,
        sample_tokenizer_dir,
        sample_cases,
        limit=40,
        mismatches=2,
    )


@pytest.fixture(scope="module")
def shards(run_db, target, tmp_path_factory):
    """The eagle3-shards export (rows up to SMOKE_MAX_LENGTH tokens), its draft vocabulary from `eaglewatch vocab`,
    and eaglewatch's packed hidden states: what every trainer's input must equal."""
    from app.cli import main

    out = tmp_path_factory.mktemp("smoke") / "shards"
    Export(
        run_db.db, out, "eagle3-shards", ExportOptions(shard_size=8, policy=ExportPolicy(max_length=SMOKE_MAX_LENGTH))
    ).run()
    assert main(["vocab", str(out), "--size", str(DRAFT_VOCAB), "--model", str(target)]) == 0
    packed = out.parent / "packed"
    _extract(out, packed, target, "packed")
    states = {}
    for entry in read_manifest(out).shards:
        for s in load_shard_output(shard_data_path(packed, entry.index)):
            states[s["sample_id"]] = s
    return out, states


def _by_ids(states: dict) -> dict[tuple[int, ...], dict]:
    return {tuple(s["input_ids"].tolist()): s for s in states.values()}


@pytest.fixture(scope="module")
def speculators_route(run_db, target, shards, tmp_path_factory):
    """`--format speculators`, the real `speculators prepare-data` into OUT/prepared with the manifest's
    --seq-length, then the built-in extractor with layout speculators (it reads OUT/prepared)."""
    out = tmp_path_factory.mktemp("smoke-spec") / "spec"
    Export(
        run_db.db, out, "speculators", ExportOptions(shard_size=8, policy=ExportPolicy(max_length=SMOKE_MAX_LENGTH))
    ).run()
    settings = json.loads((out / "manifest.json").read_text())["train"]["settings"]["speculators"]
    proc = run_trainer_cli(
        "speculators",
        "prepare-data",
        "--model",
        target,
        "--data",
        out / "data",
        "--output",
        out / "prepared",
        "--seq-length",
        settings["prepare-data --seq-length"],
        "--no-skip-token-freq",
        "--num-preprocessing-workers",
        "1",
        scratch=out.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    hs = out.parent / "hidden"
    _extract(out, hs, target, "speculators")
    return out, hs, settings


def test_speculators_loads_every_shuffled_sample_with_its_hidden_states(speculators_route, shards, target, tmp_path):
    """speculators' `ArrowDataset` over the shuffled prepared rows, `FileTransfer` reading `hs_<k>`,
    on_missing="raise": no `SampleUnavailable`, and every sample's ids, mask and aux states equal eaglewatch's;
    its last slot is the pre-norm state (the model's norm over it gives eaglewatch's post-norm state)."""
    from transformers import AutoModelForCausalLM

    out, hs, _ = speculators_route
    _, states = shards
    run_consumer("speculators-hs", out / "prepared", hs, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert got.pop("unavailable") == []
    ours = _by_ids(states)
    assert len(got) == len(ours)
    norm = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).model.norm
    for k, item in got.items():
        want = ours[tuple(item["input_ids"].tolist())]
        assert torch.equal(item["loss_mask"], want["loss_mask"]), k
        assert torch.equal(item["hidden_states"], want["aux_hidden_states"]), k
        with torch.no_grad():
            torch.testing.assert_close(
                norm(item["verifier_last_hidden_states"]), want["hidden_states"], rtol=1e-4, atol=1e-5
            )
    proven(
        f"speculators (prepare-data CLI shuffled, ArrowDataset + FileTransfer, on_missing=raise): {len(got)}/"
        f"{len(ours)} samples loaded, 0 SampleUnavailable, ids, masks and hidden states equal"
    )


def test_speculators_train_applies_the_draft_vocabulary_and_feeds_eaglewatchs_first_batch(
    speculators_route, shards, target, tmp_path
):
    """What `speculators train` builds before its first step: eaglewatch's d2t-N/t2d-N files load at the size
    asked (and equal what it regenerates from eaglewatch's token_freq.pt), and every document of the first packed
    batch of its train loader (eagle3 `shift_batch`) is an eaglewatch sample, shifted: ids, mask, states."""
    import numpy as np

    out, hs, settings = speculators_route
    vocab_dir = shards[0] / "vocab"
    run_consumer(
        "speculators-train-batch",
        out / "prepared",
        hs,
        vocab_dir,
        DRAFT_VOCAB,
        target,
        settings["train --total-seq-len"],
        result=tmp_path / "r.pt",
    )
    got = torch.load(tmp_path / "r.pt")
    d2t, t2d = np.load(vocab_dir / f"d2t-{DRAFT_VOCAB}.npy"), np.load(vocab_dir / f"t2d-{DRAFT_VOCAB}.npy")
    assert got["size"] == DRAFT_VOCAB == len(d2t) and int(t2d.sum()) == DRAFT_VOCAB
    assert np.array_equal(got["d2t"].numpy(), d2t) and np.array_equal(got["t2d"].numpy(), t2d)
    assert np.array_equal(got["regen_d2t"].numpy(), d2t) and np.array_equal(got["regen_t2d"].numpy(), t2d)
    batch = got["batch"]
    ours = {tuple(s["input_ids"].tolist()[1:]): s for s in shards[1].values()}
    docs = batch["document_ids"][0]
    checked = 0
    for d in range(int(docs.max()) + 1):
        where = (docs == d).nonzero().flatten()
        ids = tuple(batch["input_ids"][0, where].tolist())
        want = ours[ids]  # shift_batch: input ids and mask from position 1, states up to the last but one
        assert torch.equal(batch["loss_mask"][0, where].to(torch.long), want["loss_mask"][1:])
        assert torch.equal(batch["hidden_states"][0, where], want["aux_hidden_states"][:-1])
        checked += 1
    assert checked >= 1
    proven(
        f"speculators train setup: draft vocabulary {DRAFT_VOCAB} from eaglewatch's d2t/t2d (and from its "
        f"token_freq.pt), first packed batch: {checked} documents equal eaglewatch's samples"
    )


def test_speculators_training_steps(speculators_route, shards, target, tmp_path):
    """`speculators train` itself, a few steps: it runs only on an accelerator; without one the test skips with
    the trainer's own error, measured here, never assumed."""
    out, hs, settings = speculators_route
    vocab_dir = shards[0] / "vocab"
    proc = run_trainer_cli(
        "speculators",
        "train",
        "--verifier-name-or-path",
        target,
        "--data-path",
        out / "prepared",
        "--hidden-states-path",
        hs / "hidden_states",
        "--save-path",
        tmp_path / "ckpt",
        "--on-missing",
        "raise",
        "--total-seq-len",
        settings["train --total-seq-len"],
        "--draft-vocab-size",
        DRAFT_VOCAB,
        "--d2t-path",
        vocab_dir / f"d2t-{DRAFT_VOCAB}.npy",
        "--t2d-path",
        vocab_dir / f"t2d-{DRAFT_VOCAB}.npy",
        "--epochs",
        "1",
        "--max-steps",
        "4",
        "--num-workers",
        "0",
        scratch=tmp_path,
    )
    lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
    if proc.returncode != 0 and any("accelerator" in x for x in lines):
        reason = next(x for x in lines if "accelerator" in x).strip(" │")
        pytest.skip(f"speculators train needs an accelerator (none here): {reason}")
    assert proc.returncode == 0, "\n".join(lines[-40:])


@pytest.fixture(scope="module")
def specforge_route(shards, target):
    out, _ = shards
    hs = out.parent / "hidden-specforge"
    _extract(out, hs, target, "specforge")
    return hs


def test_specforge_offline_batch_vocab_and_draft(specforge_route, shards, tmp_path):
    """SpecForge's offline path with the manifest's data.max_length: its reader lists every sample's file, its
    EAGLE-3 normaliser and collator give eaglewatch's ids, mask (SpecForge zeroes the last position: nothing
    follows it) and states; the loss-token counts it derives its vocabulary from equal eaglewatch's, and the
    mapping it makes of them and eaglewatch's file loaded into its draft agree at the size asked."""
    import numpy as np

    out, states = shards
    length = json.loads((out / "manifest.json").read_text())["train"]["settings"]["specforge"]["data.max_length"]
    run_consumer(
        "specforge-offline-batch", specforge_route, out / "vocab", DRAFT_VOCAB, length, result=tmp_path / "r.pt"
    )
    got = torch.load(tmp_path / "r.pt")
    assert len(got["files"]) == len(states)
    batch = got["batch"]
    ours = _by_ids(states)
    for row in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][row].sum())
        want = ours[tuple(batch["input_ids"][row, :n].tolist())]
        assert batch["loss_mask"][row, :n].tolist() == [*want["loss_mask"].tolist()[:-1], 0]
        assert torch.equal(batch["target"][row, :n], want["hidden_states"])
        assert torch.equal(batch["hidden_state"][row, :n], want["aux_hidden_states"])
    freq = torch.load(out / "vocab" / "token_freq.pt", weights_only=True)
    assert got["counts"] == freq
    d2t = np.load(out / "vocab" / f"d2t-{DRAFT_VOCAB}.npy")
    assert np.array_equal(got["draft_d2t"].numpy(), d2t) and int(got["draft_t2d"].sum()) == DRAFT_VOCAB
    # SpecForge's own choice (Counter.most_common: ties in first-seen order) keeps the same tokens above the
    # boundary count; only ties at the boundary may pick other ids
    ours_ids = set((np.arange(DRAFT_VOCAB) + d2t).tolist())
    theirs = set((torch.arange(DRAFT_VOCAB) + got["their_d2t"]).tolist())
    boundary = sorted(freq.values(), reverse=True)[DRAFT_VOCAB - 1] if len(freq) >= DRAFT_VOCAB else 0
    assert {t for t in ours_ids if freq.get(t, 0) > boundary} == {t for t in theirs if freq.get(t, 0) > boundary}
    proven(
        f"specforge offline (data.hidden_states_path, data.max_length={length}): {len(got['files'])}/{len(states)} "
        "files listed, first batch equal (last position zeroed by SpecForge), vocabulary counts equal, draft "
        f"loads eaglewatch's mapping at {DRAFT_VOCAB}"
    )


def test_specforge_training_steps(tmp_path):
    """SpecForge's EAGLE-3 optimizer step, where it can run: its loss is a Triton kernel (specforge/core/loss.py),
    so without Triton and CUDA the test skips with the import error, measured here, never assumed."""
    run_consumer("specforge-train-step", result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    if not got["runs"]:
        pytest.skip(f"SpecForge's EAGLE-3 training step cannot run here: {got['error']}")
    pytest.fail("SpecForge's training step can run here (CUDA and Triton present): a GPU smoke training is due")


@pytest.fixture(scope="module")
def modelopt_route(shards, target):
    out, _ = shards
    hs = out.parent / "hidden-modelopt"
    _extract(out, hs, target, "modelopt")
    return hs


def test_modelopt_trains_a_tiny_drafter_on_cpu_and_its_loss_decreases(modelopt_route, shards, target, tmp_path):
    """Model-Optimizer's own offline EAGLE-3 training, a few optimizer steps on the CPU over eaglewatch's .pt files
    with the manifest's training_seq_len, answer_only_loss and eaglewatch's d2t-N.pt as its draft vocab cache:
    the loss decreases, the draft's d2t is eaglewatch's, and the first batch the Trainer's dataloader gave
    equals eaglewatch's ids, masks and hidden states."""
    import numpy as np

    out, states = shards
    settings = json.loads((out / "manifest.json").read_text())["train"]["settings"]["modelopt"]
    length = settings["training.training_seq_len"]
    steps = 6
    run_consumer(
        "modelopt-train",
        target,
        modelopt_route,
        out / "vocab",
        DRAFT_VOCAB,
        length,
        steps,
        result=tmp_path / "r.pt",
        overlay="modelopt-train",
    )
    got = torch.load(tmp_path / "r.pt")
    assert got["mode"] == "offline" and got["answer_only_loss"] is True
    losses = got["losses"]
    assert len(losses) == steps and losses[-1] < losses[0], losses
    assert np.array_equal(got["draft_d2t"].numpy(), np.load(out / "vocab" / f"d2t-{DRAFT_VOCAB}.npy"))
    batch = got["batch"]
    ours = {tuple(s["input_ids"].tolist()): s for s in states.values()}
    for row in range(batch["input_ids"].shape[0]):
        ids = batch["input_ids"][row].tolist()
        want = next(s for key, s in ours.items() if tuple(ids[: len(key)]) == key and not any(ids[len(key) :]))
        n = len(want["input_ids"])
        assert batch["loss_mask"][row, :n].tolist() == want["loss_mask"].tolist()
        assert torch.equal(batch["base_model_hidden_states"][row, :n], want["hidden_states"])
        assert torch.equal(batch["aux_hidden_states"][row, :n], want["aux_hidden_states"])
    proven(
        f"modelopt offline training (CPU, transformers {got['transformers']}): {steps} steps, loss "
        f"{losses[0]:.3f} -> {losses[-1]:.3f}, draft vocab cache d2t-{DRAFT_VOCAB}.pt applied, first batch equal"
    )


def test_the_eval_split_extracts_to_its_own_folder(run_db, target, tmp_path):
    """`--eval-fraction`: OUT/eval is an export of its own; extracted with layout specforge into a second folder it
    is what SpecForge's data.eval_hidden_states_path lists: the held-out samples only, none of the training ones."""
    out = tmp_path / "split"
    report = Export(
        run_db.db, out, "eagle3-shards", ExportOptions(eval_fraction=0.3, policy=ExportPolicy(max_length=600))
    ).run()
    assert 0 < report.eval_exported < report.exported
    train_ids = {s.sample_id for e in read_manifest(out).shards for s in read_shard(e)}
    eval_ids = {s.sample_id for e in read_manifest(out / "eval").shards for s in read_shard(e)}
    assert not train_ids & eval_ids and len(eval_ids) == report.eval_exported
    _extract(out / "eval", tmp_path / "hidden-eval", target, "specforge")
    files = sorted((tmp_path / "hidden-eval").rglob("*.ckpt"))
    assert len(files) == len(eval_ids)
    assert {torch.load(f, weights_only=True)["input_ids"].shape[0] for f in files} == {
        len(s.input_ids) for e in read_manifest(out / "eval").shards for s in read_shard(e)
    }
