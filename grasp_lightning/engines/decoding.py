"""Decoding: sampling completions from the policy with transformers' ``generate`` (and ``RolloutConfig``,
the ``model.rollout`` settings), used by both GRPO rollouts and evaluation: left-padded prompts, a stop at ``</answer>``, vision placeholder tokens
suppressed, completions cut at the first sampled end-of-turn token or stop string (never at padding,
which Qwen3-VL's generation config writes with an end-of-turn id) and decoded once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grasp_lightning.data.prompts import VISION_TOKENS
from grasp_lightning.engines.vllm_config import ENGINES, VLLMConfig
from grasp_lightning.errors import GraspConfigError, is_count, is_number, require
from grasp_lightning.parsing import opens_think


@dataclass
class Completions:
    """Sampled completions.

    Attributes:
        ids: ``(N, T)`` int64 completion token ids, right-padded with the pad id.
        mask: ``(N, T)`` bool, true on the tokens ``generate`` sampled: up to and including the
            first sampled end-of-turn token or the token that completes the stop string, never on
            padding (:func:`completion_ends`), even where the pad id is an end-of-turn id.
        texts: ``N`` decoded completions (special tokens removed).
        truncated: ``(N,)`` bool, true where the completion hit ``max_new_tokens`` without stopping.
        prompt_opened_think: ``N`` flags, true where the row's prompt ended inside an opened
            ``<think>`` (a Thinking template's generation prompt), so the completion starts inside
            the think block; rewards and parsers take it as ``opened_think``.
        sampled_logp: ``(N, T)`` float32 log-probs of the sampled tokens as the rollout engine computed
            them (vLLM's, after temperature; 0 on padding), or ``None`` (Hugging Face ``generate``: the
            trainer's own scoring is the sampler's). Their gap to the trainer's is a health metric.
    """

    ids: torch.Tensor
    mask: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor
    prompt_opened_think: list[bool] = field(default_factory=list)
    sampled_logp: torch.Tensor | None = None


@dataclass
class RolloutConfig:
    """Sampling of training rollouts (GRPO): K completions per prompt from the current policy.

    The config key is ``model.rollout``; ``GraspModule`` holds the one instance and tasks read it
    from their context (:class:`grasp_lightning.task.TaskContext`, ``rollout_cfg``), never copying it.
    Importable from :mod:`grasp_lightning.module` with the other ``model.*`` setting groups.

    Attributes:
        num_generations: K completions per prompt, a group (paper: 8); a group stays on one rank.
        max_new_tokens: completion budget in tokens (paper: 1024).
        temperature: sampling temperature (paper: 1.0); scoring logits are divided by it too.
        top_p: nucleus sampling mass.
        top_k: optional top-k.
        stop_at_answer: a completion may stop at ``</answer>``.
        engine: who samples the rollouts: ``hf`` (transformers' ``generate`` in the trainer, with the
            group-shared prefill; the default and the reference) or ``vllm`` (a vLLM server in its own
            environment and process, :class:`grasp_lightning.engines.vllm.VLLMEngine`). The trainer
            computes the loss's log-probs itself with either.
        vllm: the vLLM engine's settings (:class:`grasp_lightning.engines.vllm_config.VLLMConfig`).
        compile_decode: the HF engine decodes with a static KV cache and a ``torch.compile``-d decode
            step (:mod:`grasp_lightning.engines.compiled_decode`), group-shared prefill kept; the same tokens
            as eager decoding. Off by default: compiling costs time on the first step and on every new
            prompt length, and pays on a GPU.
        compile_backend: the ``torch.compile`` backend of ``compile_decode`` (``inductor``: CUDA graphs
            on a GPU; ``aot_eager`` where no C compiler is available).
        overlap: ``1``: the vLLM server samples window ``t+1`` while the trainer updates on window
            ``t``, with the weights of the step before (one step stale, never more; NeMo-RL's and verl's
            one-step off-policy GRPO). Needs ``engine: vllm``; the task turns the truncated
            importance-sampling correction on with it (``GRPOTask.importance_sampling_cap``, 2.0 unless
            set). ``0`` (default): sampling and the update alternate. See ``docs/rollout-engines.md``.

    Raises:
        GraspConfigError: a value out of range (the message names ``model.rollout.<key>``), or
            ``overlap: 1`` with an engine other than ``vllm``.
    """

    num_generations: int = 8
    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_at_answer: bool = True
    engine: str = "hf"
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    compile_decode: bool = False
    compile_backend: str = "inductor"
    overlap: int = 0

    def __post_init__(self) -> None:
        k = "model.rollout."
        require(self.engine in ENGINES, k + "engine", f"one of {list(ENGINES)}", self.engine)
        if isinstance(self.vllm, dict):  # from a checkpoint's hyperparameters
            self.vllm = VLLMConfig(**self.vllm)
        require(is_count(self.num_generations), k + "num_generations", "an integer >= 1", self.num_generations)
        require(is_count(self.max_new_tokens), k + "max_new_tokens", "an integer >= 1", self.max_new_tokens)
        require(is_number(self.temperature) and self.temperature > 0, k + "temperature", "a number > 0", self.temperature)
        require(is_number(self.top_p) and 0 < self.top_p <= 1, k + "top_p", "a number in (0, 1]", self.top_p)
        require(is_count(self.top_k, optional=True), k + "top_k", "an integer >= 1 or null", self.top_k)
        require(isinstance(self.compile_decode, bool), k + "compile_decode", "true or false", self.compile_decode)
        require(isinstance(self.compile_backend, str) and bool(self.compile_backend), k + "compile_backend",
                "a torch.compile backend name", self.compile_backend)
        require(type(self.overlap) is int and self.overlap in (0, 1), k + "overlap", "0 or 1", self.overlap)
        if self.overlap and self.engine != "vllm":
            raise GraspConfigError(f"model.rollout.overlap=1 needs model.rollout.engine=vllm (got "
                                   f"{self.engine!r}): only a server in its own process can sample while the "
                                   "trainer updates")


def vision_token_ids(tokenizer) -> list[int]:
    """Ids of the vision special tokens that exist in ``tokenizer``'s vocabulary: never sampled, since a
    sampled placeholder makes the next forward fail with a token/feature count mismatch."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in VISION_TOKENS if t in vocab]


def eos_ids(model, tokenizer) -> list[int]:
    """End-of-turn ids: the generation config's ``eos_token_id`` (int or list) and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def stop_string_ends(ids: torch.Tensor, tokenizer, stop_strings: tuple[str, ...] | list[str],
                     limits: torch.Tensor | None = None) -> torch.Tensor:
    """``(N,)`` int64: for each row, the number of tokens up to and including the one that completes a
    stop string, or ``-1`` where no stop string occurs.

    The stop token is the first token at which the decoded row (special tokens written out, no
    clean-up of spaces) contains one of ``stop_strings``; that is the token at which transformers'
    ``StopStringCriteria`` ends a row, overhangs included (a token ``"er>\n"`` that completes
    ``"</answer>"`` is the stop token). Found by bisection on the prefix length, as containing a
    stop string is monotone in it.

    Args:
        ids: ``(N, T)`` completion ids.
        tokenizer: the tokenizer that decodes them.
        stop_strings: the stop strings; empty gives ``-1`` everywhere.
        limits: ``(N,)`` optional number of leading tokens of each row to search (tokens).
    """
    n, t = ids.shape
    out = torch.full((n,), -1, dtype=torch.long)
    if not stop_strings or t == 0:
        return out.to(ids.device)
    rows = ids.tolist()

    def has_stop(row: list[int], length: int) -> bool:
        text = tokenizer.decode(row[:length], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return any(s in text for s in stop_strings)

    for i, row in enumerate(rows):
        hi = t if limits is None else int(limits[i])
        if hi <= 0 or not has_stop(row, hi):
            continue
        lo = 1  # smallest prefix length that may contain a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if has_stop(row, mid):
                hi = mid
            else:
                lo = mid + 1
        out[i] = hi
    return out.to(ids.device)


def prompt_opens_think(tokenizer, input_ids: torch.Tensor, num_return_sequences: int = 1,
                       attention_mask: torch.Tensor | None = None, tail: int = 8) -> list[bool]:
    """Whether each prompt ends inside an opened ``<think>`` block, repeated for its K rows.

    Decodes the last ``tail`` real tokens of each prompt (special tokens written out) and applies
    :func:`grasp_lightning.parsing.opens_think`: true after a Qwen3 Thinking generation prompt
    (``<|im_start|>assistant\n<think>\n``), false after an Instruct one.

    Args:
        tokenizer: the prompt's tokenizer.
        input_ids: ``(B, L)`` prompt ids.
        num_return_sequences: K; each prompt's flag is repeated K times (``B * K`` flags).
        attention_mask: ``(B, L)`` optional, 1 on real tokens (any padding side); without it the
            prompts are taken as left-padded.
        tail: tokens decoded from the end of each prompt.
    """
    flags = []
    for b in range(input_ids.shape[0]):
        row = input_ids[b] if attention_mask is None else input_ids[b][attention_mask[b].bool()]
        text = tokenizer.decode(row[-tail:].tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        flags.extend([opens_think(text)] * num_return_sequences)
    return flags


def completion_ends(ids: torch.Tensor, stop_ids: list[int], tokenizer=None,
                    stop_strings: tuple[str, ...] | list[str] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Length and end reason of each sampled completion.

    A row ends at its first end-of-turn token (included) or at the token that completes a stop
    string (included, :func:`stop_string_ends`), whichever comes first; a row with neither ran to the
    end of ``ids``. Padding never ends a row and is never counted: ``generate`` pads a row only after
    it finished by one of those two rules, so a pad id that is also an end-of-turn id (Qwen3-VL's
    generation config: ``eos_token_id [151645, 151643]``, ``pad_token_id 151643``) is counted only
    where it was sampled, i.e. before any other end.

    Args:
        ids: ``(N, T)`` completion ids as ``generate`` returned them (prompt removed).
        stop_ids: end-of-turn token ids.
        tokenizer: decodes ids for the stop strings (needed when ``stop_strings`` is not empty).
        stop_strings: the stop strings generation was given.

    Returns:
        ``(lengths, finished)``: ``(N,)`` int64 completion lengths in tokens, and ``(N,)`` bool, true
        where the row ended on an end-of-turn token or a stop string (false: it hit the budget).

    Raises:
        ValueError: if ``stop_strings`` are given without a tokenizer.
    """
    n, t = ids.shape
    if stop_strings and tokenizer is None:
        raise ValueError("completion_ends: stop_strings need the tokenizer that decodes the ids")
    hit = torch.isin(ids, torch.tensor(list(stop_ids) or [-1], device=ids.device))
    eos_end = torch.where(hit.any(1), hit.int().argmax(1) + 1, torch.full((n,), t, device=ids.device))
    stop_end = stop_string_ends(ids, tokenizer, stop_strings, limits=eos_end)
    by_stop = stop_end > 0
    lengths = torch.where(by_stop, stop_end, eos_end)
    return lengths, hit.any(1) | by_stop


def completion_mask(ids: torch.Tensor, stop_ids: list[int], tokenizer=None,
                    stop_strings: tuple[str, ...] | list[str] = ()) -> torch.Tensor:
    """``(N, T)`` bool mask of the real (sampled) completion tokens of each row.

    True on the first ``length`` tokens of each row, lengths from :func:`completion_ends` (end at
    the first end-of-turn token or the stop-string token, both included; never at padding).

    Args:
        ids: ``(N, T)`` completion ids.
        stop_ids: end-of-turn token ids.
        tokenizer: decodes ids for the stop strings.
        stop_strings: the stop strings generation was given.

    Raises:
        ValueError: if ``stop_strings`` are given without a tokenizer.
    """
    lengths, _ = completion_ends(ids, stop_ids, tokenizer, stop_strings)
    return torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]


