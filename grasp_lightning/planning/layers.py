"""Bytes of one decoder layer: what autograd keeps for backward, the rollout's cache and state, prefill working sets.

A decoder layer is one of two kinds (``text_config.layer_types``): ``full_attention`` (every Qwen3-VL
layer; every ``full_attention_interval``-th = 4th Qwen3.5 layer) or ``linear_attention`` (Qwen3.5's
Gated DeltaNet, ``transformers/models/qwen3_5/modeling_qwen3_5.py: Qwen3_5GatedDeltaNet``). The
counts are of the tensors the ``transformers`` 5 modeling code leaves for the backward pass, read from
that code and checked against ``torch.autograd.graph.saved_tensors_hooks`` on small layers of both
families in bf16 (``tests/unit/planning/test_estimate.py``; equal up to a few per-call constants such as the 64 x 64
chunk mask). Widths: ``h`` hidden, ``i`` MLP, ``a`` heads, ``g`` KV heads, ``d`` head dim; Gated
DeltaNet: ``H_k``/``H_v`` key/value heads of ``d_k``/``d_v``, ``key_dim = H_k d_k``, ``value_dim =
H_v d_v``, ``conv_dim = 2 key_dim + value_dim``, chunk ``C = 64``.

What is modelled and what is not:

- transformers' pure-torch paths (``torch_chunk_gated_delta_rule``, ``causal_conv1d_fn``), which it
  falls back to without the ``flash-linear-attention`` and ``causal-conv1d`` packages (neither is a
  dependency here). flash-linear-attention's fused chunk kernel recomputes the per-chunk states in
  its backward pass instead of keeping them, so with it installed the linear-attention activations
  here are an over-estimate (by how much is not measured).
- Activations are counted with the module in bf16 and no autocast (DeepSpeed's bf16). Under
  ``bf16-mixed`` autocast (one GPU, DDP, LoRA) the rule's matrix products save bf16 copies of their
  float32 inputs instead; on the tests' small layer that keeps about 2 % less (not modelled apart).
- A frozen Linear (LoRA's base weights) keeps no input for a weight gradient; the count keeps the
  full fine-tune's set (an over-estimate for LoRA).
- Padding to whole 64-token chunks (at most 63 tokens per row and forward) is ignored.
- RoPE's cos/sin are computed once per forward and shared by the layers: not counted per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``chunk_size`` of ``torch_chunk_gated_delta_rule`` (tokens), as ``Qwen3_5GatedDeltaNet`` calls it.
DELTA_RULE_CHUNK = 64
FULL, LINEAR = "full_attention", "linear_attention"


def layer_kinds(text) -> tuple[str, ...]:
    """The decoder's layer kinds in order: ``text.layer_types``, or all ``full_attention`` when unset."""
    kinds = getattr(text, "layer_types", None)
    return tuple(kinds) if kinds else (FULL,) * text.num_hidden_layers


@dataclass(frozen=True)
class TextShapes:
    """The widths of a text config the byte counts need (:func:`text_shapes`).

    Attributes:
        hidden, intermediate, heads, kv_heads, head_dim: ``h``, ``i``, ``a``, ``g``, ``d``.
        kinds: the layer kinds in order (:func:`layer_kinds`).
        output_gate: full attention multiplies its output by ``sigmoid(gate)`` (Qwen3.5's ``q_proj``
            writes query and gate, ``2 a d``).
        zero_centred_norm: the RMSNorm multiplies by ``1 + w`` in float32 (``Qwen3_5RMSNorm``) rather
            than casting back to 16 bit before ``w`` (Qwen3-VL): it keeps a float32 normalised copy.
        k_heads, v_heads, k_dim, v_dim, conv_kernel: Gated DeltaNet's ``H_k``, ``H_v``, ``d_k``,
            ``d_v`` and ``linear_conv_kernel_dim`` (taps); 0 without linear-attention layers.
    """

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    kinds: tuple[str, ...]
    output_gate: bool = False
    zero_centred_norm: bool = False
    k_heads: int = 0
    v_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0
    conv_kernel: int = 0

    @property
    def full_layers(self) -> int:
        """Layers with a KV cache."""
        return self.kinds.count(FULL)

    @property
    def linear_layers(self) -> int:
        """Gated DeltaNet layers (a convolution window and a recurrent state, no KV cache)."""
        return self.kinds.count(LINEAR)

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: ``2 H_k d_k + H_v d_v`` (q, k and v before the split)."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim


