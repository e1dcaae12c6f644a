"""GRPO rollouts: the :class:`Rollout` container of one micro-batch's scored groups, the
:class:`SamplingStats` of sampling them, and how rollouts are merged, split by group and saved in a
checkpoint (``tasks/grpo.py`` samples and trains them, a window at a time).

Shapes: ``N = B * K`` rows (``B`` prompts, groups of ``K`` completions, group-major), ``Lp`` prompt and
``Lc`` completion tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from grasp_lightning.data.collate import Batch
from grasp_lightning.engines.decoding import Completions
from grasp_lightning.grpo.scoring import concat_prompts, select_prompts
from grasp_lightning.grpo.vision import VisionFeatures


@dataclass
class SamplingStats:
    """Time and counts of sampling rollouts: one generation call's (:meth:`GRPOTask.score_rollout
    <grasp_lightning.tasks.grpo.GRPOTask.score_rollout>`), or a whole window's (their sum, plus the group
    counts of dynamic sampling). Every figure is a float (whole numbers for the counts), as the step
    metrics reduce them and the checkpoint stores them (``dataclasses.asdict``).

    Attributes:
        rollout_s: wall time of the window's sampling, rewards and old/reference log-probs (s).
        generation_s: wall time of ``generate`` (s); ``rewards_s``: of the reward terms; ``logp_s``: of
            the old-policy and reference log-probs; ``weight_sync_s``: the engine's update of its copy of
            the weights first.
        generation_calls: ``generate`` calls; ``sequences``: completions they returned (``N``).
        generated_tokens: completion tokens sampled; ``prompt_tokens``: prompt tokens run through the
            language model (generation and old/reference scoring, padding included).
        groups_tried: groups sampled (drawn windows' included); ``groups_kept``: with distinct rewards and
            trained; ``groups_dropped``: with all rewards equal (``dynamic_sampling`` on); ``groups_unused``:
            drawn and not trained (``refill``); ``resample_tries``: windows drawn.
        reward_sum_tried, completions_tried: the reward sum and count over every group tried.
    """

    rollout_s: float = 0.0
    generation_s: float = 0.0
    rewards_s: float = 0.0
    logp_s: float = 0.0
    weight_sync_s: float = 0.0
    generation_calls: float = 0.0
    sequences: float = 0.0
    generated_tokens: float = 0.0
    prompt_tokens: float = 0.0
    groups_tried: float = 0.0
    groups_kept: float = 0.0
    groups_dropped: float = 0.0
    groups_unused: float = 0.0
    resample_tries: float = 0.0
    reward_sum_tried: float = 0.0
    completions_tried: float = 0.0

    def __add__(self, other: SamplingStats) -> SamplingStats:
        """Figure by figure sum (the figures of several generation calls)."""
        return SamplingStats(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                for f in dataclasses.fields(self)})


@dataclass
class Rollout:
    """The K completions of each prompt in a batch, scored, and the tensors the loss needs.

    Shapes: ``N = B * K`` rows, ``Lp`` prompt and ``Lc`` completion tokens.

    Attributes:
        prompt: model inputs of the ``B`` prompts (left-padded ``(B, Lp)``, vision inputs once).
        shared: the group's prompt work is shared (see :mod:`grasp_lightning.grpo.scoring`), else naive rows.
        completions: the sampled completions (``ids`` ``(N, Lc)``, ``mask`` ``(N, Lc)``).
        terms: ``(N, T)`` reward terms; ``rewards``: ``(N,)`` weighted sum.
        advantages: ``(N,)``; ``old_logp``/``ref_logp``: ``(N, Lc)`` or ``None``.
        zero_variance: ``(B,)`` bool, groups whose rewards are all equal.
        indices: dataset indices of the B prompts (to recognise a repeated batch).
        penalty: ``(N,)`` overlong penalty (≤ 0; zeros without ``overlong_buffer``).
        loss_mask: ``(N, Lc)`` the completion tokens the loss counts (zero-variance groups dropped
            when asked).
        items: the records of the B prompts (empty where a caller did not give them).
        sampled_logp: ``(N, Lc)`` the rollout engine's own log-probs of the sampled tokens (vLLM), or
            ``None`` (the HF engine: the trainer's scoring is the sampler's).
        vision: the frozen vision tower's outputs for the prompts' clips and images, computed once at
            the rollout and fed to every later forward of these prompts
            (:mod:`grasp_lightning.grpo.vision`); ``None`` where the tower trains.
        stats: the time and counts of sampling these rows (:class:`SamplingStats`; zeros for a
            selection of another rollout's rows).
    """

    prompt: dict[str, torch.Tensor]
    shared: bool
    completions: Completions
    terms: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    zero_variance: torch.Tensor
    indices: list[int]
    penalty: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    items: list = field(default_factory=list)
    sampled_logp: torch.Tensor | None = None
    vision: VisionFeatures | None = None
    stats: SamplingStats = field(default_factory=SamplingStats)

    @property
    def num_groups(self) -> int:
        """Prompts (groups) in the rollout."""
        return int(self.zero_variance.numel())

    @property
    def num_generations(self) -> int:
        """Completions per prompt ``K`` (``N / B``)."""
        return self.completions.ids.shape[0] // max(1, self.num_groups)

    def tensors_to(self, device: torch.device) -> None:
        """Move the completions and every row and token tensor to ``device`` (in place; ``prompt`` and
        ``vision`` are left as they are)."""
        for name in (*ROW_TENSORS, *TOKEN_TENSORS, "zero_variance"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        c = self.completions
        c.ids, c.mask, c.truncated = c.ids.to(device), c.mask.to(device), c.truncated.to(device)


ROW_TENSORS = ("terms", "rewards", "advantages", "penalty")
TOKEN_TENSORS = ("old_logp", "ref_logp", "loss_mask", "sampled_logp")


def merge_batches(batches: list[Batch], pad_token_id: int) -> Batch:
    """One left-padded prompt batch from several micro-batches (prompts, clips, items and indices in
    order; see :func:`grasp_lightning.grpo.scoring.concat_prompts`)."""
    if len(batches) == 1:
        return batches[0]
    prompts = [{k: v for k, v in b.inputs.items() if k != "labels"} for b in batches]
    return Batch(inputs=concat_prompts(prompts, pad_token_id), items=[it for b in batches for it in b.items],
                 indices=[i for b in batches for i in b.indices], valid=torch.cat([b.valid for b in batches]),
                 prompt_lengths=torch.cat([b.prompt_lengths for b in batches]), padding_side="left")


def _pad_cols(x: torch.Tensor, width: int, value) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value) if x.shape[1] < width else x


def cat_rollouts(ros: list[Rollout], pad_token_id: int) -> Rollout:
    """Rollouts of several generation calls as one (groups in order, completions right-padded to the widest).

    Raises:
        ValueError: no rollouts, or some shared the prompt work and some did not.
    """
    if not ros:
        raise ValueError("cat_rollouts: no rollouts")
    if len(ros) == 1:
        return ros[0]
    if len({ro.shared for ro in ros}) != 1:
        raise ValueError("cat_rollouts: shared and naive rollouts cannot be mixed")
    width = max(ro.completions.ids.shape[1] for ro in ros)

    def cat(name, value, cols):
        parts = [getattr(ro, name) for ro in ros]
        if any(p is None for p in parts):
            return None
        return torch.cat([_pad_cols(p, width, value) if cols else p for p in parts])

    c = [ro.completions for ro in ros]
    completions = Completions(
        ids=torch.cat([_pad_cols(x.ids, width, pad_token_id) for x in c]),
        mask=torch.cat([_pad_cols(x.mask, width, False) for x in c]), texts=[t for x in c for t in x.texts],
        truncated=torch.cat([x.truncated for x in c]), prompt_opened_think=[f for x in c for f in x.prompt_opened_think])
    out = Rollout(prompt=concat_prompts([ro.prompt for ro in ros], pad_token_id), shared=ros[0].shared,
                  completions=completions, terms=cat("terms", 0, False), rewards=cat("rewards", 0, False),
                  advantages=cat("advantages", 0, False), old_logp=cat("old_logp", 0.0, True),
                  ref_logp=cat("ref_logp", 0.0, True), zero_variance=torch.cat([ro.zero_variance for ro in ros]),
                  indices=[i for ro in ros for i in ro.indices], penalty=cat("penalty", 0.0, False),
                  loss_mask=cat("loss_mask", False, True), items=[it for ro in ros for it in ro.items],
                  sampled_logp=cat("sampled_logp", 0.0, True), vision=_merged_vision(ros),
                  stats=sum((ro.stats for ro in ros), SamplingStats()))
    return out


def _merged_vision(ros: list[Rollout]) -> VisionFeatures | None:
    """One store with every rollout's vision features (``None`` unless all have one)."""
    if any(ro.vision is None for ro in ros):
        return None
    merged = VisionFeatures(tower=ros[0].vision.tower)
    for ro in ros:
        merged.merge(ro.vision)
    return merged


def take_groups(ro: Rollout, groups: list[int], k: int) -> Rollout:
    """The rollout of groups ``groups`` (prompt indices of ``ro``): their prompts (common left padding
    removed), their ``K`` rows each, completion columns cut to the longest kept completion."""
    rows = [g * k + j for g in groups for j in range(k)]
    index = torch.tensor(rows, dtype=torch.long, device=ro.completions.ids.device)
    mask = ro.completions.mask.index_select(0, index)
    width = max(1, int(mask.sum(1).max())) if rows else 1
    c = ro.completions

    def rows_of(x, cols):
        if x is None:
            return None
        x = x.index_select(0, index.to(x.device))
        return x[:, :width] if cols else x

    completions = Completions(ids=rows_of(c.ids, True), mask=mask[:, :width], texts=[c.texts[r] for r in rows],
                              truncated=rows_of(c.truncated, False),
                              prompt_opened_think=[c.prompt_opened_think[r] for r in rows] if c.prompt_opened_think else [])
    gidx = torch.tensor(groups, dtype=torch.long, device=ro.zero_variance.device)
    return Rollout(prompt=select_prompts(ro.prompt, groups), shared=ro.shared, completions=completions,
                   terms=rows_of(ro.terms, False), rewards=rows_of(ro.rewards, False),
                   advantages=rows_of(ro.advantages, False), old_logp=rows_of(ro.old_logp, True),
                   ref_logp=rows_of(ro.ref_logp, True), zero_variance=ro.zero_variance.index_select(0, gidx),
                   indices=[ro.indices[g] for g in groups], penalty=rows_of(ro.penalty, False),
                   loss_mask=rows_of(ro.loss_mask, True), items=[ro.items[g] for g in groups] if ro.items else [],
                   sampled_logp=rows_of(ro.sampled_logp, True), vision=ro.vision)


def take_completion(ro: Rollout, j: int, k: int) -> Rollout:
    """Completion ``j`` (0 … k-1) of every group of ``ro``: ``B`` rows, one per prompt, with their group's
    advantage (computed over all ``k`` when the group was sampled). ``batching.micro_batch: rollout``: the
    released run trains one completion per prompt per micro-batch (``socialmllm/train/reasoning/trainer.py:138-164``).
    ``zero_variance`` stays the groups' (``(B,)``), so :attr:`Rollout.num_generations` of the result is 1.

    Raises:
        ValueError: ``j`` is not in ``0 … k-1``.
    """
    if not 0 <= j < k:
        raise ValueError(f"take_completion: completion {j} of groups of {k}")
    rows = [g * k + j for g in range(ro.num_groups)]
    index = torch.tensor(rows, dtype=torch.long, device=ro.completions.ids.device)
    c = ro.completions

    def rows_of(x):
        return None if x is None else x.index_select(0, index.to(x.device))

    completions = Completions(ids=rows_of(c.ids), mask=rows_of(c.mask), texts=[c.texts[r] for r in rows],
                              truncated=rows_of(c.truncated),
                              prompt_opened_think=[c.prompt_opened_think[r] for r in rows] if c.prompt_opened_think else [])
    return Rollout(prompt=ro.prompt, shared=ro.shared, completions=completions, terms=rows_of(ro.terms),
                   rewards=rows_of(ro.rewards), advantages=rows_of(ro.advantages), old_logp=rows_of(ro.old_logp),
                   ref_logp=rows_of(ro.ref_logp), zero_variance=ro.zero_variance, indices=list(ro.indices),
                   penalty=rows_of(ro.penalty), loss_mask=rows_of(ro.loss_mask), items=list(ro.items),
                   sampled_logp=rows_of(ro.sampled_logp), vision=ro.vision)


def even_split(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous chunks of ``n`` items, as even as possible (larger first); ``[]`` for
    nothing into no parts (a rank whose whole window was skipped).

    Raises:
        ValueError: ``n > 0`` items into no parts, or a negative count.
    """
    if n < 0 or parts < 0 or (n and not parts):
        raise ValueError(f"even_split: cannot split {n} items into {parts} parts")
    if not parts:
        return []
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


def refill_selection(zero_variance: list[bool], target: int) -> tuple[list[int], int]:
    """The groups ``dynamic_sampling: refill`` trains, from every group sampled for a window.

    The first ``target`` groups with distinct rewards, in sampling order (the window's own prompts, then
    each drawn window's), then, if there are fewer, degenerate groups (all rewards equal: masked out of
    the loss) up to ``target``, as DAPO and verl trim the filtered batch to the batch size. Useful groups
    beyond ``target`` are sampled and scored but not trained: *drawn and unused* (their prompts are not
    returned to the stream; the caller logs their count).

    Args:
        zero_variance: per group sampled, in order, whether its rewards are all equal.
        target: groups the window trains (its prompts on this rank; 0 for an empty window).

    Returns:
        ``(selected, unused)``: indices of at most ``target`` groups (useful first), and the count of useful
        groups left out.
    """
    useful = [g for g, z in enumerate(zero_variance) if not z]
    degenerate = [g for g, z in enumerate(zero_variance) if z]
    selected = (useful + degenerate)[:target]
    return selected, max(0, len(useful) - target)


def rollout_state(ro: Rollout) -> dict:
    """A rollout as plain CPU tensors and lists: its completions, rewards, advantages and log-probs. Nothing
    derived from the data is kept: the prompt, the items and the vision features (``ro.vision``) are left out,
    to be re-read, decoded and encoded again on resume (:meth:`~grasp_lightning.grpo.sampling.WindowCache.attach`;
    the features of one clip at 8B widths are about 184 MiB)."""
    c = ro.completions
    out = {"shared": bool(ro.shared), "indices": list(ro.indices), "texts": list(c.texts),
           "opened": list(c.prompt_opened_think), "ids": c.ids.cpu(), "mask": c.mask.cpu(),
           "truncated": c.truncated.cpu(), "zero_variance": ro.zero_variance.cpu(), "prompt_tokens": int(ro.stats.prompt_tokens)}
    for name in (*ROW_TENSORS, *TOKEN_TENSORS):
        value = getattr(ro, name)
        out[name] = None if value is None else value.detach().cpu()
    return out


def rollout_from_state(state: dict) -> Rollout:
    """The inverse of :func:`rollout_state` (``prompt``, ``items`` and ``vision`` still empty)."""
    completions = Completions(ids=state["ids"], mask=state["mask"], texts=list(state["texts"]),
                              truncated=state["truncated"], prompt_opened_think=list(state["opened"]))
    return Rollout(prompt=None, shared=bool(state["shared"]), completions=completions, terms=state["terms"],
                   rewards=state["rewards"], advantages=state["advantages"], old_logp=state["old_logp"],
                   ref_logp=state["ref_logp"], zero_variance=state["zero_variance"], indices=list(state["indices"]),
                   penalty=state["penalty"], loss_mask=state["loss_mask"], sampled_logp=state.get("sampled_logp"),
                   stats=SamplingStats(prompt_tokens=float(state["prompt_tokens"])))
