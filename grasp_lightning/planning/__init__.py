"""Planning a run before it starts: per-GPU memory and token counts of a config (``plan-memory``).

- :mod:`~grasp_lightning.planning.architectures`: published Qwen3-VL and Qwen3.5 shapes, parameters
  counted on the meta device, LoRA's adapters.
- :mod:`~grasp_lightning.planning.layers`: bytes of one decoder layer by kind (full attention, Gated
  DeltaNet linear attention): activations, the rollout's KV cache and linear-attention state.
- :mod:`~grasp_lightning.planning.tokens`: a clip's tokens as the Qwen3-VL processor writes them (Qwen3.5 reuses it).
- :mod:`~grasp_lightning.planning.spec`: the planner's inputs (:class:`RunSpec`), read from a run's objects.
- :mod:`~grasp_lightning.planning.estimate`: the bytes per GPU (:func:`plan_memory`), the verdict, the report.
- :mod:`~grasp_lightning.planning.tables`: the memory table of ``docs/scaling.md``.

The command is :mod:`grasp_lightning.commands.plan_memory`.
"""
