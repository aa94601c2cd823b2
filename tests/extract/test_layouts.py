"""Hidden-state layouts per consumer on a tiny random model: each loads through its consumer's own loader
(SpecForge, speculators, Model-Optimizer; tests/export/trainers/consumers.py) with tensors equal to eaglewatch's packed
output; the speculators layout's last slot is the pre-norm state (the norm test); a mixed folder is refused."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from app.errors import InputError
from app.extract.layouts import LAYOUT_FILE
from app.extract.manifest import read_manifest, read_shard
from app.extract.output import load_shard_output, shard_data_path
from app.extract.progress_lines import ProgressLog
from tests.export.trainers.env import run_consumer

from .conftest import make_samples, write_shards

torch = pytest.importorskip("torch")

from app.extract.runner import ExtractOptions, run_extraction  # noqa: E402


def _extract(manifest: Path, out: Path, model: Path, layout: str, prepared: Path | None = None) -> None:
    options = ExtractOptions(
        model_path=model, out_dir=out, batch_tokens=96, device="cpu", layout=layout, speculators_prepared=prepared
    )
    run_extraction(manifest, [0, 1], options, ProgressLog(io.StringIO()))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(
        tmp_path_factory.mktemp("layouts") / "export", [make_samples(6, seed=11), make_samples(4, seed=12)]
    )


def _prepare(manifest: Path, rows: Path, prepared: Path, tokenizer_dir: Path, skip: int = 0) -> Path:
    """speculators' own `load_and_preprocess_dataset` (what `speculators prepare-data` runs: shuffled) over the
    shards' rows, the first `skip` rows of the first shard left out, saved to `prepared`."""
    rows.mkdir(parents=True, exist_ok=True)
    for entry in read_manifest(manifest).shards:
        lines = entry.path.read_text().splitlines(keepends=True)
        (rows / entry.path.name).write_text("".join(lines[skip if entry.index == 0 else 0 :]))
    run_consumer("speculators-data", rows, tokenizer_dir, prepared, result=prepared.parent / "prepared-rows.pt")
    return prepared


@pytest.fixture(scope="module")
def prepared(shards, tmp_path_factory, sample_tokenizer_dir) -> Path:
    base = tmp_path_factory.mktemp("prepared")
    return _prepare(shards, base / "rows", base / "prepared", sample_tokenizer_dir)


@pytest.fixture(scope="module")
def packed(shards, tiny_model, tmp_path_factory):
    """eaglewatch's packed output, in export order: what every consumer layout must hold."""
    out = tmp_path_factory.mktemp("packed")
    _extract(shards, out, tiny_model, "packed")
    return [s for shard in (0, 1) for s in load_shard_output(shard_data_path(out, shard))]


def _layout_dir(shards, tiny_model, tmp_path, layout, prepared=None):
    out = tmp_path / layout
    _extract(shards, out, tiny_model, layout, prepared)
    record = json.loads((out / LAYOUT_FILE).read_text())
    assert record["layout"] == layout and record["aux_layers_output_convention"] == [1, 3, 4]
    return out, record


def _lm_head_argmax_is_the_models(reference, ids, state) -> None:
    """SpecForge's TargetHead (specforge/modeling/target/target_head.py: `self.fc(hidden_states)`, no norm)
    and Model-Optimizer (`hidden_states_prenorm` False: no norm re-applied) put the LM head straight on the
    stored last state, so it must be post-norm: the head over it gives the model's own argmax."""
    with torch.no_grad():
        own = reference(ids[None]).logits[0].argmax(-1)
        assert torch.equal(reference.lm_head(state).argmax(-1), own)


