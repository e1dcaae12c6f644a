"""Ulysses sequence parallelism for the decoder of Qwen3-VL and Qwen3.5 (training forwards).

One sample's sequence is split over the ``N`` ranks of a sequence-parallel (SP) group: every rank
holds the whole sample (the data loader gives the group the same one), runs the vision tower and the
embedding over it, and from the first decoder layer on keeps only its chunk of ``ceil(S / N)``
positions. Per-token work (norms, MLPs, projections, the LM head) runs on the chunk; the token
mixers exchange chunks for heads (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509):

* **attention** (Qwen3-VL, Qwen3.5's full-attention layers): queries, keys and values go through an
  all-to-all from ``(B, H, S/N, D)`` to ``(B, H/N, S, D)``: each rank attends over the whole sequence
  with ``H/N`` heads (key/value heads are repeated when there are fewer than ``N``), then a second
  all-to-all returns ``(B, S/N, H, D)``;
* **Gated DeltaNet** (Qwen3.5's linear-attention layers): the projected ``q, k, v`` channels and the
  ``a, b`` gates go through the same all-to-all; each rank runs the causal convolution (its
  channels' weights) and the chunked gated delta rule over the full sequence for its ``H_v/N`` value
  heads (``H_k/N`` key heads), and the output comes back by sequence before the gated norm.

The sequence is padded on the right to a multiple of ``N`` between the decoder layers only: after
the first all-to-all the padding is cut off, so no padded position ever enters attention, a
convolution, a recurrent state or a cache, and everything transformers builds for the sequence
(the causal mask, M-RoPE positions, the linear-attention padding mask) is built for the unpadded
length ``S`` as without SP. Caches written under SP (the group-shared prompt of
:mod:`grasp_lightning.grpo.scoring`) hold whole-sequence keys/values and states of the rank's heads,
so a later forward reading them continues exactly.

The model's output stays split: ``logits`` (or hidden states) are ``(B, S_pad/N, ·)`` for the
positions :attr:`SequenceParallel.lo` .. ``lo + chunk``. Callers compute per-token quantities
(cross-entropy, log-probs, entropies) on their chunk and combine them with :func:`gather_disjoint`,
so every rank of the group then holds the same per-token values and the same loss. The backward of
each rank gives the gradient of its chunk's positions; their sum over the group is the whole
sample's gradient. DDP and DeepSpeed average gradients over all ``W`` ranks, so the loss is scaled
by ``N`` before the backward (:attr:`SequenceParallel.loss_scale`) and the averaged gradient is the
one of ``W / N`` data-parallel replicas.

Generation is not split (the rollout engines decode with the whole prompt on each rank).

DeepSpeed 0.19's ``UlyssesSPAttentionHF`` (``deepspeed.runtime.sequence_parallel.ulysses_sp``) makes the
same exchange around transformers' attention function, but cannot serve these models as it stands: it
drops the attention mask (left-padded prompts and a completion forward reading a cached prompt need
it), it exchanges after the cache update (a cache would hold sequence chunks, not whole sequences), it
all-gathers the ``position_ids`` the attention receives, which Qwen3-VL's decoder layers get as ``None``
(the M-RoPE positions ``(3, B, S)`` become rotary embeddings before the layers), and Gated DeltaNet
layers do not go through the attention function at all. The exchange here is the same all-to-all, placed
before the cache update, in forwards of the two mixer kinds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from grasp_lightning.errors import GraspConfigError


# ---------------------------------------------------------------------------------------- communication
class _AllToAll(torch.autograd.Function):
    """Split ``x`` into ``N`` blocks along ``scatter_dim``, send block ``i`` to rank ``i`` of ``group``, and
    concatenate the received blocks (rank order) along ``gather_dim``. The backward is the inverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    n = dist.get_world_size(group)
    send = torch.stack([part.contiguous() for part in x.chunk(n, scatter_dim)])
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(list(received.unbind(0)), dim=gather_dim)


