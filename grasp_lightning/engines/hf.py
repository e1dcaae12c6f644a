"""The Hugging Face rollout engine: transformers' ``generate`` on the trainer's own policy (``model.rollout.engine: hf``,
the default and the reference the vLLM engine is checked against)."""

from __future__ import annotations

from grasp_lightning.engines.base import RolloutEngine
from grasp_lightning.engines.decoding import Completions, sample_completions


class HFEngine(RolloutEngine):
    """transformers' ``generate`` on the policy itself (:func:`grasp_lightning.engines.decoding.sample_completions`),
    eager or with ``model.rollout.compile_decode``'s static cache and compiled decode step; nothing to sync,
    nothing to close."""

    name = "hf"

    def sample(self, policy, tokenizer, prompt, cfg, *, share_prompt=False, policy_version=0) -> Completions:
        """See :meth:`RolloutEngine.sample`; ``policy_version`` is unused (the policy samples itself)."""
        return sample_completions(
            policy, tokenizer, prompt, num_return_sequences=cfg.num_generations, max_new_tokens=cfg.max_new_tokens,
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            stop_strings=("</answer>",) if cfg.stop_at_answer else (), share_prompt=share_prompt,
            compile_decode=cfg.compile_decode, compile_backend=cfg.compile_backend)

    def answer(self, policy, tokenizer, prompt, *, max_new_tokens, do_sample=False, temperature=1.0, top_p=1.0,
               stop_strings=(), policy_version=0, streamer=None) -> Completions:
        """See :meth:`RolloutEngine.answer`: ``generate`` on the policy, no group-shared prefill; ``streamer``
        (a transformers ``TextStreamer``, or ``None``) receives each token as it is generated."""
        return sample_completions(
            policy, tokenizer, prompt, num_return_sequences=1, max_new_tokens=max_new_tokens, do_sample=do_sample,
            temperature=temperature, top_p=top_p, stop_strings=tuple(stop_strings), streamer=streamer)

