"""The planner's inputs: :class:`RunSpec`, read from a run's instantiated objects by :func:`spec_from_run`.

The objects are the run's own (``grasp_lightning.commands.config.load_run`` instantiates the
``--config`` files through the training CLI): the :class:`~grasp_lightning.module.GraspModule`
(``policy_cfg``, ``reference_cfg``, ``lora_cfg``, ``rollout_cfg``, ``sequence_parallel_size``), its task (``needs_reference``,
``samples_rollouts``, ``shares_prompt``), the DataModule's settings (``loader``, ``video``, ``prompt``)
and the trainer's settings (``precision``, ``strategy``, ``devices``, ``num_nodes``). A key a config leaves out therefore has
the value the run has; no default of the code is copied here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.planning.architectures import DEFAULT_ARCHITECTURE, bundled_name
from grasp_lightning.planning.tokens import DEFAULT_SOURCE_FPS
from grasp_lightning.policy import LoraConfig, is_missing_local_path, missing_model_message

if TYPE_CHECKING:
    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.module import GraspModule


@dataclass
class RunSpec:
    """What the planner needs to know about a run (:func:`spec_from_run` reads it from the run's objects).

    Attributes:
        model: a bundled architecture name, Hub id or local directory (``model.policy.name_or_path``).
        task: the task's name in the report (its class name without ``Task``: ``GRPO``, ``SFT``).
        needs_reference: the task trains against a frozen reference model (``Task.needs_reference``;
            GRPO: ``beta != 0``).
        samples_rollouts: the task samples K completions per prompt (``Task.samples_rollouts``): the
            rollout KV cache, ``B x K`` sequences and the scoring logits are counted; otherwise the
            SFT target (``response_tokens``) and its cross-entropy logits.
        shares_prompt: a group's clip is encoded and its prompt run once for its K completions
            (``Task.shares_prompt``); ``False``: K repeated rows, like TRL.
        logprob_chunk_size: completion tokens per chunk of the LM head and log-softmax
            (``Task.logprob_chunk_size``); ``None``: the full logits are held.
        devices, num_nodes: GPUs per node and nodes; the data-parallel world is their product.
        zero_stage: 0 (no DeepSpeed: ``auto``, ``ddp``, one device), 1 or 2.
        offload_optimizer: DeepSpeed keeps the optimizer states and fp32 gradients on the CPU.
        reduce_bucket_size, overlap_comm: DeepSpeed bucket size (elements) and double buffering.
        precision: Lightning precision (``bf16-mixed``, ``32-true``, ...).
        dtype: ``model.policy.dtype``, the dtype weights are loaded in.
        freeze_vision: the vision tower gets no gradients.
        lora: LoRA settings (``enabled`` turns LoRA on).
        separate_reference: ``model.reference.name_or_path`` names a checkpoint (a full copy even with LoRA).
        gradient_checkpointing, attn_implementation: as in ``model.policy``.
        micro_batch_size: prompts per micro-batch per GPU (``data.loader.batch_size``).
        num_generations, max_new_tokens: the rollout's K and completion budget (tokens).
        fps, max_frames, max_pixels: the clip's decoding (frames/s, frames, pixels/frame).
        frame_max_tokens: ``data.video.frame_max_tokens``, the released resolution rule (tokens per
            2-frame patch; ``None``: frames capped at ``max_pixels``).
        sampling: ``data.video.sampling`` (``"rate"``: by timestamp at ``fps``; ``"even"``: the released spread).
        max_target_tokens, max_prompt_tokens: the data budgets (tokens).
        video_seconds: the clip's length (s).
        frame_size: the source video's ``(height, width)`` in pixels (``None``: square frames just large
            enough that the cap binds: ``max_pixels``, or ``frame_max_tokens`` whole tokens);
            source_fps: its frame rate (frames/s).
        text_tokens: tokens of the rendered prompt (system prompt, question, options, chat markers)
            with its one video placeholder ``<|vision_start|><|video_pad|><|vision_end|>``.
        response_tokens: SFT target tokens (``None``: ``max_target_tokens``, the worst case).
        rollout_engine: ``model.rollout.engine``; with ``vllm`` the trainer keeps no rollout KV cache.
        engine_memory_fraction: share of each GPU a colocated vLLM engine takes
            (``model.rollout.vllm.gpu_memory_utilization``; 0 for ``hf`` or a server at an address).
        sequence_parallel: ``model.sequence_parallel``, the ranks ``N`` of a Ulysses group that split each
            sample's sequence (1: no split; :mod:`grasp_lightning.sequence_parallel`).

    The last five are what the plan asks about (a clip, a prompt); they are not part of a config.
    """

    model: str
    task: str
    needs_reference: bool
    samples_rollouts: bool
    shares_prompt: bool
    devices: int
    num_nodes: int
    zero_stage: int
    offload_optimizer: bool
    reduce_bucket_size: int
    overlap_comm: bool
    precision: str
    dtype: str
    freeze_vision: bool
    lora: LoraConfig
    separate_reference: bool
    gradient_checkpointing: bool
    attn_implementation: str | None
    micro_batch_size: int
    num_generations: int
    max_new_tokens: int
    fps: float
    max_frames: int
    max_pixels: int
    max_target_tokens: int | None
    max_prompt_tokens: int | None
    video_seconds: float = 60.0
    frame_size: tuple[int, int] | None = None
    source_fps: float = DEFAULT_SOURCE_FPS
    text_tokens: int = 256
    response_tokens: int | None = None
    rollout_engine: str = "hf"
    engine_memory_fraction: float = 0.0
    logprob_chunk_size: int | None = None
    frame_max_tokens: int | None = None
    sampling: str = "rate"
    sequence_parallel: int = 1

    @property
    def world_size(self) -> int:
        """Data-parallel ranks: devices x nodes."""
        return self.devices * self.num_nodes


def devices_of(value: Any, notes: list[str]) -> int:
    """GPUs per node of ``trainer.devices`` (an int, a list of indices, a digit string); anything else
    (``auto``, ``-1``) is planned as 1 device, with a note."""
    if isinstance(value, (list, tuple)):
        return len(value)
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    notes.append(f"trainer.devices={value!r}: planned for 1 device")
    return 1


def strategy_settings(strategy: Any, where: str = "trainer.strategy") -> dict:
    """``zero_stage``, ``offload_optimizer``, ``reduce_bucket_size``, ``overlap_comm`` of a Lightning
    strategy: an instance, or a name of Lightning's ``StrategyRegistry`` (``deepspeed_stage_2_offload``,
    ``ddp``, ...), which is instantiated to read it. A DeepSpeed strategy is read from the
    ``zero_optimization`` section of its DeepSpeed config (``DeepSpeedStrategy.config``, its own
    defaults filled in); any other strategy (``auto``, DDP, one device) has no ZeRO.

    Raises:
        GraspConfigError: an FSDP strategy (not modelled), or a DeepSpeed config without a key.
    """
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, StrategyRegistry

    if isinstance(strategy, str):
        name = strategy
        if name.startswith("fsdp"):
            raise GraspConfigError(f"{where}: {name!r} is not modelled (DeepSpeed ZeRO-1/2, DDP or one device)")
        if name not in StrategyRegistry:
            if name.startswith("deepspeed"):
                raise GraspConfigError(f"{where}: {name!r} is not modelled")
            return {"zero_stage": 0, "offload_optimizer": False, "reduce_bucket_size": 0, "overlap_comm": False}
        strategy = StrategyRegistry.get(name)
    if isinstance(strategy, FSDPStrategy):
        raise GraspConfigError(f"{where}: {type(strategy).__name__} is not modelled (DeepSpeed ZeRO-1/2, DDP or "
                               "one device)")
    if not isinstance(strategy, DeepSpeedStrategy):
        return {"zero_stage": 0, "offload_optimizer": False, "reduce_bucket_size": 0, "overlap_comm": False}
    zero = (strategy.config or {}).get("zero_optimization") or {}
    missing = [key for key in ("stage", "reduce_bucket_size", "overlap_comm") if key not in zero]
    if missing:
        raise GraspConfigError(f"{where}: the DeepSpeed config's zero_optimization has no {missing}")
    return {"zero_stage": int(zero["stage"]), "offload_optimizer": "offload_optimizer" in zero,
            "reduce_bucket_size": int(float(zero["reduce_bucket_size"])), "overlap_comm": bool(zero["overlap_comm"])}


@lru_cache(maxsize=1)
def _trainer_default_precision() -> str:
    """The precision Lightning's ``Trainer`` runs with when ``trainer.precision`` is not set."""
    import lightning as L

    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False).precision


