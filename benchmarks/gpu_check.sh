#!/usr/bin/env bash
# GPU check: bf16 DeepSpeed ZeRO-2 SFT and GRPO-SGR steps of a random-initialised stand-in of
# Qwen3-VL-2B (published depth, real Qwen3 vocabulary and templates) on one GPU, through
# `python -m grasp_lightning fit`; prints samples/s, tokens/s, peak memory, MFU and the memory
# planner's predicted peak as one JSON line (benchmarks/gpu_check.py documents the figures).
# Stops within 8 minutes (killed at 480 s); without a CUDA device it stops at once (status 2).
#   bash benchmarks/gpu_check.sh [--like Qwen3-VL-4B-Instruct] [--sft-steps 10] [--sgr-steps 5]
#   bash benchmarks/gpu_check.sh --smoke-cpu     # the same path on the CPU with tiny sizes
#   bash benchmarks/gpu_check.sh --split     # SGR only: the step split per arm (today's path, vision once,
#                                             # chunked log-probs, compiled decode, all), 2B and Qwen3.5-9B
#                                             # stand-ins; not yet run on a GPU
#   bash benchmarks/gpu_check.sh --qlora --like Qwen3-VL-8B-Instruct   # QLoRA (configs/qlora.yaml), no DeepSpeed
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
# Offline: no download. transformers 5.25 would otherwise swap layers for Hugging Face Hub kernels on CUDA by
# default (the `kernels` package fetches them from the Hub); the check measures transformers' own PyTorch layers.
export HF_HUB_OFFLINE=1 USE_HUB_KERNELS=NO TOKENIZERS_PARALLELISM=false
exec timeout --kill-after=20 480 python benchmarks/gpu_check.py "$@"
