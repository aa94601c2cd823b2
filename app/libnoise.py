"""Keep third-party notices (transformers' "PyTorch was not found", tokenizers' fork warning) off the
operator's terminal. Call before importing transformers."""

from __future__ import annotations

import logging
import os
import warnings

_done = False


def silence_library_noise() -> None:
    global _done
    if _done:
        return
    _done = True
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("transformers", "huggingface_hub", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"transformers\..*")
