"""Sampling completions from the policy with transformers' ``generate``, shared by GRPO rollouts and
bench evaluation: left-padded prompts, a stop at ``</answer>``, vision placeholder tokens
suppressed, completions cut at the first end-of-turn and decoded once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Special tokens that must never be sampled: a sampled placeholder would make the next forward
#: fail with a token/feature count mismatch (``shared/stack-notes.md``).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


@dataclass
class Completions:
    """Sampled completions.

    Attributes:
        ids: ``(N, T)`` int64 completion token ids, right-padded with the pad id.
        mask: ``(N, T)`` bool, true on real completion tokens (up to and including the first
            end-of-turn token or the stop string).
        texts: ``N`` decoded completions (special tokens removed).
        truncated: ``(N,)`` bool, true where the completion hit ``max_new_tokens`` without stopping.
    """

    ids: torch.Tensor
    mask: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor


def vision_token_ids(tokenizer) -> list[int]:
    """Ids of the vision special tokens that exist in ``tokenizer``'s vocabulary."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in VISION_TOKENS if t in vocab]


def eos_ids(model, tokenizer) -> list[int]:
    """End-of-turn ids: the generation config's ``eos_token_id`` (int or list) and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def completion_mask(ids: torch.Tensor, stop_ids: list[int], pad_id: int | None = None) -> torch.Tensor:
    """``(N, T)`` bool mask of the real completion tokens of each row.

    A row ends after its first end-of-turn token (included) or before its first pad token
    (``generate`` pads rows that finished early, e.g. on a stop string), whichever comes first.
    When the pad id is itself an end-of-turn id, only the end-of-turn rule applies.

    Args:
        ids: ``(N, T)`` completion ids.
        stop_ids: end-of-turn token ids.
        pad_id: the padding id.
    """
    n, t = ids.shape
    positions = torch.arange(t, device=ids.device)

    def first(hit: torch.Tensor, offset: int) -> torch.Tensor:
        return torch.where(hit.any(1), hit.int().argmax(1) + offset, torch.full((n,), t, device=ids.device))

    stop = torch.tensor(stop_ids or [-1], device=ids.device)
    end = first(torch.isin(ids, stop), 1)
    if pad_id is not None and pad_id not in stop_ids:
        end = torch.minimum(end, first(ids == pad_id, 0))
    return positions[None, :] < end[:, None]


@torch.no_grad()
def sample_completions(model, tokenizer, inputs: dict[str, torch.Tensor], *, num_return_sequences: int = 1,
                       max_new_tokens: int = 1024, do_sample: bool = True, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int | None = None,
                       stop_strings: tuple[str, ...] = ("</answer>",), share_prompt: bool = False) -> Completions:
    """Generate ``K = num_return_sequences`` completions per prompt.

    Args:
        model: the policy (a transformers generation model, possibly peft-wrapped).
        tokenizer: its tokenizer (for stop strings and decoding).
        inputs: left-padded prompt inputs (``input_ids`` ``(B, L)``, ``attention_mask``,
            ``pixel_values_videos``, ``video_grid_thw``, ``mm_token_type_ids``).
        num_return_sequences: K; rows ``b*K .. b*K+K-1`` belong to prompt ``b``.
        max_new_tokens: completion budget in tokens.
        do_sample: sample (GRPO) or greedy (evaluation).
        temperature: sampling temperature (ignored when greedy).
        top_p: nucleus sampling mass.
        top_k: optional top-k.
        stop_strings: generation may stop once one of these has been produced.
        share_prompt: encode each clip and prefill each prompt once, then sample the K rows from the
            expanded cache (:func:`grasp_lightning.rollout.prefill_for_generation`); same tokens and
            logits as without, less work. Needs a model that
            :func:`grasp_lightning.rollout.sharing_unsupported_reason` accepts.

    Returns:
        :class:`Completions` with ``N = B * K`` rows.
    """
    prompt_len = inputs["input_ids"].shape[1]
    stop = eos_ids(model, tokenizer)
    gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, num_return_sequences=num_return_sequences,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=stop,
                      suppress_tokens=vision_token_ids(tokenizer))
    if do_sample:
        gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k is not None else 0)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    if stop_strings:
        gen_kwargs.update(stop_strings=list(stop_strings), tokenizer=tokenizer)
    if share_prompt and num_return_sequences > 1:
        from grasp_lightning.rollout import prefill_for_generation

        inputs, cache = prefill_for_generation(model, inputs, num_return_sequences)
        gen_kwargs.update(num_return_sequences=1, cache=cache)
    out = model.generate(**inputs, **gen_kwargs)
    ids = out[:, prompt_len:]
    if ids.shape[1] == 0:
        ids = torch.full((out.shape[0], 1), tokenizer.pad_token_id, dtype=out.dtype, device=out.device)
    mask = completion_mask(ids, stop, tokenizer.pad_token_id)
    ids = ids.masked_fill(~mask, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    ended = torch.isin(ids, torch.tensor(stop, device=ids.device)).any(1)
    stopped = torch.tensor([any(s in t for s in stop_strings) for t in texts], device=ids.device)
    truncated = ~(ended | stopped)
    return Completions(ids=ids, mask=mask, texts=texts, truncated=truncated)
