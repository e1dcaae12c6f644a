"""Settings of the vLLM rollout engine (``model.rollout.vllm``); no heavy imports, read by
:class:`grasp_lightning.engines.decoding.RolloutConfig`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from grasp_lightning.errors import is_count, is_number, require

ENGINES = ("hf", "vllm")


@dataclass
class VLLMConfig:
    """How the trainer reaches its vLLM server (:mod:`grasp_lightning.engines.server.vllm_server`).

    Attributes:
        python: the Python of vLLM's own environment, which starts the server beside each trainer
            rank (``None``: the ``GRASP_VLLM_PYTHON`` environment variable). vLLM pins its own torch and
            transformers, so it never shares the trainer's environment (``docs/rollout-engines.md``).
        address: ``host:port`` of a server started by hand (e.g. on other GPUs), one per trainer rank:
            ``{rank}`` is replaced by the global rank (``gpu-node:560{rank}``); then ``python`` is not used,
            the server's key comes from ``GRASP_VLLM_AUTHKEY``, and ``weight_sync_dir`` must be a directory
            the server can read (a shared filesystem when it runs on another node).
        model: what the server loads; ``None``: ``model.policy.name_or_path``.
        dtype: vLLM's weight dtype (``auto``: the checkpoint's; ``float32`` for exact CPU tests).
        gpu_memory_utilization: share of the GPU's memory vLLM may take (weights, KV cache); the
            memory planner counts it for a colocated engine.
        tensor_parallel_size: GPUs per engine; above 1 only for servers at an ``address`` (a colocated
            server uses its rank's one GPU).
        max_model_len: longest prompt + completion in tokens (``None``: the model's).
        seed: vLLM's engine seed; each generate call also gets a seed drawn from the trainer's torch RNG
            (prompt ``b`` of a call: that seed + ``b * K``, completion ``j``: + ``j``, vLLM's own rule).
        startup_timeout_s: seconds to wait for the server to load the model (CPU: about 90 s).
        request_timeout_s: seconds to wait for one answer before the engine is declared hung.
        weight_sync_dir: where the policy's language-model weights are written for the server to
            reload after each optimizer step, and each request's video embeddings (``None``: ``/dev/shm``
            if there, else the temp dir). The run's ranks on a node share one folder in it
            (``grasp-vllm-<run>-<host>``, readable by the run's user only) and one weight file per
            optimizer step; its free space is checked against that file's size before the server starts
            (:mod:`grasp_lightning.engines.weight_sync`).
        env: more environment variables for the server process (e.g. ``VLLM_CPU_KVCACHE_SPACE``).
        engine_kwargs: more ``vllm.LLM`` keyword arguments (e.g. ``enforce_eager``).
        log_file: the server's stdout/stderr (``None``: a file in the temp dir, named in errors); ``{rank}``
            is replaced by the rank, else ranks above 0 append ``.rank<N>``.

    Raises:
        GraspConfigError: a value out of range (the message names ``model.rollout.vllm.<key>``).
    """

    python: str | None = None
    address: str | None = None
    model: str | None = None
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    seed: int = 0
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 900.0
    weight_sync_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    engine_kwargs: dict = field(default_factory=dict)
    log_file: str | None = None

    def __post_init__(self) -> None:
        k = "model.rollout.vllm."
        require(is_number(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1,
                k + "gpu_memory_utilization", "a number in (0, 1]", self.gpu_memory_utilization)
        require(is_count(self.tensor_parallel_size), k + "tensor_parallel_size", "an integer >= 1",
                self.tensor_parallel_size)
        require(is_count(self.max_model_len, optional=True), k + "max_model_len", "an integer >= 1 or null",
                self.max_model_len)
        for name in ("startup_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            require(is_number(value) and value > 0, k + name, "a number of seconds > 0", value)
        port = self.address.replace("{rank}", "0").rpartition(":")[2] if isinstance(self.address, str) else ""
        require(self.address is None or port.isdigit(), k + "address", "host:port", self.address)

    def resolved_python(self) -> str | None:
        """``python``, else ``$GRASP_VLLM_PYTHON``, else ``None``."""
        return self.python or os.environ.get("GRASP_VLLM_PYTHON") or None