def text_shapes(text) -> TextShapes:
    """:class:`TextShapes` of a ``transformers`` text config (Qwen3-VL's or Qwen3.5's)."""
    qwen3_5 = str(getattr(text, "model_type", "")).startswith("qwen3_5")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    linear = dict(k_heads=text.linear_num_key_heads, v_heads=text.linear_num_value_heads,
                  k_dim=text.linear_key_head_dim, v_dim=text.linear_value_head_dim,
                  conv_kernel=text.linear_conv_kernel_dim) if LINEAR in layer_kinds(text) else {}
    return TextShapes(text.hidden_size, text.intermediate_size, text.num_attention_heads, text.num_key_value_heads,
                      head_dim, layer_kinds(text), output_gate=qwen3_5, zero_centred_norm=qwen3_5, **linear)


# ------------------------------------------------------------------------------- rollout cache and state
def kv_bytes_per_token(s: TextShapes) -> int:
    """KV-cache bytes per token: K and V x full-attention layers x ``g`` x ``d`` x 2 B (bf16).
    Linear-attention layers keep none (:func:`linear_state_bytes`)."""
    return 2 * s.full_layers * s.kv_heads * s.head_dim * 2


def linear_state_bytes(s: TextShapes) -> int:
    """Bytes per sequence of the linear-attention layers' generation state, constant in its length.

    Per Gated DeltaNet layer (``transformers.cache_utils.LinearAttentionLayer``): the causal
    convolution's window ``(conv_dim, conv_kernel)`` in the model dtype (2 B; its inputs' dtype) and
    the recurrent state ``(H_v, d_k, d_v)`` in float32 (4 B: ``torch_chunk_gated_delta_rule`` and
    ``torch_recurrent_gated_delta_rule`` compute in float32 and return the state so). Qwen3.5-9B:
    ``24 x (8192 x 4 x 2 + 32 x 128 x 128 x 4) = 51,904,512 B`` (49.5 MiB) per sequence.
    """
    return s.linear_layers * (s.conv_dim * s.conv_kernel * 2 + s.v_heads * s.k_dim * s.v_dim * 4)


def prefill_working_bytes(s: TextShapes) -> int:
    """Bytes per prompt token of one layer's no-grad working set in the prefill (the larger kind's).

    Full attention: the MLP's ``2 B x (2h + 3i)`` (residual, normed input, gate, up, SiLU(gate)).
    Gated DeltaNet (counted from ``torch_chunk_gated_delta_rule``, not measured): the float32
    tensors alive after the triangular solves, ``4 B x H_v (6 d_k + 4 d_v + 3 C)`` (q, k, v, k_beta,
    v_beta, decayed k_beta, the solved values and decayed keys, the output, one product being formed;
    the pairwise decays, the triangular system, the intra-chunk attention), plus the layer's 16-bit
    residual, normed input, convolved qkv and gate ``z``: ``2 B x (2h + conv_dim + value_dim)``.
    """
    mlp = 2 * (2 * s.hidden + 3 * s.intermediate)
    if not s.linear_layers:
        return mlp
    rule = 4 * s.v_heads * (6 * s.k_dim + 4 * s.v_dim + 3 * DELTA_RULE_CHUNK)
    return max(mlp, rule + 2 * (2 * s.hidden + s.conv_dim + s.v_heads * s.v_dim))


# ---------------------------------------------------------------------------------------- activations
def rms_norm_bytes(width: int, rows: int = 1, *, zero_centred: bool = False) -> int:
    """Bytes an RMSNorm over ``width`` channels in ``rows`` rows keeps per token: its float32 input
    (4 B, for ``pow`` and the product), the normalised tensor the weight's gradient needs (float32 for
    Qwen3.5's ``(1 + w)`` norm, 16-bit for Qwen3-VL's) and one float32 ``rsqrt`` per row."""
    return 4 * width + (4 if zero_centred else 2) * width + 4 * rows