class _SumDisjoint(torch.autograd.Function):
    """All-reduce (sum) of per-rank tensors that are zero outside each rank's own positions.

    Forward: the group's sum, which places every rank's values (adding zeros is exact). Backward: the
    incoming gradient unchanged: every rank computes the same loss from the sum, so the gradient of
    its own (non-zero) entries is the incoming one and no exchange is needed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


# ---------------------------------------------------------------------------------------- the group
@dataclasses.dataclass(frozen=True)
class SplitLayout:
    """How one forward's sequence of ``length`` positions is split over ``size`` ranks; this rank is ``rank``.

    The sequence is padded on the right to :attr:`padded` (a multiple of ``size``); rank ``r`` holds
    positions ``r * chunk .. (r + 1) * chunk - 1``.
    """

    size: int
    rank: int
    length: int

    @property
    def chunk(self) -> int:
        """Positions per rank: ``ceil(length / size)``."""
        return math.ceil(self.length / self.size)

    @property
    def padded(self) -> int:
        """``length`` padded on the right to a multiple of ``size``."""
        return self.chunk * self.size

    @property
    def lo(self) -> int:
        """First position of this rank's chunk."""
        return self.rank * self.chunk

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's chunk of ``x`` along ``dim`` (of size ``length``), the tail zero-padded to ``chunk``.

        Raises:
            ValueError: ``x.shape[dim] != length``.
        """
        dim = dim % x.dim()
        if x.shape[dim] != self.length:
            raise ValueError(f"expected length {self.length} along dim {dim}, got shape {tuple(x.shape)}")
        pad = self.padded - self.length
        if pad:
            x = F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, pad])
        return x.narrow(dim, self.lo, self.chunk)

    def local_span(self, start: int, stop: int) -> tuple[int, int]:
        """The positions of ``[start, stop)`` in this rank's chunk, as global ``(first, last)`` (equal when none)."""
        first = max(start, self.lo)
        return first, max(first, min(stop, self.lo + self.chunk, self.length))


@dataclasses.dataclass
class SequenceParallel:
    """This rank's sequence-parallel group.

    Attributes:
        size: ranks per group ``N`` (1: no split).
        rank: this rank's index in its group, ``0 .. N-1``.
        group: the ``torch.distributed`` process group of the ``N`` ranks (``None`` when ``size == 1``).
        data_group: the process group of the ranks holding the same position of their groups: one rank per
            sample, the data-parallel replicas (``None`` when ``size == 1``: the default group).
        active: forwards started now are split (set by :meth:`splitting`).
        last_length: the sequence length ``S`` of the last split forward (read by callers after it).
    """

    size: int = 1
    rank: int = 0
    group: Any = None
    data_group: Any = None
    active: bool = False
    last_length: int = 0

    @property
    def loss_scale(self) -> float:
        """Factor on the loss before the backward: ``N`` (DDP/DeepSpeed average over all ranks, see module docs)."""
        return float(self.size)

    def layout(self, length: int | None = None) -> SplitLayout:
        """The split of a sequence of ``length`` positions (default: the last split forward's)."""
        return SplitLayout(self.size, self.rank, self.last_length if length is None else length)

    @contextlib.contextmanager
    def splitting(self):
        """Forwards of an installed model (:func:`install`) started inside are split (no-op for ``size == 1``)."""
        previous, self.active = self.active, self.size > 1
        try:
            yield self
        finally:
            self.active = previous

    def sum_disjoint(self, x: torch.Tensor) -> torch.Tensor:
        """:class:`_SumDisjoint` over the group (identity when ``size == 1``)."""
        return x if self.size == 1 else _SumDisjoint.apply(x, self.group)

    def all_to_all(self, x: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        """:class:`_AllToAll` over the group."""
        return _AllToAll.apply(x, self.group, scatter_dim, gather_dim)

    def broadcast(self, obj: Any) -> Any:
        """The group's rank 0's ``obj`` on every rank of the group (``broadcast_object_list``); collective."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        return box[0]


def new_groups(size: int) -> SequenceParallel:
    """Split the initialised world into groups of ``size`` consecutive ranks; this rank's group.

    Every rank must call it (``torch.distributed.new_group`` is collective). Ranks ``g*N .. g*N+N-1``
    form group ``g`` and read the batches of data-parallel rank ``g`` (``GraspDataModule.connect``), and the
    ranks ``p, p+N, p+2N, ..`` form the data group of position ``p`` (one rank per sample).

    Raises:
        GraspConfigError: ``size < 1``, or ``size > 1`` without an initialised process group, or a
            world size that ``size`` does not divide.
    """
    if size < 1:
        raise GraspConfigError(f"model.sequence_parallel must be >= 1, got {size}")
    if size == 1:
        return SequenceParallel()
    if not (dist.is_available() and dist.is_initialized()):
        raise GraspConfigError(f"model.sequence_parallel: {size} needs a distributed run (trainer.devices / "
                               "num_nodes giving a multiple of it); this run has one process")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise GraspConfigError(f"model.sequence_parallel: {size} does not divide the {world} ranks of this run "
                               "(trainer.devices x trainer.num_nodes): the groups are ranks g*N .. g*N+N-1; set it to "
                               f"a divisor of {world} that the model's heads allow")
    mine = data = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = group
    for position in range(size):
        group = dist.new_group(list(range(position, world, size)))
        if rank % size == position:
            data = group
    return SequenceParallel(size=size, rank=rank % size, group=mine, data_group=data)


# ---------------------------------------------------------------------------------------- the model
def text_model(model) -> torch.nn.Module:
    """The decoder stack (``Qwen3VLTextModel`` / ``Qwen3_5TextModel``) of a Qwen-VL model, through peft.

    Raises:
        GraspConfigError: the model has no ``language_model`` with ``layers`` and ``rotary_emb``.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    for candidate in (getattr(getattr(inner, "model", None), "language_model", None),
                      getattr(inner, "language_model", None)):
        if candidate is not None and hasattr(candidate, "layers") and hasattr(candidate, "rotary_emb"):
            return candidate
    raise GraspConfigError(f"model.sequence_parallel needs a Qwen3-VL or Qwen3.5 model (a language_model "
                           f"with decoder layers and rotary embeddings); {type(inner).__name__} has none")


def unsupported_reason(model, size: int) -> str | None:
    """Why the decoder of ``model`` cannot be split over ``size`` ranks, or ``None`` when it can
    (:func:`config_unsupported_reason` of its text config)."""
    return config_unsupported_reason(text_model(model).config, size)


def config_unsupported_reason(cfg, size: int) -> str | None:
    """Why a decoder of the ``transformers`` text config ``cfg`` cannot be split over ``size`` ranks, or ``None``.

    Attention heads (query and key/value: one divides the other) and the Gated DeltaNet key and value
    heads must divide evenly over the ranks; only full and linear attention layers are covered (not
    sliding-window ones). The memory planner applies the same rule to the published shapes.
    """
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % size:
        return f"{heads} attention heads do not split over {size} ranks"
    if kv % size and size % kv:
        return f"{kv} key/value heads and {size} ranks: neither divides the other"
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "linear_attention"}:
        return f"decoder layer types {sorted(kinds - {'full_attention', 'linear_attention'})} are not covered"
    if "linear_attention" in kinds:
        for name in ("linear_num_key_heads", "linear_num_value_heads"):
            if getattr(cfg, name) % size:
                return f"{getattr(cfg, name)} Gated DeltaNet heads ({name}) do not split over {size} ranks"
    return None


