"""Load eaglewatch's outputs through the trainers' own code (run by tests/export/trainers/env.py in the trainer
environment). Usage: consumers.py CHECK ARGS... RESULT.pt — RESULT gets what the trainer's code returned,
stdout's last line a JSON summary; `consumers.py --zygote TRAINER` imports a trainer's modules once and forks a
fresh process per check it is sent (tests/export/trainers/env.py).

Where a consumer's entry point needs a GPU server or accelerator (SpecForge's and speculators' hidden-state
scripts, their trainers), the functions it calls underneath are called instead, as named per check.
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


def _manifest(export_dir: str | Path) -> dict:
    return json.loads((Path(export_dir) / "manifest.json").read_text())


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def specforge_text(export_dir: str, tokenizer_dir: str) -> dict:
    """SpecForge `build_eagle3_dataset(..., is_preformatted=True)` maps `preprocess_conversations` over the
    rows' `text` (specforge/data/preprocessing.py); called here per row with the manifest's settings."""
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import TEMPLATE_REGISTRY

    manifest = _manifest(export_dir)
    data = manifest["specforge"]["data"]
    settings = manifest["train"]["settings"]["specforge"]
    rows = _jsonl(Path(export_dir) / data["train_data_path"])
    tok = _hf_tokenizer(tokenizer_dir)
    template = TEMPLATE_REGISTRY.get(settings["data.chat_template"])
    out = preprocess_conversations(
        tok,
        [r["text"] for r in rows],
        template,
        settings["data.max_length"],
        is_preformatted=settings["data.is_preformatted"],
        train_only_last_turn=settings["data.train_only_last_turn"],
        tools=[[] for _ in rows],
    )
    return {
        r["id"]: {"input_ids": ids[0].tolist(), "loss_mask": mask[0].tolist()}
        for r, ids, mask in zip(rows, out["input_ids"], out["loss_mask"], strict=True)
    }


def specforge_text_templates(export_dir: str, tokenizer_dir: str) -> dict:
    """The same `preprocess_conversations` call over the rows' `text` with every template SpecForge registers
    (`TEMPLATE_REGISTRY`, what `data.chat_template` names), last turn only and every turn: template name ->
    {"last" | "all": {id: (input_ids, loss_mask) or the error}}. The Kimi templates go over every row; the others
    over the first 60 (a row whose mask differs is all it takes to show a template is not exact, and tokenising
    every row with each of them cost half a minute)."""
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import TEMPLATE_REGISTRY

    manifest = _manifest(export_dir)
    every = _jsonl(Path(export_dir) / manifest["specforge"]["data"]["train_data_path"])
    tok = _hf_tokenizer(tokenizer_dir)
    out: dict = {}
    for name in TEMPLATE_REGISTRY.get_all_template_names():
        template = TEMPLATE_REGISTRY.get(name)
        rows = every if name.startswith("kimi") else every[:60]
        out[name] = {}
        for key, last in (("last", True), ("all", False)):
            try:
                got = preprocess_conversations(
                    tok,
                    [r["text"] for r in rows],
                    template,
                    10**6,
                    is_preformatted=True,
                    train_only_last_turn=last,
                    tools=[[] for _ in rows],
                )
                out[name][key] = {
                    r["id"]: (ids[0].to(torch.int32), mask[0].to(torch.int8))
                    for r, ids, mask in zip(rows, got["input_ids"], got["loss_mask"], strict=True)
                }
            except Exception as exc:  # a template this text cannot go through at all
                out[name][key] = f"{type(exc).__name__}: {exc}"
    return out


def specforge_prompts(export_dir: str) -> dict:
    """SpecForge's online trainer reads `data.prompts_path` through `prepare_prompt_tasks` (specforge/data/
    prompt_builder.py; one file, pre-tokenized rows passed through, cut at `data.max_length`): the manifest's
    path and max_length, as `specforge train` would be given them."""
    from specforge.data.prompt_builder import prepare_prompt_tasks

    settings = _manifest(export_dir)["train"]["settings"]["specforge"]
    path = settings["data.prompts_path"]
    rows = _jsonl(Path(path))

    def prepare(max_length: int) -> list[dict]:
        return [
            t["payload"]
            for t in prepare_prompt_tasks(
                path,
                None,
                chat_template=None,
                max_length=max_length,
                is_preformatted=False,
                train_only_last_turn=False,
                cache_dir=None,
                cache_key=None,
                num_proc=None,
            )
        ]

    got = prepare(settings["data.max_length"])
    default = prepare(2048)  # DataConfig.max_length's default (specforge/config/schema.py)
    return {
        "rows": {
            r["id"]: {"input_ids": list(p["input_ids"]), "loss_mask": list(p["loss_mask"])}
            for r, p in zip(rows, got, strict=True)
        },
        "default_loss_tokens": sum(sum(p["loss_mask"]) for p in default),
        "default_rows": len(default),
    }


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


def specforge_offline_batch(hs_dir: str, vocab_dir: str, draft_vocab: str, max_length: str) -> dict:
    """What `specforge train data.hidden_states_path=HS data.max_length=L` feeds the EAGLE-3 step: the feature
    files as its reader lists them (`list_feature_files`), loaded (`load_feature_file`), normalised by the EAGLE-3
    strategy (`specforge/algorithms/eagle3/data.py` `normalize_offline_sample`) and collated
    (`DataCollatorWithPadding`), first batch of 2; the loss-token counts it derives its vocabulary from
    (`count_effective_feature_tokens`) and the mapping it would make of them (`process_token_dict_to_mappings`);
    eaglewatch's vocab_mapping file loaded into SpecForge's draft (`LlamaForCausalLMEagle3.load_vocab_mapping`)."""
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.data.utils import DataCollatorWithPadding
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import list_feature_files
    from specforge.training.vocab_mapping import count_effective_feature_tokens
    from transformers import LlamaConfig

    n, length = int(draft_vocab), int(max_length)
    files = list_feature_files(hs_dir)
    items = [normalize_offline_sample(load_feature_file(p), length) for p in files[:2]]
    batch = DataCollatorWithPadding()(items)
    counts = count_effective_feature_tokens(hs_dir, max_length=length)
    mapping = torch.load(Path(vocab_dir) / f"vocab_mapping-{n}.pt")
    target_vocab = int(mapping["t2d"].numel())
    d2t, t2d = process_token_dict_to_mappings(counts.copy(), n, target_vocab)
    config = LlamaConfig(
        vocab_size=target_vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    config.draft_vocab_size = n
    draft = LlamaForCausalLMEagle3(config)
    draft.load_vocab_mapping(str(Path(vocab_dir) / f"vocab_mapping-{n}.pt"))
    return {
        "files": [str(Path(p).relative_to(hs_dir)) for p in files],
        "batch": {k: v.clone() for k, v in batch.items()},
        "counts": dict(counts),
        "their_d2t": d2t,
        "their_t2d": t2d,
        "draft_d2t": draft.d2t.clone(),
        "draft_t2d": draft.t2d.clone(),
    }


def specforge_train_step() -> dict:
    """Whether SpecForge's EAGLE-3 training step can run here: it imports its loss module
    (specforge/core/loss.py: a Triton kernel, `import triton` at the top) through
    `specforge.algorithms.eagle3.model`."""
    try:
        import specforge.algorithms.eagle3.model  # noqa: F401
    except Exception as exc:
        return {"runs": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"runs": torch.cuda.is_available(), "error": None if torch.cuda.is_available() else "no CUDA device"}


def speculators_data(data_dir: str, tokenizer_dir: str, prepared: str) -> dict:
    """speculators' `prepare-data` calls `load_and_preprocess_dataset` (load_raw_dataset over the folder: every
    *.json/*.jsonl, then build_speculator_training_dataset, shuffled with --seed) and saves it to `prepared`."""
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    shuffled, _ = load_and_preprocess_dataset(
        tokenizer_dir, [data_dir], seq_length=10**6, build_dataset_num_proc=1, seed=0
    )
    shuffled.save_to_disk(prepared)
    return {
        "rows": [
            {"input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist(), "seq_len": int(r["seq_len"])}
            for r in shuffled
        ]
    }


def speculators_hs(prepared: str, hs_dir: str) -> dict:
    """speculators' trainer dataset `ArrowDataset` (speculators/train/data.py) over the prepared rows, hidden
    states from `hs_connectors.FileTransfer` (`hs_<k>.safetensors`) with on_missing="raise"; a
    `SampleUnavailable` (its answer to a row whose stored token ids differ, with only a warning) is counted."""
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    dataset = ArrowDataset(
        max_len=10**6,
        datapath=prepared,
        transfer=FileTransfer(Path(hs_dir) / "hidden_states"),
        on_missing="raise",
        hidden_states_dtype=torch.float32,
    )
    out: dict = {"unavailable": []}
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, dict):
            out["unavailable"].append((i, getattr(item, "reason", repr(item))))
            continue
        out[i] = {k: v.clone() for k, v in item.items()}
    return out


def speculators_train_batch(
    prepared: str, hs_dir: str, vocab_dir: str, draft_vocab: str, target: str, total_seq_len: str
) -> dict:
    """What `speculators train --data-path PREPARED --hidden-states-path HS --on-missing raise --total-seq-len L
    --draft-vocab-size N --d2t-path ... --t2d-path ...` builds before its first step (speculators/train/cli.py
    `main`): the vocab mappings (`parse_vocab_mappings`: eaglewatch's d2t/t2d files, and the ones it regenerates
    from eaglewatch's token_freq.pt), and the first batch of its train loader (`create_train_val_loaders`,
    eagle3's `shift_batch`, packed to total_seq_len)."""
    import argparse

    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.cli import _generate_vocab_mappings, parse_vocab_mappings
    from speculators.train.dataloader import create_train_val_loaders

    n = int(draft_vocab)
    args = argparse.Namespace(
        d2t_path=str(Path(vocab_dir) / f"d2t-{n}.npy"),
        t2d_path=str(Path(vocab_dir) / f"t2d-{n}.npy"),
        draft_vocab_size=n,
        data_path=prepared,
        token_freq_path=None,
        verifier_name_or_path=target,
        trust_remote_code=False,
    )
    d2t, t2d, size = parse_vocab_mappings(args)
    regen = argparse.Namespace(
        **{**vars(args), "d2t_path": None, "t2d_path": None, "token_freq_path": str(Path(vocab_dir) / "token_freq.pt")}
    )
    scratch = Path(hs_dir) / "vocab-regenerated"
    scratch.mkdir(exist_ok=True)
    regen_d2t, regen_t2d, _ = _generate_vocab_mappings(regen, scratch)
    hidden = 64
    train_loader, _ = create_train_val_loaders(
        data_path=prepared,
        total_seq_len=int(total_seq_len),
        hidden_states_dtype=torch.float32,
        transfer=FileTransfer(Path(hs_dir) / "hidden_states"),
        vllm_endpoint="http://127.0.0.1:9/v1",
        on_missing="raise",
        verifier_name_or_path=target,
        request_timeout=1.0,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=1,
        hidden_size=hidden,
        num_target_layers=3,
        num_workers=0,
        prefetch_factor=1,
        preprocess=shift_batch,
    )
    batch = next(iter(train_loader))
    return {
        "d2t": d2t,
        "t2d": t2d,
        "size": size,
        "regen_d2t": regen_d2t,
        "regen_t2d": regen_t2d,
        "batch": {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()},
    }


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


def modelopt_data(export_dir: str, tokenizer_dir: str) -> dict:
    """Model-Optimizer's three readers of `data.data_path` rows, with the manifest's `data.chat_template` and
    `training.training_seq_len` and answer_only_loss on: `_tokenize_with_loss_mask` (the tokenisation of its
    offline dump and streaming routes), `StreamingDataset._tokenize_entry` (id from conversation_id or uuid,
    turns from conversations or messages), and the online `LanguageDataCollator` (labels masked outside the
    assistant tokens)."""
    from modelopt.torch.speculative.plugins.hf_streaming_dataset import (
        StreamingConfig,
        StreamingDataset,
        _tokenize_with_loss_mask,
    )
    from modelopt.torch.utils.plugins.transformers_dataset import LanguageDataCollator

    settings = _manifest(export_dir)["train"]["settings"]["modelopt"]
    template = Path(settings["data.chat_template"]).read_text()
    length = settings["training.training_seq_len"]
    tok = _hf_tokenizer(tokenizer_dir)
    tok.chat_template = template  # what their data.chat_template / --chat-template does
    entries = _jsonl(Path(settings["data.data_path"]))
    dataset = StreamingDataset(entries, tok, StreamingConfig(answer_only_loss=True, max_seq_len=length))
    collator = LanguageDataCollator(
        tokenizer=_hf_tokenizer(tokenizer_dir),
        train_len=length,
        chat_template=template,
        answer_only_loss=True,
        return_labels=True,
    )
    out = {}
    for entry in entries:
        ids, mask = _tokenize_with_loss_mask(tok, entry["messages"], answer_only_loss=True, max_seq_len=length)
        sample = dataset._tokenize_entry(entry)
        collated = collator([entry])
        out[str(entry["conversation_id"])] = {
            "input_ids": ids[0].tolist(),
            "loss_mask": mask.tolist(),
            "stream_ids": sample["token_ids"],
            "stream_mask": sample["loss_mask"].tolist(),
            "stream_cid": sample["cid"],
            "online_ids": collated["input_ids"][0].tolist(),
            "online_labels": collated["labels"][0].tolist(),
        }
    return out


def modelopt_train(model_dir: str, hs_dir: str, vocab_dir: str, draft_vocab: str, train_len: str, steps: str) -> dict:
    """A few optimizer steps of a tiny EAGLE-3 drafter through Model-Optimizer's own training path, as its
    examples/speculative_decoding/main.py runs an offline recipe: the eagle3 recipe
    (modelopt_recipes/general/speculative_decoding/eagle3.yaml) loaded by `load_recipe` with the overrides a user
    passes (model, data.offline_data_path, data.draft_vocab_cache, training.answer_only_loss,
    training.training_seq_len, a small draft architecture), the base model by `load_vlm_or_llm`, `mtsp.convert`,
    `HFEagleModel.load_draft_vocab_cache` (eaglewatch's d2t-N.pt), `OfflineSupervisedDataset` +
    `EagleOfflineDataCollator`, and transformers' Trainer on the CPU. Returns the logged losses, the first batch
    the Trainer's dataloader gave, and the draft's d2t."""
    import importlib.resources

    import modelopt.torch.opt as mto
    import modelopt.torch.speculative as mtsp
    import transformers
    from modelopt.recipe import load_recipe
    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset
    from modelopt.torch.speculative.utils import load_vlm_or_llm

    mto.enable_huggingface_checkpointing()
    torch.manual_seed(0)
    n, length = int(draft_vocab), int(train_len)
    recipe_path = importlib.resources.files("modelopt_recipes") / "general/speculative_decoding/eagle3.yaml"
    recipe = load_recipe(
        str(recipe_path),
        overrides=[
            f"model.model_name_or_path={model_dir}",
            f"data.offline_data_path={hs_dir}",
            f"data.draft_vocab_cache={Path(vocab_dir) / f'd2t-{n}.pt'}",
            "training.answer_only_loss=true",
            f"training.training_seq_len={length}",
            f"training.output_dir={Path(hs_dir).parent / 'modelopt-out'}",
            "eagle.eagle_use_torch_compile=false",
            f"eagle.eagle_architecture_config.draft_vocab_size={n}",
            "eagle.eagle_architecture_config.intermediate_size=128",
            "eagle.eagle_architecture_config.num_attention_heads=4",
            "eagle.eagle_architecture_config.num_key_value_heads=2",
            "eagle.eagle_architecture_config.head_dim=16",
        ],
    )
    model = load_vlm_or_llm(
        model_dir, use_offline_training=recipe.data.mode != "online", dtype=torch.float32, device_map="cpu"
    )
    mtsp.convert(model, [("eagle", recipe.eagle.model_dump())])
    mtsp.plugins.HFEagleModel.load_draft_vocab_cache(model, recipe.data.draft_vocab_cache)
    files = sorted(str(p) for p in Path(hs_dir).rglob("*.pt"))
    dataset = OfflineSupervisedDataset(files, answer_only_loss=recipe.training.answer_only_loss)
    args = transformers.TrainingArguments(
        output_dir=recipe.training.output_dir,
        max_steps=int(steps),
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        warmup_steps=0,
        use_cpu=True,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_drop_last=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=EagleOfflineDataCollator(train_len=length)
    )
    first = next(iter(trainer.get_train_dataloader()))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "losses": losses,
        "draft_d2t": model.eagle_module.d2t.clone(),
        "mode": recipe.data.mode,
        "answer_only_loss": recipe.training.answer_only_loss,
        "transformers": transformers.__version__,
        "batch": {
            "input_ids": first["input_ids"].clone(),
            "loss_mask": first["loss_mask"].clone(),
            "base_model_hidden_states": first["base_model_outputs"]["base_model_hidden_states"].clone(),
            "aux_hidden_states": first["base_model_outputs"]["aux_hidden_states"].clone(),
        },
    }


def arrow_datasets(out_dir: str) -> dict:
    """Arrow stream files as Hugging Face `datasets.save_to_disk` writes them (two shards of several record
    batches each, from a JSON file as speculators loads one), and one `large_list` column from pyarrow; with the
    rows each holds, read back by `datasets`, and the record batches per file."""
    import datasets.config
    import pyarrow as pa
    from datasets import load_dataset, load_from_disk

    rows = [
        {"input_ids": list(range(k, k + 1 + (k * 7) % 23)), "loss_mask": [1] * (1 + (k * 7) % 23), "seq_len": k}
        for k in range(50)
    ]
    source = Path(out_dir) / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.config.DEFAULT_MAX_BATCH_SIZE = 7  # several record batches per file
    load_dataset("json", data_files=str(source), split="train").save_to_disk(str(Path(out_dir) / "ds"), num_shards=2)
    table = pa.table(
        {"seq_len": pa.array([1, 2], pa.int64()), "input_ids": pa.array([[5, 6, 7], [8]], pa.large_list(pa.int64()))}
    )
    with pa.OSFile(str(Path(out_dir) / "large.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1)
    batches = [
        sum(1 for _ in pa.ipc.open_stream(pa.memory_map(str(p))))
        for p in sorted((Path(out_dir) / "ds").glob("*.arrow"))
    ]
    back = load_from_disk(str(Path(out_dir) / "ds")).with_format(None)
    return {"ds": [r["input_ids"] for r in back], "large": [[5, 6, 7], [8]], "batches": batches}


CHECKS = {
    "specforge-text": specforge_text,
    "specforge-text-templates": specforge_text_templates,
    "specforge-prompts": specforge_prompts,
    "specforge-hs": specforge_hs,
    "specforge-offline-batch": specforge_offline_batch,
    "specforge-train-step": specforge_train_step,
    "speculators-data": speculators_data,
    "speculators-hs": speculators_hs,
    "speculators-train-batch": speculators_train_batch,
    "modelopt-hs": modelopt_hs,
    "modelopt-data": modelopt_data,
    "modelopt-train": modelopt_train,
    "arrow-datasets": arrow_datasets,
}

# What a warm process of each trainer imports once (`zygote`): the modules its checks import, the slow part of a
# check (Model-Optimizer ~20 s, speculators ~18 s, SpecForge ~10 s on 2 cores)
PRELOAD = {
    "specforge": (
        "transformers",
        "specforge.data.preprocessing",
        "specforge.data.template",
        "specforge.data.prompt_builder",
    ),
    "speculators": (
        "transformers",
        "speculators.data_generation.preprocessing",
        "speculators.train.data",
        "speculators.train.dataloader",
        "speculators.models.eagle3.data",
        "hs_connectors",
    ),
    "modelopt": (
        "transformers",
        "modelopt.torch.speculative.plugins.hf_streaming_dataset",
        "modelopt.torch.utils.plugins.transformers_dataset",
        "modelopt.torch.speculative.eagle.utils",
    ),
}


def run_check(check: str, *args: str) -> str:
    """Run one check: what the trainer's code returned goes to RESULT (the last argument); returns the summary."""
    *args, result = args
    loaded = CHECKS[check](*args)
    torch.save(loaded, result)
    return json.dumps({"check": check, "n": len(loaded)})


def zygote(family: str) -> None:
    """Import one trainer's modules once, then fork a fresh child per check named on stdin (a JSON line: argv,
    stdout and stderr files, cwd; with "module", the trainer's command line `python -m MODULE ARGV...`): each runs
    in a process of its own, as a cold start would, without paying the imports again. Answers each request with
    {"pid": ...} when forked and {"rc": ...} when it ended."""
    import importlib
    import os
    import traceback

    for name in PRELOAD.get(family, ()):
        importlib.import_module(name)
    print(json.dumps({"ready": family}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the check's own process
            code = 1
            try:
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
                os.chdir(req.get("cwd") or os.getcwd())
                if req.get("module"):  # a trainer's command line, as `python -m MODULE ARGS...` runs it
                    import runpy

                    sys.argv = [req["module"], *req["argv"]]
                    runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
                else:
                    print(run_check(*req["argv"]), flush=True)
                code = 0
            except SystemExit as exc:  # the command line's own exit status
                if isinstance(exc.code, int) or exc.code is None:
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - the child reports every failure through its exit status
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote(sys.argv[2])
    else:
        print(run_check(*sys.argv[1:]))