def full_attention_layer_bytes(s: TextShapes, seq_len: int, *, flash: bool = True, sequence_parallel: int = 1) -> int:
    """Bytes a full-attention decoder layer keeps for backward, per token (16-bit activations).

    Input and post-attention norms (:func:`rms_norm_bytes`) and their 16-bit outputs, which the
    projections keep (``2 x 2h``); q/k-norm over ``(a + g) d`` in ``a + g`` rows; q, k after RoPE and
    v, ``2 (a + 2g) d``, the attention output (= the ``o_proj`` input) ``2 a d`` and the float32
    log-sum-exp ``4 a`` that flash/SDPA attention keeps; Qwen3.5's output gate adds ``sigmoid(gate)``,
    the gated product and a contiguous copy of the output, ``3 x 2 a d``; the SwiGLU MLP keeps gate,
    up, SiLU(gate) and their product, ``2 x 4i``. With ``eager`` attention the scores are stored too:
    Korthikanti et al. 2022's ``5 a s`` bytes (Sec. 4.1, Eq. 1), ``s = seq_len``.

    Per token of a rank's chunk under Ulysses sequence parallelism over ``N = sequence_parallel`` ranks
    (:mod:`grasp_lightning.sequence_parallel`): attention keeps q, k, v for the whole sequence and
    ``a/N`` heads, as many bytes as the chunk's for all heads, except that with fewer key/value heads
    than ranks (``g < N``) each rank holds one repeated key/value head, ``max(g, N)`` in place of ``g``.
    Eager scores, ``a/N`` heads x ``s^2`` per rank, are the same ``5 a s`` per chunk token.
    """
    h, a, g, d = s.hidden, s.heads, s.kv_heads, s.head_dim
    norms = 2 * (rms_norm_bytes(h, zero_centred=s.zero_centred_norm) + 2 * h)
    qk_norm = rms_norm_bytes((a + g) * d, a + g, zero_centred=s.zero_centred_norm)
    held_kv = max(g, sequence_parallel) if sequence_parallel > 1 else g
    attention = 2 * (a + 2 * held_kv) * d + 2 * a * d + 4 * a + (6 * a * d if s.output_gate else 0)
    return norms + qk_norm + attention + 8 * s.intermediate + (0 if flash else 5 * a * seq_len)


def linear_attention_layer_bytes(s: TextShapes) -> int:
    """Bytes a Gated DeltaNet decoder layer keeps for backward, per token (bf16 module, torch path).

    Counted from ``Qwen3_5GatedDeltaNet.forward`` and ``torch_chunk_gated_delta_rule``:

    - norms and MLP as in :func:`full_attention_layer_bytes`;
    - convolution: its input and the SiLU's input, ``2 x 2 conv_dim``;
    - gates: ``beta``, the decay ``g`` and its in-chunk cumulative sums, ``34 H_v`` bytes;
    - the chunked rule in float32 (4 B): ``8 H_v d_k`` (float32 q and k repeated to ``H_v`` heads
      for the L2 norm, their normalised/padded forms, ``k_beta``, the solved decayed keys, q and k
      decayed for the chunk scan), ``3 H_v d_v`` (padded v, the solved values, each chunk's
      corrected values), ``5 H_v C`` (per chunk of C tokens: two ``C x C`` products, the pairwise
      decays, the triangular system, the intra-chunk attention) and the recurrent state
      ``(H_v, d_k, d_v)`` the scan keeps for every chunk, ``H_v d_k d_v / C`` per token;
    - the gated RMSNorm and ``out_proj``: ``18 value_dim`` (float32 input, gate and SiLU(gate);
      16-bit normalised, weighted and ``out_proj`` input) + ``4 H_v`` (``rsqrt`` per head row).

    Qwen3.5-9B: 541,896 B per token, 253,952 B of them the rule's (32,768 B its states), against
    266,392 B for one of its full-attention layers.
    """
    h, hv = s.hidden, s.v_heads
    norms = 2 * (rms_norm_bytes(h, zero_centred=s.zero_centred_norm) + 2 * h)
    value_dim = hv * s.v_dim
    rule = 4 * (8 * hv * s.k_dim + 3 * value_dim + 5 * hv * DELTA_RULE_CHUNK)
    states = 4 * hv * s.k_dim * s.v_dim // DELTA_RULE_CHUNK
    gated_norm = 18 * value_dim + 4 * hv
    return norms + 2 * 2 * s.conv_dim + 34 * hv + rule + states + gated_norm + 8 * s.intermediate