def _module_function(module: torch.nn.Module, name: str):
    """A function of the transformers module that defines ``module``'s class (``apply_rotary_pos_emb`` ...)."""
    return getattr(sys.modules[type(module).__module__], name)


#: The keyword the text model's pre-hook adds to a split forward's arguments; transformers passes it on to
#: every decoder layer and token mixer (and gradient checkpointing keeps it for the recompute).
LENGTH_KEY = "sequence_parallel_length"


def _attention_forward(self, sp: SequenceParallel, hidden_states, position_embeddings=None,
                       attention_mask=None, cache=None, past_key_values=None, **kwargs):
    """Ulysses forward of a ``Qwen3VLTextAttention`` / ``Qwen3_5Attention`` on a chunk ``(B, S/N, D)``.

    The same computation as transformers' forward (Qwen3.5's output gate included), with the
    sequence/head exchange around the attention and the cache update."""
    length = kwargs.pop(LENGTH_KEY)
    cache = cache if cache is not None else past_key_values
    layout = sp.layout(length)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    projected = self.q_proj(hidden_states)
    gated = projected.shape[-1] == 2 * self.config.num_attention_heads * self.head_dim
    if gated:
        query, gate = torch.chunk(projected.view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
        gate = gate.reshape(*input_shape, -1)
    else:
        query = projected
    query = self.q_norm(query.reshape(hidden_shape)).transpose(1, 2)
    key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query, key = _module_function(self, "apply_rotary_pos_emb")(query, key, cos, sin)

    repeat = max(1, sp.size // key.shape[1])  # fewer key/value heads than ranks: each rank gets a copy of one
    if repeat > 1:
        key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    query, key, value = (sp.all_to_all(t, 1, 2)[:, :, :length] for t in (query, key, value))  # (B, H/N, S, D)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    interface = _module_function(self, "ALL_ATTENTION_FUNCTIONS").get_interface(
        self.config._attn_implementation, _module_function(self, "eager_attention_forward"))
    groups = self.num_key_value_groups
    self.num_key_value_groups = query.shape[1] // key.shape[1]
    try:
        out, _ = interface(self, query, key, value, attention_mask,
                           dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
    finally:
        self.num_key_value_groups = groups
    out = F.pad(out, (0, 0, 0, 0, 0, layout.padded - length))  # (B, S_pad, H/N, D)
    out = sp.all_to_all(out, 1, 2).reshape(*input_shape, -1)  # (B, S/N, H*D)
    if gated:
        out = out * torch.sigmoid(gate)
    return self.o_proj(out), None


def _gated_deltanet_forward(self, sp: SequenceParallel, hidden_states, cache=None, attention_mask=None,
                            cache_params=None, **kwargs):
    """Ulysses forward of a ``Qwen3_5GatedDeltaNet`` on a chunk ``(B, S/N, D)``: heads split, whole sequence.

    The same computation as transformers' forward without its single-token decode branch (training
    forwards only): the padding mask, the causal convolution (with the cache's window), the chunked
    gated delta rule (with the cache's recurrent state), the gated norm and the output projection."""
    length = kwargs.pop(LENGTH_KEY)
    cache = cache if cache is not None else cache_params
    layout = sp.layout(length)
    if attention_mask is not None:
        attention_mask = layout.shard(attention_mask)
    hidden_states = _module_function(self, "apply_mask_to_padding_states")(hidden_states, attention_mask)
    batch, chunk, _ = hidden_states.shape
    n, r = sp.size, sp.rank
    hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
    q, k, v = torch.split(self.in_proj_qkv(hidden_states), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    z = self.in_proj_z(hidden_states)
    b, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)

    def exchange(t, heads):  # (B, S/N, heads*d) -> (B, S, heads/N, d)
        return sp.all_to_all(t.reshape(batch, chunk, heads, -1), 2, 1)[:, :length]

    q, k, v = exchange(q, hk), exchange(k, hk), exchange(v, hv)
    b, a = exchange(b, hv).squeeze(-1), exchange(a, hv).squeeze(-1)
    lk, lv = hk // n, hv // n
    weight = self.conv1d.weight.squeeze(1)  # (C, kernel), channels [q | k | v], head-major
    local = torch.cat([weight[r * lk * dk:(r + 1) * lk * dk],
                       weight[self.key_dim + r * lk * dk:self.key_dim + (r + 1) * lk * dk],
                       weight[2 * self.key_dim + r * lv * dv:2 * self.key_dim + (r + 1) * lv * dv]])
    mixed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], -1).transpose(1, 2)  # (B, C/N, S)
    if cache is not None:
        mixed = cache.update_conv_state(mixed, self.layer_idx, state_idx=0, conv_kernel_size=self.conv_kernel_size)
    mixed = _module_function(self, "causal_conv1d_fn")(mixed, local, None, activation=self.activation)
    mixed = mixed[:, :, -length:].transpose(1, 2)
    q, k, v = torch.split(mixed, [lk * dk, lk * dk, lv * dv], dim=-1)
    q, k, v = q.reshape(batch, length, lk, dk), k.reshape(batch, length, lk, dk), v.reshape(batch, length, lv, dv)
    heads = slice(r * lv, (r + 1) * lv)
    beta = b.sigmoid()
    g = -self.A_log[heads].float().exp() * F.softplus(a.float() + self.dt_bias[heads])
    state = cache.get_recurrent_state(self.layer_idx, state_idx=0) if cache is not None else None
    core, last = _module_function(self, "torch_chunk_gated_delta_rule")(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=cache is not None,
        use_qk_l2norm_in_kernel=True)
    if cache is not None:
        cache.update_recurrent_state(last, self.layer_idx)
    core = F.pad(core, (0, 0, 0, 0, 0, layout.padded - length))  # (B, S_pad, H_v/N, d_v)
    core = sp.all_to_all(core, 1, 2)  # (B, S/N, H_v, d_v)
    core = self.norm(core.reshape(-1, dv), z.reshape(-1, dv)).reshape(batch, chunk, -1)
    return self.out_proj(core)


