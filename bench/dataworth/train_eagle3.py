"""speculators' own EAGLE-3 trainer on the CPU: `python bench/dataworth/train_eagle3.py ARGS...` in vLLM's venv,
ARGS those of `speculators train`.

speculators 0.9 assumes an accelerator in two places (../shared/reference/vllm-cpu.md, "The whole loop on the
CPU"): the Trainer's device (`get_local_rank`, whose rank it moves tensors to) and the step timer's
`torch.accelerator.synchronize()`. Both are pointed at the CPU here before its CLI runs; nothing of its files
changes. The loss and attention must be chosen by the caller (`--loss-implementation eager`, `--draft-attn-impl
sdpa`), as its fused loss is a Triton kernel and flex attention has no CPU backward.
"""

from __future__ import annotations

import sys


def main() -> None:
    import speculators.train.recovery as recovery
    import speculators.train.trainer as trainer
    import torch
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    if not torch.accelerator.is_available():
        trainer.get_local_rank = lambda: "cpu"  # type: ignore[assignment]
        recovery.get_local_rank = lambda: "cpu"  # type: ignore[assignment]
        torch.accelerator.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    sys.argv = ["speculators train", *sys.argv[1:]]
    train_main(TrainConfig.resolve())


if __name__ == "__main__":
    main()