def decoder_layer_bytes(s: TextShapes, seq_len: int, *, flash: bool = True, sequence_parallel: int = 1) -> dict[str, int]:
    """Bytes per token each kind of decoder layer in ``s`` keeps for backward, by kind (per token of a
    rank's chunk under sequence parallelism: a Gated DeltaNet layer's ``H/N`` heads over the whole
    sequence keep what the chunk's ``H`` heads would, :func:`full_attention_layer_bytes` for attention)."""
    kinds: dict[str, int] = {}
    if s.full_layers:
        kinds[FULL] = full_attention_layer_bytes(s, seq_len, flash=flash, sequence_parallel=sequence_parallel)
    if s.linear_layers:
        kinds[LINEAR] = linear_attention_layer_bytes(s)
    return kinds


def all_to_all_bytes(s: TextShapes, sequence_parallel: int) -> int:
    """Bytes per token of a rank's chunk of the Ulysses all-to-all buffers, one layer at a time (0 for ``N = 1``).

    The exchange (``grasp_lightning.sequence_parallel._all_to_all``) stacks the chunk's blocks into a send
    buffer and receives into a second one of the same size, both 16-bit: for attention q, k and v
    (``a + 2 max(g, N)`` heads of ``d``), for Gated DeltaNet the convolution's ``conv_dim`` channels and the
    ``a``, ``b`` gates (``2 H_v``); the larger kind's, ``2 x 2 B`` per element.
    """
    if sequence_parallel <= 1:
        return 0
    exchanged = 0
    if s.full_layers:
        exchanged = (s.heads + 2 * max(s.kv_heads, sequence_parallel)) * s.head_dim
    if s.linear_layers:
        exchanged = max(exchanged, s.conv_dim + 2 * s.v_heads)
    return 2 * 2 * exchanged


def decoder_stack_bytes(tokens: int, s: TextShapes, per_kind: dict[str, int], *, extra_per_layer: int = 0,
                        checkpointing: bool) -> int:
    """Activations of the decoder stack for ``tokens`` tokens, in bytes.

    Without checkpointing every layer keeps its kind's ``per_kind`` bytes per token (plus
    ``extra_per_layer``). With transformers' per-layer checkpointing (``GradientCheckpointingLayer``)
    each layer keeps only its 16-bit input (``2 h`` bytes per token), and one layer's full set exists
    again while it is recomputed in the backward pass: the largest kind's.
    """
    if checkpointing:
        return tokens * (len(s.kinds) * 2 * s.hidden + max(per_kind.values()) + extra_per_layer)
    return tokens * sum(s.kinds.count(kind) * (b + extra_per_layer) for kind, b in per_kind.items())


def layer_activation_bytes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, seq_len: int,
                           *, gated_mlp: bool = True, qk_norm: bool = True, flash: bool = True) -> int:
    """Bytes one vision-tower block keeps for the backward pass, per patch, with 16-bit activations.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    Sec. 4.1, Eq. 1) count ``s b h (34 + 5 a s / h)`` bytes per GPT layer, recounted in 16-bit
    elements: attention: norm input ``h``, QKV input ``h``, Q, K, V ``(a + 2g) d``, Q and K before
    q/k-norm ``(a + g) d`` (if ``qk_norm``), output-projection input ``a d``; MLP: norm input ``h``,
    its input ``h``, gate, up, SiLU(gate) and product ``4 i`` (a plain GELU MLP: ``2 i``). With
    ``eager`` attention Korthikanti's ``5 a s`` bytes are added. Not checked against autograd (the
    decoder's layers are: :func:`full_attention_layer_bytes`, :func:`linear_attention_layer_bytes`).

    Returns:
        bytes per token (multiply by tokens).
    """
    attn = 2 * hidden + (heads + 2 * kv_heads) * head_dim + heads * head_dim + (qk_norm * (heads + kv_heads) * head_dim)
    mlp = 2 * hidden + (4 if gated_mlp else 2) * intermediate
    return 2 * (attn + mlp) + (0 if flash else 5 * heads * seq_len)


def stack_activation_bytes(tokens: int, layers: int, hidden: int, per_layer: int, *, checkpointing: bool) -> int:
    """Activations of a stack of ``layers`` equal layers for ``tokens`` tokens, in bytes (the vision
    tower): ``per_layer`` bytes per token each, or, with checkpointing, each layer's 16-bit input
    (``2 h``) and one layer's full set during its recompute."""
    per_token = layers * 2 * hidden + per_layer if checkpointing else layers * per_layer
    return tokens * per_token