def _deepstack_process(sp: SequenceParallel, original):
    """Qwen3-VL's deepstack addition; on a chunk (hidden shorter than the mask), the visual rows in it."""

    def process(hidden_states, visual_pos_masks, visual_embeds):
        if hidden_states.shape[1] == visual_pos_masks.shape[1]:
            return original(hidden_states, visual_pos_masks, visual_embeds)
        layout = sp.layout(visual_pos_masks.shape[1])
        mask = visual_pos_masks.to(hidden_states.device)
        index = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
        index[mask] = torch.arange(int(mask.sum()), device=mask.device)
        local_mask = layout.shard(mask)
        rows = layout.shard(index)[local_mask]
        hidden_states = hidden_states.clone()
        hidden_states[local_mask, :] = hidden_states[local_mask, :] + visual_embeds.to(
            hidden_states.device, hidden_states.dtype)[rows]
        return hidden_states

    return process


def install(model, sp: SequenceParallel) -> None:
    """Make ``model``'s decoder split its forwards over ``sp``'s ranks while :meth:`SequenceParallel.splitting`.

    Installs, on the model's text model: a pre-hook that, for a split forward, records ``S`` and
    passes :data:`LENGTH_KEY` on to the layers; a hook sharding the rotary ``(cos, sin)``; a pre-hook on
    the first decoder layer sharding the hidden states; the Ulysses forwards of the attention and
    Gated DeltaNet modules; Qwen3-VL's chunked deepstack. Outside :meth:`~SequenceParallel.splitting`
    (generation, evaluation) every forward is transformers' own. Stays installed (a backward with
    gradient checkpointing recomputes split layers after the forward returned). No-op for ``size == 1``.
    Every rank of the group must run the same split forwards (the exchanges are collective).

    Raises:
        GraspConfigError: the model cannot be split over ``sp.size`` ranks (:func:`unsupported_reason`).
    """
    if sp.size == 1:
        return
    reason = unsupported_reason(model, sp.size)
    if reason:
        raise GraspConfigError(f"model.sequence_parallel: {sp.size}: {reason}")
    text = text_model(model)
    if getattr(text, "_grasp_sequence_parallel", None) is not None:
        return
    _install_hooks(text, sp)
    for layer in text.layers:
        for name, forward in (("self_attn", _attention_forward), ("linear_attn", _gated_deltanet_forward)):
            mixer = getattr(layer, name, None)
            if mixer is not None:
                mixer._grasp_sequence_parallel = sp
                mixer.__class__ = _split_class(type(mixer), forward)
    if hasattr(text, "_deepstack_process"):
        text._deepstack_process = _deepstack_process(sp, text._deepstack_process)
    text._grasp_sequence_parallel = sp


