"""The vLLM tier: the CPU server's settings and the tiny policy whose weights it is sent."""

from __future__ import annotations

from tests.helpers.paths import REPO

SHIM = REPO / "tests" / "vllm" / "vllm_cpu"

#: the CPU server's environment: the torchvision shim, and vLLM's engine core in the server's own process
SERVER_ENV = {"PYTHONPATH": str(SHIM), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_cfg(python: str, **over):
    """The vLLM tier's engine settings (:class:`VLLMConfig`) with vLLM's Python ``python``; ``over`` replaces fields."""
    from grasp_lightning.engines.vllm_config import VLLMConfig

    kw = dict(python=python, dtype="float32", gpu_memory_utilization=0.05, max_model_len=4096,
              env=dict(SERVER_ENV), engine_kwargs={"enforce_eager": True}, startup_timeout_s=600)
    kw.update(over)
    return VLLMConfig(**kw)