@torch.no_grad()
def sample_completions(model, tokenizer, inputs: dict[str, torch.Tensor], *, num_return_sequences: int = 1,
                       max_new_tokens: int = 1024, do_sample: bool = True, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int | None = None,
                       stop_strings: tuple[str, ...] = ("</answer>",), share_prompt: bool = False,
                       compile_decode: bool = False, compile_backend="inductor", streamer=None) -> Completions:
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
            expanded cache (:func:`grasp_lightning.grpo.scoring.prefill_for_generation`); same tokens and
            logits as without, less work. Needs a model that
            :func:`grasp_lightning.grpo.scoring.sharing_unsupported_reason` accepts.
        compile_decode: decode with a static KV cache and a compiled decode step
            (:mod:`grasp_lightning.engines.compiled_decode`; with ``share_prompt`` the shared prefill fills the
            static cache). Same tokens as eager decoding; log-probs to float tolerance.
        compile_backend: the ``torch.compile`` backend (a name, or a callable) of ``compile_decode``.
        streamer: a transformers streamer (``TextStreamer``) that ``generate`` hands each new token to
            (``chat`` on a terminal); ``None``: none.

    Returns:
        :class:`Completions` with ``N = B * K`` rows.

    Raises:
        GraspConfigError: ``compile_decode`` on a model whose cache has no compileable static form.
    """
    prompt_len = inputs["input_ids"].shape[1]
    prompt_ids, prompt_mask = inputs["input_ids"], inputs.get("attention_mask")
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
    if streamer is not None:
        gen_kwargs.update(streamer=streamer)
    if compile_decode:
        from grasp_lightning.engines.compiled_decode import decode_compile_config, prefill_static, static_cache_for

        gen_kwargs.update(compile_config=decode_compile_config(compile_backend))
        if share_prompt and num_return_sequences > 1:
            inputs, cache = prefill_static(model, inputs, num_return_sequences, max_new_tokens)
            gen_kwargs.update(num_return_sequences=1, cache=cache)
        else:
            static_cache_for(model, 1)  # refuses a model without a compileable static cache, by name
            gen_kwargs.update(cache_implementation="static")
    elif share_prompt and num_return_sequences > 1:
        from grasp_lightning.grpo.scoring import prefill_for_generation

        inputs, cache = prefill_for_generation(model, inputs, num_return_sequences)
        gen_kwargs.update(num_return_sequences=1, cache=cache)
    out = model.generate(**inputs, **gen_kwargs)
    return finish_completions(out[:, prompt_len:], tokenizer, stop, tuple(stop_strings), prompt_ids, prompt_mask,
                              num_return_sequences)


def finish_completions(ids: torch.Tensor, tokenizer, stop_ids: list[int], stop_strings: tuple[str, ...],
                       prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, num_return_sequences: int,
                       sampled_logp: torch.Tensor | None = None) -> Completions:
    """:class:`Completions` from sampled ids, the same for every rollout engine: each row cut at its first
    end-of-turn token or stop string (:func:`completion_ends`), padding written with the pad id, decoded once.

    Args:
        ids: ``(N, T)`` sampled ids (prompt removed), right-padded with anything.
        tokenizer: decodes them; its ``pad_token_id`` fills the padding.
        stop_ids: end-of-turn ids (:func:`eos_ids`).
        stop_strings: the stop strings sampling was given.
        prompt_ids, prompt_mask: ``(B, L)`` the prompts, for :func:`prompt_opens_think`.
        num_return_sequences: K, rows per prompt.
        sampled_logp: ``(N, T)`` the sampler's log-probs of the sampled tokens, or ``None``; zeroed on padding.
    """
    lengths, finished = completion_ends(ids, stop_ids, tokenizer, stop_strings)
    if ids.shape[1] == 0:  # nothing generated: one pad column, masked out
        ids = torch.full((ids.shape[0], 1), tokenizer.pad_token_id, dtype=ids.dtype, device=ids.device)
        if sampled_logp is not None:
            sampled_logp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    mask = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
    ids = ids.masked_fill(~mask, tokenizer.pad_token_id)
    if sampled_logp is not None:
        sampled_logp = sampled_logp.masked_fill(~mask, 0.0)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return Completions(ids=ids, mask=mask, texts=texts, truncated=~finished,
                       prompt_opened_think=prompt_opens_think(tokenizer, prompt_ids, num_return_sequences, prompt_mask),
                       sampled_logp=sampled_logp)
