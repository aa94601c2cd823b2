"""How each trainer reads an export: the settings it must be given (the cut length above all) and the commands,
with this export's paths, recorded in `manifest.json` (`train`) and printed by `eaglewatch export`.

Every length setting is the longest row of the export (`max_length`): the trainers' defaults silently cut rows
(SpecForge `data.max_length` 2048, speculators `--seq-length` / `--total-seq-len` 8192, Model-Optimizer
`training.training_seq_len` 2048) and lose their loss tokens. Commands name the trainers' releases of late 2026
(specforge 0.2, speculators 0.9, nvidia-modelopt 0.47); `$TARGET_MODEL` (the target model's folder), `$HIDDEN`
(a hidden-state folder: `[extraction] output_dir`) and `run.toml` / `run.yaml` / `eagle3.yaml` (the run config,
SpecForge's config, Model-Optimizer's recipe `modelopt_recipes/general/speculative_decoding/eagle3.yaml`) are the
user's.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

DRAFT_VOCAB = 32000  # the draft vocabulary size the printed commands use (SpecForge's and ModelOpt's usual)
PREPARED_DIR = "prepared"  # where the speculators route puts `speculators prepare-data`'s output, inside OUT


def _q(path: Path | str) -> str:
    return shlex.quote(str(path))


def trainer_routes(
    fmt: str,
    out_dir: Path,
    max_length: int | None,
    *,
    specforge_template: str | None = None,
    evaluated: bool = False,
    db: Path | None = None,
    run: str | None = None,
) -> dict[str, Any]:
    """The manifest's `train` record for an export of format `fmt` in `out_dir` whose longest row has
    `max_length` tokens: {"max_length", "settings": {trainer: {setting: value}}, "commands": [...]}.
    `evaluated`: the export holds an eval split under OUT/eval (an export folder of its own); `db`, `run`: the
    run database it came from (for the formats whose rows hold no ids to count the vocabulary from)."""
    length = max(max_length or 1, 1)
    out = Path(out_dir)
    data = out / "data"
    vocab_dir = out / "vocab"
    vocab = f"eaglewatch vocab {_q(out)} --size {DRAFT_VOCAB}"
    settings: dict[str, dict[str, Any]] = {}
    commands: list[str] = []
    if fmt == "specforge":
        settings["specforge"] = {"data.prompts_path": str(data / "specforge.jsonl"), "data.max_length": length}
        commands += [
            vocab + "   # optional: SpecForge derives the same mapping from the rows itself",
            f"specforge train --config run.yaml data.prompts_path={_q(data / 'specforge.jsonl')} "
            f"data.max_length={length} model.vocab_mapping_path={_q(vocab_dir / f'vocab_mapping-{DRAFT_VOCAB}.pt')}",
        ]
    elif fmt == "specforge-text":
        settings["specforge"] = {
            "data.train_data_path": str(data / "specforge_text.jsonl"),
            "data.is_preformatted": True,
            "data.chat_template": specforge_template,
            "data.train_only_last_turn": True,
            "data.max_length": length,
        }
        commands.append(
            f"specforge train --config run.yaml data.train_data_path={_q(data / 'specforge_text.jsonl')} "
            f"data.is_preformatted=true data.chat_template={specforge_template or 'TEMPLATE'} "
            f"data.train_only_last_turn=true data.max_length={length}"
        )
    elif fmt == "speculators":
        prepared = out / PREPARED_DIR
        settings["speculators"] = {
            "prepare-data --seq-length": length,
            "prepare-data --output": str(prepared),
            "prepare-data --seed": 0,
            "train --total-seq-len": length,
        }
        commands += [
            f'speculators prepare-data --model "$TARGET_MODEL" --data {_q(data)} --output {_q(prepared)} '
            f"--seq-length {length} --no-skip-token-freq",
            f"eaglewatch extract run.toml --manifest {_q(out)} --layout speculators   # hs_<k> numbered by "
            f"{PREPARED_DIR}/'s rows (prepare-data shuffles them)",
            vocab,
            f'speculators train --verifier-name-or-path "$TARGET_MODEL" --data-path {_q(prepared)} '
            f'--hidden-states-path "$HIDDEN/hidden_states" --on-missing raise --total-seq-len {length} '
            f"--draft-vocab-size {DRAFT_VOCAB} --d2t-path {_q(vocab_dir / f'd2t-{DRAFT_VOCAB}.npy')} "
            f"--t2d-path {_q(vocab_dir / f't2d-{DRAFT_VOCAB}.npy')}",
        ]
    elif fmt == "modelopt":
        settings["modelopt"] = {
            "data.data_path": str(data / "modelopt.jsonl"),
            "data.chat_template": str(out / "chat_template.jinja"),
            "training.answer_only_loss": True,
            "training.training_seq_len": length,
        }
        commands += [
            f"eaglewatch vocab --db {_q(db or 'RUN.db')}{f' --run {_q(run)}' if run else ''} --size {DRAFT_VOCAB} "
            f"--out {_q(vocab_dir)}",
            f'python main.py --config eagle3.yaml model.model_name_or_path="$TARGET_MODEL" '
            f"data.data_path={_q(data / 'modelopt.jsonl')} data.chat_template={_q(out / 'chat_template.jinja')} "
            f"training.answer_only_loss=true training.training_seq_len={length} "
            f"eagle.eagle_architecture_config.draft_vocab_size={DRAFT_VOCAB} "
            f"data.draft_vocab_cache={_q(vocab_dir / f'd2t-{DRAFT_VOCAB}.pt')}",
        ]
    elif fmt == "eagle3-shards":
        settings["specforge"] = {"data.hidden_states_path": "$HIDDEN", "data.max_length": length}
        settings["modelopt"] = {
            "data.offline_data_path": "$HIDDEN",
            "training.answer_only_loss": True,
            "training.training_seq_len": length,
        }
        evals = (
            f' data.eval_hidden_states_path="$HIDDEN_EVAL"   # $HIDDEN_EVAL: the same extraction of {_q(out / "eval")}'
            if evaluated
            else ""
        )
        commands += [
            vocab,
            f"eaglewatch extract run.toml --manifest {_q(out)} --layout specforge",
            f'specforge train --config run.yaml data.hidden_states_path="$HIDDEN" data.max_length={length} '
            f"model.vocab_mapping_path={_q(vocab_dir / f'vocab_mapping-{DRAFT_VOCAB}.pt')}{evals}",
            f"eaglewatch extract run.toml --manifest {_q(out)} --layout modelopt",
            f'python main.py --config eagle3.yaml model.model_name_or_path="$TARGET_MODEL" '
            f'data.offline_data_path="$HIDDEN" training.answer_only_loss=true training.training_seq_len={length} '
            f"eagle.eagle_architecture_config.draft_vocab_size={DRAFT_VOCAB} "
            f"data.draft_vocab_cache={_q(vocab_dir / f'd2t-{DRAFT_VOCAB}.pt')}",
        ]
    return {"max_length": length, "settings": settings, "commands": commands}