def precision_of(value: Any) -> str:
    """Lightning's name of ``trainer.precision`` (``bf16`` -> ``bf16-mixed``, ``32`` -> ``32-true``;
    ``None``: the ``Trainer``'s own default), as Lightning's connector converts it.

    Raises:
        GraspConfigError: not a precision Lightning knows.
    """
    from lightning.fabric.connector import _convert_precision_to_unified_args

    try:
        name = _convert_precision_to_unified_args(value)
    except ValueError as err:
        raise GraspConfigError(f"trainer.precision: {err}") from err
    return _trainer_default_precision() if name is None else str(name)


def task_label(task: Any) -> str:
    """The task's name in a report: its class name without the ``Task`` suffix (``GRPOTask`` -> ``GRPO``)."""
    name = type(task).__name__
    return name[:-4] if name.endswith("Task") and len(name) > 4 else name


def spec_from_run(module: GraspModule, datamodule: GraspDataModule, trainer: Any,
                  **extra: Any) -> tuple[RunSpec, list[str]]:
    """A :class:`RunSpec` from a run's instantiated module, DataModule and trainer settings.

    Args:
        module: the run's ``GraspModule`` (its policy is not loaded; only its settings are read).
        datamodule: the run's ``GraspDataModule`` (its ``loader``, ``video`` and ``prompt`` settings).
        trainer: the ``Trainer``'s settings (``precision``, ``strategy``, ``devices``, ``num_nodes``
            attributes), e.g. the ``trainer`` section of a parsed config, or a ``Trainer``.
        extra: :class:`RunSpec` fields a config does not hold (``video_seconds``, ``text_tokens``,
            ``response_tokens``, ``frame_size``, ``source_fps``).

    Returns:
        The spec and notes about assumptions made (an unknown model, ``devices: auto``).

    Raises:
        GraspConfigError: the strategy or precision is not modelled.
    """
    notes: list[str] = []
    task, policy, data = module.task, module.policy_cfg, datamodule
    name = str(policy.name_or_path)
    if not bundled_or_local(name):
        # a folder that is not here: the message fit, check-data and export stop with (run SFT and export first)
        missing = f"{missing_model_message(name)}. Planned" if is_missing_local_path(name) else \
            f"model {name!r} is not on this machine and not a bundled architecture (override model.policy.name_or_path): planned"
        notes.append(f"{missing} as {DEFAULT_ARCHITECTURE} (the GRASP paper's model)")
        name = DEFAULT_ARCHITECTURE
    values = dict(
        model=name, task=task_label(task), needs_reference=bool(task.needs_reference),
        samples_rollouts=bool(task.samples_rollouts), shares_prompt=bool(task.shares_prompt),
        devices=devices_of(trainer.devices, notes), num_nodes=int(trainer.num_nodes),
        precision=precision_of(trainer.precision), dtype=str(policy.dtype), freeze_vision=bool(policy.freeze_vision),
        lora=module.lora_cfg, separate_reference=module.reference_cfg.name_or_path is not None,
        gradient_checkpointing=bool(policy.gradient_checkpointing), attn_implementation=policy.attn_implementation,
        micro_batch_size=int(data.loader.batch_size), num_generations=int(module.rollout_cfg.num_generations),
        max_new_tokens=int(module.rollout_cfg.max_new_tokens), fps=float(data.video.fps),
        max_frames=int(data.video.max_frames), max_pixels=int(data.video.max_pixels),
        frame_max_tokens=data.video.frame_max_tokens, sampling=str(data.video.sampling),
        max_target_tokens=data.prompt.max_target_tokens,
        max_prompt_tokens=data.prompt.max_prompt_tokens, **strategy_settings(trainer.strategy),
        logprob_chunk_size=getattr(task, "logprob_chunk_size", None),
        sequence_parallel=int(module.sequence_parallel_size))
    rollout = module.rollout_cfg
    if task.samples_rollouts and rollout.engine == "vllm":
        colocated = rollout.vllm.address is None
        values.update(rollout_engine="vllm",
                      engine_memory_fraction=float(rollout.vllm.gpu_memory_utilization) if colocated else 0.0)
    values.update(extra)
    return RunSpec(**values), notes


def bundled_or_local(name: str) -> bool:
    """Whether ``name`` is a local model directory (with ``config.json``) or a bundled architecture."""
    return (Path(name) / "config.json").is_file() or bundled_name(name) is not None

