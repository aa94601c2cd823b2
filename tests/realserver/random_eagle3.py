"""Write a random (untrained) EAGLE-3 draft in speculators' format for a target model; run with the vLLM venv's
python (it has speculators): `python random_eagle3.py TARGET_DIR OUT_DIR`. The verifier config is cut to one
layer with a matching one-entry `layer_types` (vLLM refuses it otherwise; docs: ../shared/reference/vllm-cpu.md).
"""

from __future__ import annotations

import sys

import torch
from speculators.models.eagle3 import Eagle3DraftModel
from transformers import AutoConfig


def main(target: str, out: str) -> None:
    torch.manual_seed(0)
    verifier = AutoConfig.from_pretrained(target)
    verifier.num_hidden_layers = 1
    if getattr(verifier, "layer_types", None):
        verifier.layer_types = verifier.layer_types[:1]
    model = Eagle3DraftModel.from_training_args(
        verifier,
        verifier_name_or_path=target,
        target_layer_ids=[0, 1, 2],
        draft_vocab_size=verifier.vocab_size,
        norm_before_residual=False,
        ttt_steps=3,
        draft_attn_impl="sdpa",
    )
    model.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
