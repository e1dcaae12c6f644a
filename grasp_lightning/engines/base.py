"""The rollout-engine interface (see :mod:`grasp_lightning.engines`); the engines: :mod:`~grasp_lightning.engines.hf`,
:mod:`~grasp_lightning.engines.vllm`."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from grasp_lightning.engines.decoding import Completions, RolloutConfig


@dataclass
class PendingSample:
    """A sampling request handed to an engine now and collected later (``model.rollout.overlap``).

    Attributes:
        version: optimizer steps the weights that sample it reflect (the engine's copy when it was served).
        generation_seconds: wall time of the request itself (seconds; set once it is answered).
        wait_seconds: wall time :meth:`RolloutEngine.collect` blocked waiting for it (seconds).
        future: the request in flight (``None`` once answered synchronously).
        finish: turns the server's answer into :class:`~grasp_lightning.engines.decoding.Completions`.
        completions: the answer, once collected.
    """

    version: int = 0
    generation_seconds: float = 0.0
    wait_seconds: float = 0.0
    future: Future | None = None
    finish: Callable | None = None
    completions: Completions | None = field(default=None, repr=False)

    @property
    def hidden_seconds(self) -> float:
        """Seconds of its generation that ran while the trainer did something else (``generation − wait``, ≥ 0)."""
        return max(0.0, self.generation_seconds - self.wait_seconds)


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
            :class:`~grasp_lightning.engines.decoding.Completions` with ``N = B * K`` rows.
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
            :class:`~grasp_lightning.engines.decoding.Completions` with ``B`` rows.
        """
        raise NotImplementedError

    def submit(self, policy, tokenizer, prompt: dict[str, torch.Tensor], cfg: RolloutConfig, *,
               policy_version: int = 0) -> PendingSample:
        """Hand :meth:`sample`'s request to the engine and return at once where it can run beside the trainer
        (the vLLM server); here it samples now, nothing hidden. Collect it with :meth:`collect`."""
        t0 = time.perf_counter()
        out = self.sample(policy, tokenizer, prompt, cfg, policy_version=policy_version)
        seconds = time.perf_counter() - t0
        return PendingSample(version=policy_version, generation_seconds=seconds, wait_seconds=seconds, completions=out)

    def collect(self, pending: PendingSample) -> Completions:
        """The completions of :meth:`submit`'s request, waiting for them (``pending.wait_seconds``).

        Raises:
            EngineError: from the vLLM engine, when its request failed.
        """
        if pending.completions is None:
            t0 = time.perf_counter()
            answer = pending.future.result()
            pending.wait_seconds = time.perf_counter() - t0
            pending.completions, pending.future = pending.finish(answer), None
        return pending.completions

    def close(self) -> None:
        """Release the engine (stop a server this process started). Idempotent."""
