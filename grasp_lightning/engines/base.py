"""The rollout-engine interface (see :mod:`grasp_lightning.engines`); the engines: :mod:`~grasp_lightning.engines.hf`,
:mod:`~grasp_lightning.engines.vllm`."""

from __future__ import annotations

import torch

from grasp_lightning.decoding import Completions, RolloutConfig


class RolloutEngine:
    """What a rollout engine does (the interface ``tasks/grpo.py`` calls).

    Attributes:
        name: ``"hf"`` or ``"vllm"``.
        weight_sync_seconds: wall time of the last weight update (0 where none was needed).
    """

    name = "base"
    weight_sync_seconds = 0.0

    def sample(self, policy, tokenizer, prompt: dict[str, torch.Tensor], cfg: RolloutConfig, *,
               share_prompt: bool = False, policy_version: int = 0) -> Completions:
        """``K = cfg.num_generations`` completions per prompt, rows ``b*K .. b*K+K-1`` for prompt ``b``.

        Args:
            policy: the trainer's policy (the HF engine samples from it; the vLLM engine computes the
                video embeddings with its frozen vision tower and reads its weights to sync).
            tokenizer: the policy's tokenizer.
            prompt: left-padded prompt inputs (``input_ids`` ``(B, L)``, ``attention_mask``,
                ``pixel_values_videos``, ``video_grid_thw``, ``mm_token_type_ids``).
            cfg: ``model.rollout``.
            share_prompt: the HF engine's group-shared prefill (ignored by engines that share anyway).
            policy_version: the number of optimizer steps taken so far; an engine holding a copy of
                the weights updates it first when its copy is older.

        Returns:
            :class:`~grasp_lightning.decoding.Completions` with ``N = B * K`` rows.
        """
        raise NotImplementedError

    def answer(self, policy, tokenizer, prompt: dict[str, torch.Tensor], *, max_new_tokens: int,
               do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
               stop_strings: tuple[str, ...] = (), policy_version: int = 0) -> Completions:
        """One completion per prompt with the ``model.evaluation`` decoding (validation, test, predict).

        Args:
            policy: the trainer's policy, in eval mode.
            tokenizer: its tokenizer.
            prompt: left-padded prompt inputs, as for :meth:`sample`.
            max_new_tokens: completion budget in tokens.
            do_sample: sample (``temperature``, ``top_p``) instead of greedy decoding.
            temperature: sampling temperature (ignored when greedy).
            top_p: nucleus mass (ignored when greedy).
            stop_strings: a completion may stop once one of these has been produced.
            policy_version: the version of the weights being evaluated; an engine holding a copy of the
                weights updates it first when its copy is another.

        Returns:
            :class:`~grasp_lightning.decoding.Completions` with ``B`` rows.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the engine (stop a server this process started). Idempotent."""
