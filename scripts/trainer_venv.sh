#!/usr/bin/env bash
# Build the trainer environment the consumer tests import: SpecForge, speculators and Model-Optimizer from PyPI,
# installed with --no-deps into one target folder next to the project's venv (their pins on torch, transformers
# and datasets clash with ours and with each other; the loaders the tests call run on what the venv already has
# plus the few pure-Python/data packages listed here). No GPU needed.
#
# One overlay: Model-Optimizer 0.47's training code (the CPU smoke training, tests/export/test_smoke_training.py)
# needs the transformers it supports (< 5.15; the venv's newer one changed LlamaRotaryEmbedding's signature), with
# the tokenizers and huggingface-hub that transformers checks for at import. It goes to OVERLAY (TARGET/overlays/
# modelopt-train), put before TARGET on PYTHONPATH for that test's child process only.
#
# Cached outside the checkout, keyed by these package lists and the Python version: a fresh clone (CI keeps only
# $HOME/.cache between runs) finds the folder a previous run built and pays nothing. Usage:
# scripts/trainer_venv.sh [TARGET]   (default $XDG_CACHE_HOME or ~/.cache, eaglewatch-tests/trainers-<hash>;
# prints the folder). Tests find it through EAGLEWATCH_TRAINERS_SITE (scripts/test sets it from this output;
# default .trainers/site under the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TRAINER_PYTHON:-python}  # the eaglewatch venv's python (the tests run the loaders with it)
PACKAGES=(
  "specforge==0.2.0" "speculators==0.9.0" "nvidia-modelopt==0.47.0" "hs-connectors==0.9.0"
  # what their data loaders and CLIs import that the eaglewatch venv lacks (datasets <= 5.1.0 is speculators' pin)
  "datasets==5.1.0" "pyarrow==26.0.1" "pandas==3.1.1" "python-dateutil==2.9.0.post0" "six==1.17.0"
  "dill==0.4.1" "multiprocess==0.70.19" "xxhash==4.1.0" "loguru==0.7.3" "omegaconf==2.4.0"
  "antlr4-python3-runtime==4.9.3" "pydantic-settings==2.16.3" "python-dotenv==1.2.4" "pulp==3.3.2" "scipy==1.17.1"
)
OVERLAY_MODELOPT_TRAIN=("transformers==5.14.1" "tokenizers==0.22.2" "huggingface-hub==1.33.0")
WANT=$(printf '%s\n' "${PACKAGES[@]}" "--" "${OVERLAY_MODELOPT_TRAIN[@]}" \
  "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
CACHE=${EAGLEWATCH_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewatch-tests}
TARGET=${1:-${EAGLEWATCH_TRAINERS_SITE:-$CACHE/trainers-$WANT}}
STAMP="$TARGET/.eaglewatch-stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  (cd "$TARGET" && pwd)
  exit 0
fi
echo "== building the trainer environment in $TARGET (specforge, speculators, nvidia-modelopt; --no-deps)" >&2
rm -rf "$TARGET"
mkdir -p "$TARGET"
"$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$TARGET" "${PACKAGES[@]}" >&2
"$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$TARGET/overlays/modelopt-train" \
  "${OVERLAY_MODELOPT_TRAIN[@]}" >&2
echo "$WANT" > "$STAMP"
(cd "$TARGET" && pwd)