#: The split classes made so far: ``{transformers mixer class: its subclass}`` (:func:`_split_class`).
_SPLIT_CLASSES: dict[type, type] = {}


def _split_class(cls: type, forward) -> type:
    """A subclass of the mixer class ``cls`` whose call runs ``forward`` (the Ulysses one) for a split forward.

    The dispatch is in ``__call__``, looked up on the class, because transformers swaps a layer's
    ``forward`` when it (re-)kernelizes the model (``PreTrainedModel.train``/``eval`` with Hub kernels:
    ``kernels`` pops or replaces the instance's ``forward``); a call without :data:`LENGTH_KEY` is
    ``nn.Module.__call__`` (hooks, then whatever ``forward`` the module has). The subclass keeps the
    class's name and module, so ``apply_rotary_pos_emb`` and the other functions resolve as transformers'.
    """
    if cls in _SPLIT_CLASSES or cls in _SPLIT_CLASSES.values():
        return _SPLIT_CLASSES.get(cls, cls)

    def __call__(self, *args, **kwargs):
        if kwargs.get(LENGTH_KEY) is None:
            kwargs.pop(LENGTH_KEY, None)
            return torch.nn.Module.__call__(self, *args, **kwargs)
        return forward(self, self._grasp_sequence_parallel, *args, **kwargs)

    _SPLIT_CLASSES[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                                      "__qualname__": cls.__qualname__})
    return _SPLIT_CLASSES[cls]


def _install_hooks(text: torch.nn.Module, sp: SequenceParallel) -> None:
    """The text model's hooks of :func:`install`: record ``S`` and pass :data:`LENGTH_KEY` on, shard the
    rotary ``(cos, sin)``, shard the hidden states entering the first decoder layer."""
    rotary_pending: list[int] = []

    def record(module, args, kwargs):
        if not sp.active:
            return None
        embeds = kwargs.get("inputs_embeds")
        ids = kwargs.get("input_ids", args[0] if args else None)
        sp.last_length = (embeds if embeds is not None else ids).shape[1]
        rotary_pending.append(sp.last_length)
        return args, {**kwargs, LENGTH_KEY: sp.last_length}

    def shard_rotary(module, args, output):
        if not rotary_pending:
            return None
        layout = sp.layout(rotary_pending.pop())
        return tuple(layout.shard(t) for t in output)

    def shard_hidden(module, args, kwargs):
        length = kwargs.get(LENGTH_KEY)
        if length is None:
            return None
        layout = sp.layout(length)
        if args:
            return (layout.shard(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": layout.shard(kwargs["hidden_states"])}

    text.register_forward_pre_hook(record, with_kwargs=True)
    text.rotary_emb.register_forward_hook(shard_rotary)
    text.layers[0].register_forward_pre_hook(shard_hidden, with_kwargs=True)
