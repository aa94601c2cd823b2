"""Load eaglewatch's outputs through the trainers' own loader functions (run by tests/export/trainers/env.py in the
trainer environment). Usage: consumers.py CHECK ARGS... RESULT.pt — RESULT gets what the loader returned,
stdout's last line a JSON summary.

Where a consumer's entry point needs a GPU server (SpecForge's and speculators' hidden-state scripts, their
trainers), the function it calls underneath is called instead, as named per check.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def specforge_text(export_dir: str, tokenizer_dir: str) -> dict:
    """SpecForge `build_eagle3_dataset(..., is_preformatted=True)` maps `preprocess_conversations` over the
    rows' `text` (specforge/data/preprocessing.py); called here per row with the manifest's data settings."""
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import TEMPLATE_REGISTRY

    manifest = json.loads((Path(export_dir) / "manifest.json").read_text())
    data = manifest["specforge"]["data"]
    rows = _jsonl(Path(export_dir) / data["train_data_path"])
    tok = _hf_tokenizer(tokenizer_dir)
    template = TEMPLATE_REGISTRY.get(data["chat_template"])
    out = preprocess_conversations(tok, [r["text"] for r in rows], template, data["max_length"],
                                   is_preformatted=data["is_preformatted"],
                                   train_only_last_turn=data["train_only_last_turn"], tools=[[] for _ in rows])
    return {r["id"]: {"input_ids": ids[0].tolist(), "loss_mask": mask[0].tolist()}
            for r, ids, mask in zip(rows, out["input_ids"], out["loss_mask"], strict=True)}


def specforge_text_templates(export_dir: str, tokenizer_dir: str) -> dict:
    """The same `preprocess_conversations` call over the rows' `text` with every template SpecForge registers
    (`TEMPLATE_REGISTRY`, what `data.chat_template` names), last turn only and every turn: template name ->
    {"last" | "all": {id: (input_ids, loss_mask) or the error}}."""
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import TEMPLATE_REGISTRY

    manifest = json.loads((Path(export_dir) / "manifest.json").read_text())
    rows = _jsonl(Path(export_dir) / manifest["specforge"]["data"]["train_data_path"])
    tok = _hf_tokenizer(tokenizer_dir)
    out: dict = {}
    for name in TEMPLATE_REGISTRY.get_all_template_names():
        template = TEMPLATE_REGISTRY.get(name)
        out[name] = {}
        for key, last in (("last", True), ("all", False)):
            try:
                got = preprocess_conversations(tok, [r["text"] for r in rows], template, 10**6, is_preformatted=True,
                                               train_only_last_turn=last, tools=[[] for _ in rows])
                out[name][key] = {r["id"]: (ids[0].to(torch.int32), mask[0].to(torch.int8))
                                  for r, ids, mask in zip(rows, got["input_ids"], got["loss_mask"], strict=True)}
            except Exception as exc:  # a template this text cannot go through at all
                out[name][key] = f"{type(exc).__name__}: {exc}"
    return out


def specforge_prompts(data_file: str) -> dict:
    """SpecForge's online trainer reads `data.prompts_path` through `prepare_prompt_tasks`: pre-tokenized
    `input_ids` + `loss_mask` rows pass without re-tokenisation (specforge/data/prompt_builder.py)."""
    from specforge.data.prompt_builder import prepare_prompt_tasks

    rows = _jsonl(Path(data_file))
    tasks = prepare_prompt_tasks(data_file, None, chat_template=None, max_length=10**6, is_preformatted=False,
                                 train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None)
    got = [t["payload"] for t in tasks]
    return {r["id"]: {"input_ids": list(p["input_ids"]), "loss_mask": list(p["loss_mask"])}
            for r, p in zip(rows, got, strict=True)}


def specforge_hs(hs_dir: str) -> dict:
    """SpecForge's offline trainer: `build_offline_eagle3_dataset(hidden_states_path)` (lists `*.ckpt`), each
    file opened as `OfflineEagle3Dataset._open_file` does and normalised by `__getitem__` (`process_data`)."""
    from specforge.data.preprocessing import build_offline_eagle3_dataset

    dataset = build_offline_eagle3_dataset(hs_dir, max_len=10**6)
    out = {}
    for i, path in enumerate(dataset.datapaths):
        raw = dataset._open_file(i)
        item = dataset[i]
        out[str(Path(path).relative_to(hs_dir))] = {
            "raw": {k: v.clone() for k, v in raw.items()},
            "item": {k: v.clone() for k, v in item.items()},
        }
    return out


def speculators_data(data_dir: str, tokenizer_dir: str, prepared: str) -> dict:
    """speculators `scripts/prepare_data.py` calls `load_and_preprocess_dataset` (load_raw_dataset over the
    folder: every *.json/*.jsonl, then build_speculator_training_dataset, shuffled with --seed) and saves it;
    the same with the shuffle left out (`build_speculator_training_dataset` alone) is saved to `prepared`
    so its rows keep the export order that hidden states from `--layout speculators` are numbered by."""
    from speculators.data_generation.preprocessing import (
        build_speculator_training_dataset,
        load_and_preprocess_dataset,
        load_processor,
        load_raw_dataset,
    )

    shuffled, _ = load_and_preprocess_dataset(tokenizer_dir, [data_dir], seq_length=10**6, build_dataset_num_proc=1,
                                              seed=0)
    raw, _ = load_raw_dataset(data_dir)
    ordered = build_speculator_training_dataset(raw, load_processor(tokenizer_dir), max_length=10**6, num_proc=1)
    ordered.save_to_disk(prepared)
    return {
        "shuffled": [{"input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist(),
                      "seq_len": int(r["seq_len"])} for r in shuffled],
        "ordered": [{"input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist()} for r in ordered],
    }


def speculators_hs(prepared: str, hs_dir: str) -> dict:
    """speculators' trainer dataset `ArrowDataset` (speculators/train/data.py) over the prepared rows, hidden
    states from `hs_connectors.FileTransfer` (`hs_<k>.safetensors`), missing files an error."""
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    dataset = ArrowDataset(max_len=10**6, datapath=prepared, transfer=FileTransfer(Path(hs_dir) / "hidden_states"),
                           on_missing="raise", hidden_states_dtype=torch.float32)
    out = {}
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, dict):
            raise SystemExit(f"sample {i}: speculators could not use it: {getattr(item, 'reason', item)}")
        out[i] = {k: v.clone() for k, v in item.items()}
    return out


def modelopt_hs(hs_dir: str) -> dict:
    """Model-Optimizer's offline training (examples/speculative_decoding/eagle_utils.py) globs `*.pt` under
    --offline-data and reads them with `OfflineSupervisedDataset(..., answer_only_loss=True)`."""
    from modelopt.torch.speculative.eagle.utils import OfflineSupervisedDataset

    files = sorted(str(p) for p in Path(hs_dir).rglob("*.pt"))
    dataset = OfflineSupervisedDataset(files, answer_only_loss=True)
    out = {}
    for i, path in enumerate(files):
        raw = torch.load(path, weights_only=True)
        out[raw["conversation_id"]] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in dataset[i].items()}
    return out


def modelopt_data(data_file: str, tokenizer_dir: str) -> dict:
    """Model-Optimizer's conversation readers (`compute_hidden_states_*`, `StreamingDataset._tokenize_entry`):
    id from `conversation_id` or `uuid`, turns from `conversations` or `messages`, tokenised by
    `_tokenize_with_loss_mask` (one apply_chat_template call; the sample template has no generation tags,
    so answer_only_loss is off)."""
    from modelopt.torch.speculative.plugins.hf_streaming_dataset import _tokenize_with_loss_mask

    tok = _hf_tokenizer(tokenizer_dir)
    manifest = json.loads((Path(data_file).parents[1] / "manifest.json").read_text())
    if manifest["modelopt"]["chat_template"]:  # what their --chat-template flag does (load_chat_template)
        tok.chat_template = (Path(data_file).parents[1] / manifest["modelopt"]["chat_template"]).read_text()
    out = {}
    for entry in _jsonl(Path(data_file)):
        cid = entry.get("conversation_id") or entry.get("uuid")
        convs = entry.get("conversations") or entry.get("messages")
        if cid is None or not convs:
            raise SystemExit(f"row without conversation_id/uuid or conversations/messages: {sorted(entry)}")
        ids, _ = _tokenize_with_loss_mask(tok, convs, answer_only_loss=False)
        out[str(cid)] = ids[0].tolist()
    return out


CHECKS = {
    "specforge-text": specforge_text, "specforge-text-templates": specforge_text_templates,
    "specforge-prompts": specforge_prompts, "specforge-hs": specforge_hs,
    "speculators-data": speculators_data, "speculators-hs": speculators_hs, "modelopt-hs": modelopt_hs,
    "modelopt-data": modelopt_data,
}

if __name__ == "__main__":
    check, *args, result = sys.argv[1:]
    loaded = CHECKS[check](*args)
    torch.save(loaded, result)
    print(json.dumps({"check": check, "n": len(loaded)}))
