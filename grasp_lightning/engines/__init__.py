"""Rollout engines: who samples GRPO's K completions per prompt (``model.rollout.engine``).

One interface, two engines:

* :class:`~grasp_lightning.engines.hf.HFEngine` (``hf``, the default and the reference): transformers' ``generate`` on the
  trainer's own policy, with the exact group-shared prefill (:mod:`grasp_lightning.grpo.scoring`).
* :class:`grasp_lightning.engines.vllm.VLLMEngine` (``vllm``): a vLLM server in vLLM's own Python
  environment and process, fed the trainer's video and image embeddings, its weights reloaded after
  every optimizer step that changed the policy; it can also decode evaluation (``model.evaluation.engine``).

A task reads its engine from its context (``TaskContext.rollout_engine``: the module's
:attr:`~grasp_lightning.module.GraspModule.rollout_engine`); there is no fallback engine. Either way
the trainer scores the completions itself for the loss; an engine's own sampled-token (``Completions.sampled_logp``) are a health metric and, optionally, the denominator of
TRL-style truncated importance sampling (``GRPOTask.importance_sampling_cap``).

The interface: :mod:`grasp_lightning.engines.base`; the HF engine: :mod:`grasp_lightning.engines.hf`; the vLLM client:
:mod:`grasp_lightning.engines.vllm`; its server: :mod:`grasp_lightning.engines.server.vllm_server`; settings:
:mod:`grasp_lightning.engines.vllm_config`.

Import only what you use: this package's ``__init__`` imports nothing at module level, because
:mod:`grasp_lightning.engines.decoding` reads :mod:`grasp_lightning.engines.vllm_config`.
"""


def make_engine(cfg, *, model_path: str | None = None, rank: int = 0):
    """The :class:`~grasp_lightning.engines.base.RolloutEngine` ``cfg.engine`` names; a vLLM engine is only
    configured here (its server starts at the first ``sample``).

    Args:
        cfg: ``model.rollout`` (:class:`grasp_lightning.engines.decoding.RolloutConfig`).
        model_path: what a vLLM server loads when ``model.rollout.vllm.model`` is unset
            (``model.policy.name_or_path``).
        rank: this process's global rank (names the server's log and weight files).

    Raises:
        GraspConfigError: ``vllm`` without its Python or address (from :class:`~grasp_lightning.engines.vllm.VLLMEngine`).
    """
    if cfg.engine == "vllm":
        from grasp_lightning.engines.vllm import VLLMEngine

        return VLLMEngine(cfg.vllm, model_path=cfg.vllm.model or model_path, rank=rank)
    from grasp_lightning.engines.hf import HFEngine

    return HFEngine()

