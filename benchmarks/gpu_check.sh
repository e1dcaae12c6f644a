#!/usr/bin/env bash
# GPU check: bf16 DeepSpeed ZeRO-2 SFT and GRPO-SGR steps of a random-initialised Qwen3-VL-2B on one
# GPU; prints samples/s, tokens/s, peak memory and MFU as one JSON line (benchmarks/gpu_check.py
# documents the figures). Stops within 8 minutes; without a CUDA device it stops at once (status 2).
#   bash benchmarks/gpu_check.sh [--arch Qwen3-VL-4B-Instruct] [--sft-steps 10] [--sgr-steps 5]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout --kill-after=20 480 python benchmarks/gpu_check.py "$@"