def test_specforge_offline_dataset_loads_the_ckpt_files(shards, packed, tiny_model, tiny_reference, tmp_path):
    out, record = _layout_dir(shards, tiny_model, tmp_path, "specforge")
    assert record["last_hidden_state"] == "post_norm"
    run_consumer("specforge-hs", out, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert sorted(got) == sorted(f"rows_{a}-{b}/data_{k}.ckpt" for a, b in ((0, 6), (6, 10)) for k in range(a, b))
    for k, want in enumerate(packed):
        name = f"rows_{0 if k < 6 else 6}-{6 if k < 6 else 10}/data_{k}.ckpt"
        raw, item = got[name]["raw"], got[name]["item"]
        assert sorted(raw) == ["aux_hidden_state", "hidden_state", "input_ids", "loss_mask"]
        assert torch.equal(raw["input_ids"], want["input_ids"]) and torch.equal(raw["loss_mask"], want["loss_mask"])
        assert torch.equal(raw["hidden_state"][0], want["hidden_states"])
        assert torch.equal(raw["aux_hidden_state"][0], want["aux_hidden_states"])
        # what the trainer sees (OfflineEagle3Dataset.process_data): target = last, hidden_state = aux
        assert torch.equal(item["target"][0], want["hidden_states"])
        assert torch.equal(item["hidden_state"][0], want["aux_hidden_states"])
        assert item["loss_mask"][0].tolist() == [*want["loss_mask"].tolist()[:-1], 0]  # SpecForge zeroes the last
        _lm_head_argmax_is_the_models(tiny_reference, want["input_ids"], item["target"][0])


def test_speculators_trainer_dataset_loads_the_hs_files(shards, packed, prepared, tiny_model, tiny_reference, tmp_path):
    """prepare-data shuffles the rows; the files are numbered by the prepared rows, found by their ids, so
    speculators' `ArrowDataset` loads every one with no `SampleUnavailable`."""
    out, record = _layout_dir(shards, tiny_model, tmp_path, "speculators", prepared)
    assert record["last_hidden_state"] == "pre_norm"
    run_consumer("speculators-hs", prepared, out, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert got.pop("unavailable") == []
    assert sorted(got) == list(range(len(packed)))
    by_ids = {tuple(p["input_ids"].tolist()): p for p in packed}
    assert [tuple(got[k]["input_ids"].tolist()) for k in sorted(got)] != [
        tuple(p["input_ids"].tolist()) for p in packed
    ]
    for k in sorted(got):
        item = got[k]
        want = by_ids[tuple(item["input_ids"].tolist())]
        assert torch.equal(item["loss_mask"], want["loss_mask"])
        assert torch.equal(item["hidden_states"], want["aux_hidden_states"])
        # the verifier's last state BEFORE the final norm: normalised, it is the packed (post-norm) state
        with torch.no_grad():
            normed = tiny_reference.model.norm(item["verifier_last_hidden_states"])
        torch.testing.assert_close(normed, want["hidden_states"], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(item["verifier_last_hidden_states"], want["hidden_states"], atol=1e-3)


def test_modelopt_offline_dataset_loads_the_pt_files(shards, packed, tiny_model, tiny_reference, tmp_path):
    out, record = _layout_dir(shards, tiny_model, tmp_path, "modelopt")
    assert record["last_hidden_state"] == "post_norm"
    run_consumer("modelopt-hs", out, result=tmp_path / "r.pt")
    got = torch.load(tmp_path / "r.pt")
    assert sorted(got) == sorted(s["sample_id"] for s in packed)
    for want in packed:
        item = got[want["sample_id"]]
        assert torch.equal(item["input_ids"], want["input_ids"]) and torch.equal(item["loss_mask"], want["loss_mask"])
        assert torch.equal(item["base_model_hidden_states"], want["hidden_states"])
        assert torch.equal(item["aux_hidden_states"], want["aux_hidden_states"])
        assert item["base_hidden_prenorm"] is False
        assert item["labels"][:-1].tolist() == want["input_ids"][1:].tolist()
        _lm_head_argmax_is_the_models(tiny_reference, want["input_ids"], item["base_model_hidden_states"])


def test_speculators_last_slot_normalised_gives_the_models_own_next_token(
    shards, prepared, tiny_model, tiny_reference, tmp_path
):
    """The norm test: speculators applies the verifier's norm and LM head to the last slot itself, so the
    slot must be pre-norm; norm + LM head over it must give the model's own argmax on every token."""
    from safetensors.torch import load_file

    out = tmp_path / "speculators"
    _extract(shards, out, tiny_model, "speculators", prepared)
    samples = {s.input_ids: s for e in read_manifest(shards).shards for s in read_shard(e)}
    files = sorted((out / "hidden_states").glob("hs_*.safetensors"))
    assert len(files) == len(samples)
    norm, head = tiny_reference.model.norm, tiny_reference.lm_head
    for path in files:
        saved = load_file(str(path))
        sample = samples[tuple(saved["token_ids"].tolist())]
        assert (
            saved["hidden_states"].shape == (len(sample.input_ids), 4, 64)
            and saved["hidden_states"].dtype == torch.float32
        )
        with torch.no_grad():
            own = tiny_reference(torch.tensor([sample.input_ids])).logits[0].argmax(-1)
            ours = head(norm(saved["hidden_states"][:, -1])).argmax(-1)
        assert torch.equal(ours, own), sample.sample_id


def test_a_folder_holds_one_layout(shards, tiny_model, tmp_path):
    out = tmp_path / "hs"
    _extract(shards, out, tiny_model, "specforge")
    with pytest.raises(InputError, match=r"done in layout .specforge., not .packed."):
        run_extraction(
            shards,
            [0, 1],
            ExtractOptions(
                model_path=tiny_model, out_dir=out, device="cpu", layout="packed", batch_tokens=96, aux_layers=(1, 3, 4)
            ),
            ProgressLog(io.StringIO()),
        )
    with pytest.raises(InputError, match=r"done with aux layers \[1, 3, 4\]"):
        run_extraction(
            shards,
            [0],
            ExtractOptions(model_path=tiny_model, out_dir=out, device="cpu", layout="specforge", aux_layers=(1, 2, 5)),
            ProgressLog(io.StringIO()),
        )
    (out / "shard_1.done").unlink()  # shard 1 to do again: the folder record refuses other layers
    with pytest.raises(
        InputError, match=r"another kind \(aux_layers_output_convention: folder \[1, 3, 4\] vs now \[1, 2, 5\]"
    ):
        run_extraction(
            shards,
            [1],
            ExtractOptions(model_path=tiny_model, out_dir=out, device="cpu", layout="specforge", aux_layers=(1, 2, 5)),
            ProgressLog(io.StringIO()),
        )
    (out / LAYOUT_FILE).unlink()  # files of a layout without the record are refused too
    (out / "shard_0.done").unlink()
    with pytest.raises(InputError, match="holds hidden-state files without"):
        run_extraction(
            shards,
            [0, 1],
            ExtractOptions(model_path=tiny_model, out_dir=out, device="cpu", layout="modelopt", batch_tokens=96),
            ProgressLog(io.StringIO()),
        )


@pytest.mark.parametrize("layout", ["specforge", "speculators", "modelopt"])
def test_the_disk_estimate_covers_each_layout(shards, tiny_model, tmp_path, layout, request):
    from app.extract.disk_budget import estimate_output_bytes

    out = tmp_path / layout
    _extract(shards, out, tiny_model, layout, request.getfixturevalue("prepared") if layout == "speculators" else None)
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    estimate = estimate_output_bytes(shards, tiny_model, None, "fp32", per_sample_files=True)
    assert written <= estimate <= 4 * written + 2 * 64 * 1024


def test_the_speculators_layout_needs_the_prepared_dataset(shards, tiny_model, tmp_path):
    """Without speculators' prepared dataset there is no telling which `hs_<k>` a sample is (prepare-data
    shuffles): refused before the model loads, with the command that makes it."""
    with pytest.raises(
        InputError,
        match=r"no speculators prepared dataset.*speculators prepare-data .*--output "
        r".*prepared --seq-length",
    ):
        _extract(shards, tmp_path / "hs", tiny_model, "speculators")
    assert not (tmp_path / "hs" / "hidden_states").exists()


def test_a_sample_the_prepared_dataset_lacks_is_refused(shards, tiny_model, tmp_path, sample_tokenizer_dir):
    """A prepared dataset without one of the export's rows (cut or filtered by prepare-data, or another
    export's): the sample is named and nothing is written, instead of a trainer that silently drops it."""
    first = read_shard(read_manifest(shards).shard(0))[0]
    prepared = _prepare(shards, tmp_path / "rows", tmp_path / "prepared", sample_tokenizer_dir, skip=1)
    with pytest.raises(InputError, match=rf"1 sample\(s\) .* in no row .*first: '{first.sample_id}'.*--seq-length"):
        _extract(shards, tmp_path / "hs", tiny_model, "speculators", prepared)
    assert not list((tmp_path / "hs").rglob("hs_*"))


def test_samples_with_the_same_ids_share_their_speculators_files(tiny_model, tmp_path, sample_tokenizer_dir):
    """The same prompt answered the same way twice (a regenerated dataset's duplicates): both samples are every
    prepared row holding those ids, so the shard finishes with one file per row, not a second rename of one."""
    rows = make_samples(3, seed=21)
    rows.append(dict(rows[0], id="s21-again"))
    shards = write_shards(tmp_path / "export", [rows])
    prepared = _prepare(shards, tmp_path / "rows", tmp_path / "prepared", sample_tokenizer_dir)
    options = ExtractOptions(
        model_path=tiny_model, out_dir=tmp_path / "hs", batch_tokens=96, device="cpu", layout="speculators",
        speculators_prepared=prepared,
    )  # fmt: skip
    run_extraction(shards, [0], options, ProgressLog(io.StringIO()))
    files = sorted((tmp_path / "hs" / "hidden_states").glob("hs_*.safetensors"))
    assert len(files) == 4
    assert not list((tmp_path / "hs").rglob("*.partial-*"))
