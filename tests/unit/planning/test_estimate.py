"""Tests of grasp_lightning.planning and the plan-memory command: hand-computed bytes on a tiny Qwen3-VL, the
decoder layers' bytes against autograd and a real cache (Qwen3-VL and the hybrid Qwen3.5), the published sizes,
configs, CLI, the table of docs/scaling.md, and Ulysses sequence parallelism (``model.sequence_parallel``: what
the split divides and what it leaves whole, its refusals and recommendation, docs/scaling.md's section)."""

from __future__ import annotations

import copy
import re
import runpy
import sys
from dataclasses import replace

import pytest
import torch
from transformers import Qwen3VLConfig

from grasp_lightning.commands import plan_memory as command
from grasp_lightning.commands.config import config_args, load_run
from grasp_lightning.commands.plan_memory import SEQUENCE_PARALLEL_SIZES, candidate_changes, load_spec, plan_from_config
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.planning import layers, tokens
from grasp_lightning.planning.architectures import (
    architecture_config,
    count_parameters,
    known_model_names,
    lora_parameters,
    lora_targets,
)
from grasp_lightning.planning.estimate import GIB, fits, format_plan, plan_memory
from grasp_lightning.planning.spec import RunSpec, spec_from_run, strategy_settings
from grasp_lightning.planning.tokens import video_tokens
from grasp_lightning.policy import LoraConfig
from tests.helpers import REPO, blocks, section
from tests.helpers import command as doc_command

CONFIGS = REPO / "configs"
TINY35 = REPO / "grasp_lightning" / "assets" / "tiny-qwen3_5"
#: One published model per family: all full attention (Qwen3-VL) and hybrid linear attention (Qwen3.5).
PUBLISHED = ("Qwen3-VL-8B-Instruct", "Qwen3.5-9B")


@pytest.fixture(scope="module")
def tiny() -> Qwen3VLConfig:
    """Text: hidden 64, MLP 128, 2 layers, 4 heads, 2 KV heads, head_dim 16, vocab 1000, tied embeddings.
    Vision: depth 1, hidden 32, MLP 64, 2 heads, patch 16, merge 2, output 64, one DeepStack merger."""
    return Qwen3VLConfig(
        text_config=dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0]),
        tie_word_embeddings=True)


# Parameters by hand.
# Text: embeddings 1000*64 = 64000; per layer q 64*64 = 4096, k 64*32 = 2048, v 2048, o 4096, q/k-norm 16 + 16,
#   gate/up/down 3 * 64*128 = 24576, two RMSNorms 128 -> 37024; 2 layers 74048; final norm 64 -> 138112.
# Vision: patch Conv3d 3*2*16*16*32 + 32 = 49184; positions 16*32 = 512; block: LayerNorms 128, qkv 32*96 + 96 = 3168,
#   proj 32*32 + 32 = 1056, fc1 32*64 + 64 = 2112, fc2 64*32 + 32 = 2080 -> 8544; merger: LayerNorm(32) 64 +
#   fc1 128*128 + 128 = 16512 + fc2 128*64 + 64 = 8256 -> 24832; DeepStack merger: LayerNorm(128) 256 + 16512 + 8256
#   = 25024 -> 108096. Total 246208.
TEXT, VISION, TOTAL = 138112, 108096, 246208
# LoRA r = 4 on q, k, v, o, gate, up, down: 4 * (64+64) = 512, 4 * (64+32) = 384, 384, 512, 4 * (64+128) = 768 (x3)
#   -> 4096 per layer, 8192 for 2 layers.
LORA4 = 8192
# Tokens: 4 s at 2 fps from a 30 fps file -> frames 0, 15, ..., 105: 8 frames, 4 groups; 64 x 64 = 4096 pixels per
#   frame -> 4096 / 32^2 = 4 tokens per group -> 16 visual tokens; timestamps <0.2 seconds> .. <3.2 seconds> (t = 0.25,
#   1.25, 2.25, 3.25) of 6 tokens each, + 4 x (vision start, end) - the template's three placeholder tokens (vision
#   start, video pad, vision end) = 29 text tokens; + 101 template tokens = 146 prompt tokens.
PROMPT = 146


def spec(**kw) -> RunSpec:
    """The hand-computed run: ZeRO-2 bf16 GRPO with checkpointing, flash attention and K repeated prompt rows."""
    base = RunSpec(model="tiny", task="GRPO", needs_reference=True, samples_rollouts=True, shares_prompt=False,
                   devices=1, num_nodes=1, zero_stage=2, offload_optimizer=False, reduce_bucket_size=1000,
                   overlap_comm=True, precision="bf16-mixed", dtype="bfloat16", freeze_vision=True, lora=LoraConfig(),
                   separate_reference=False, gradient_checkpointing=True, attn_implementation="flash_attention_2",
                   micro_batch_size=1, num_generations=4, max_new_tokens=20, fps=2.0, max_frames=240,
                   max_pixels=64 * 64, max_target_tokens=2048, max_prompt_tokens=16384, video_seconds=4,
                   text_tokens=101)
    return replace(base, **kw)


#: An SFT task: no reference model, no rollouts.
SFT = dict(task="SFT", needs_reference=False, samples_rollouts=False)


def test_parameter_counts_by_hand(tiny) -> None:
    counts = count_parameters(tiny)
    assert (counts.total, counts.vision, counts.language) == (TOTAL, VISION, TEXT)
    assert lora_parameters(counts, 4, LoraConfig().target_modules) == LORA4
    # a list target matches by suffix: k_proj is Linear(64 -> 32): 4 * (64 + 32) = 384 per layer
    assert lora_parameters(counts, 4, ["k_proj"]) == 2 * 384


@pytest.mark.parametrize(("name", "published"), [("Qwen3-VL-2B-Instruct", 2.128e9),
                                                 ("Qwen/Qwen3-VL-4B-Instruct", 4.438e9),
                                                 ("Qwen3-VL-8B-Thinking", 8.767e9),
                                                 ("Qwen/Qwen3.5-9B", 9.41e9)])
def test_published_sizes(name: str, published: float) -> None:
    assert count_parameters(architecture_config(name)).total == pytest.approx(published, rel=0.005)


def test_qwen3_5_9b_counted_exactly() -> None:
    """Qwen3_5ForConditionalGeneration of the published shapes, as transformers builds it on the meta device (the
    checkpoint's extra MTP layer is not loaded by transformers, so not counted)."""
    config = architecture_config("Qwen/Qwen3.5-9B")
    assert type(config).__name__ == "Qwen3_5Config" and config.name_or_path == "Qwen3.5-9B"
    assert config.text_config.layer_types.count("linear_attention") == 24
    counts = count_parameters(config)
    assert (counts.total, counts.language, counts.vision) == (9_409_813_744, 8_953_803_264, 456_010_480)


def _lora_by_hand(text, r: int) -> int:
    """r (in + out) per default LoRA target, from the config's fields: full attention q/k/v/o (Qwen3.5's q_proj
    writes query and gate, 2 a d), Gated DeltaNet in_proj_qkv (h -> 2 key_dim + value_dim), in_proj_z
    (h -> value_dim), out_proj (value_dim -> h), and the MLP's gate/up/down in every layer."""
    h, i, a, g, d = (text.hidden_size, text.intermediate_size, text.num_attention_heads, text.num_key_value_heads,
                     text.head_dim)
    q_out = a * d * (2 if text.model_type == "qwen3_5_text" else 1)
    mlp = 3 * r * (h + i)
    full = r * (h + q_out) + 2 * r * (h + g * d) + r * (a * d + h) + mlp
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    if "linear_attention" not in kinds:
        return len(kinds) * full
    key_dim = text.linear_num_key_heads * text.linear_key_head_dim
    value_dim = text.linear_num_value_heads * text.linear_value_head_dim
    linear = r * (h + 2 * key_dim + value_dim) + r * (h + value_dim) + r * (value_dim + h) + mlp
    return kinds.count("full_attention") * full + kinds.count("linear_attention") * linear


@pytest.mark.parametrize(("name", "expected"), [("Qwen3-VL-8B-Instruct", 43_646_976), ("Qwen3.5-9B", 40_108_032),
                                                (str(TINY35), None)])
def test_lora_counts_cover_both_attention_kinds(name: str, expected: int | None) -> None:
    config = architecture_config(name)
    counts = count_parameters(config)
    targets = LoraConfig().target_modules
    assert lora_parameters(counts, 16, targets) == _lora_by_hand(config.text_config, 16)
    if expected is not None:
        assert lora_parameters(counts, 16, targets) == expected
    wrapped = {n.rsplit(".", 2)[-2] + "." + n.rsplit(".", 1)[-1] for n, _, _ in lora_targets(counts, targets)}
    if "linear_attention" in (getattr(config.text_config, "layer_types", None) or ()):
        assert {"linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"} <= wrapped
        assert not wrapped & {"linear_attn.in_proj_a", "linear_attn.in_proj_b"}  # per-head gates stay dense
    assert not any(".visual." in n for n, _, _ in lora_targets(counts, targets))  # the vision tower stays frozen


@pytest.mark.parametrize(("name", "kv_per_token", "state_per_sequence"),
                         [("Qwen3-VL-8B-Instruct", 147_456, 0), ("Qwen3.5-9B", 32_768, 51_904_512)])
def test_rollout_cache_from_config_fields(name: str, kv_per_token: int, state_per_sequence: int) -> None:
    """KV cache only for the full-attention layers; per sequence a linear-attention layer keeps its convolution
    window (conv_dim x kernel, bf16) and recurrent state (H_v x d_k x d_v, float32), whatever the length."""
    config = architecture_config(name)
    text = config.text_config
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    kv = 2 * kinds.count("full_attention") * text.num_key_value_heads * text.head_dim * 2
    state = 0
    if "linear_attention" in kinds:
        conv_dim = 2 * text.linear_num_key_heads * text.linear_key_head_dim + (
            text.linear_num_value_heads * text.linear_value_head_dim)
        recurrent = text.linear_num_value_heads * text.linear_key_head_dim * text.linear_value_head_dim
        state = kinds.count("linear_attention") * (conv_dim * text.linear_conv_kernel_dim * 2 + recurrent * 4)
    assert (kv, state) == (kv_per_token, state_per_sequence)
    plan = plan_memory(spec(model=name), config)
    assert plan.kv_cache == plan.sequences * plan.sequence_tokens * kv
    assert plan.linear_states == plan.sequences * state
    assert plan.rollout_cache == plan.kv_cache + plan.linear_states
    assert plan.kv_cache_shared_prefix == (PROMPT + 4 * 20) * kv + 4 * state  # each completion keeps its own state


@pytest.mark.parametrize("name", [str(TINY35), "Qwen3.5-9B"])
def test_hybrid_cache_grows_four_times_slower(name: str) -> None:
    """Against the same model with every layer full attention (same KV heads and head_dim): 1 layer in 4 caches
    keys/values, so the rollout cache grows 4x slower with tokens, and the linear-attention state does not grow."""
    hybrid = architecture_config(name)
    full = copy.deepcopy(hybrid)
    full.text_config.layer_types = ["full_attention"] * full.text_config.num_hidden_layers

    def growth(config) -> tuple[int, int]:
        short, long = (plan_memory(spec(model=name, max_new_tokens=n), config) for n in (100, 1100))
        return long.rollout_cache - short.rollout_cache, long.linear_states - short.linear_states

    (hybrid_growth, state_growth), (full_growth, _) = growth(hybrid), growth(full)
    assert full_growth == 4 * hybrid_growth > 0 and state_growth == 0
    assert plan_memory(spec(model=name), hybrid).linear_states > 0 == plan_memory(spec(model=name), full).linear_states


def _cache_bytes(cache) -> int:
    """Bytes of every floating tensor a transformers cache holds (keys/values, convolution windows, recurrent
    states); integer bookkeeping (transformers 5.25's per-layer ``cumulative_length_linear`` counter) is not state."""
    import torch

    total = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            for t in (value.values() if isinstance(value, dict) else [value]):
                total += t.numel() * t.element_size() if torch.is_tensor(t) and t.is_floating_point() else 0
    return total


def test_planned_cache_matches_a_real_cache(tiny_model_path) -> None:
    """A bf16 prefill of 2 rows through each tiny family: the cache transformers fills is the planner's."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_path, dtype=torch.bfloat16)
    shapes = layers.text_shapes(model.config.text_config)
    for length in (10, 100):
        with torch.no_grad():
            out = model(input_ids=torch.randint(0, 100, (2, length)), use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        assert _cache_bytes(cache) == 2 * (length * layers.kv_bytes_per_token(shapes) + layers.linear_state_bytes(shapes))


def _small_text_config(family: str):
    """h 256, i 512, 4 heads, 2 KV heads of 64; Qwen3.5: partial rotary 0.25, Gated DeltaNet 2 key heads of 32,
    4 value heads of 48, 4 convolution taps (every 4th layer full attention)."""
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_interleaved": True}
    common = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=100)
    if family == "qwen3_vl":
        from transformers import Qwen3VLTextConfig

        config = Qwen3VLTextConfig(**common, rope_parameters={**rope, "mrope_section": [16, 8, 8]})
    else:
        from transformers import Qwen3_5TextConfig

        config = Qwen3_5TextConfig(**common, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                                   linear_value_head_dim=48, linear_conv_kernel_dim=4,
                                   rope_parameters={**rope, "mrope_section": [4, 2, 2], "partial_rotary_factor": 0.25})
    config._attn_implementation = "sdpa"
    return config


@pytest.mark.parametrize(("family", "kind"), [("qwen3_vl", "full_attention"), ("qwen3_5", "full_attention"),
                                              ("qwen3_5", "linear_attention")])
def test_decoder_layer_bytes_match_autograd(family: str, kind: str) -> None:
    """What one bf16 decoder layer leaves for backward over 256 tokens (autograd's saved tensors, one count per
    storage, parameters excluded) against planning.layers; RoPE's cos/sin (shared by the layers, so not counted per
    layer) are added; the rest differs by per-call constants (the 64 x 64 chunk mask, the (1 + w) of the norms)."""
    import torch

    if family == "qwen3_vl":
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextDecoderLayer as Layer
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary
    else:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer as Layer
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding as Rotary
    torch.manual_seed(0)
    config, length = _small_text_config(family), 256
    shapes = layers.text_shapes(config)
    index = shapes.kinds.index(kind)
    layer = Layer(config, index).to(torch.bfloat16)
    x = torch.randn(1, length, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = Rotary(config)(x, torch.arange(length).expand(3, 1, length))
    params, storages = {p.data_ptr() for p in layer.parameters()}, {}

    def pack(t):
        if t.data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=(cos.detach(), sin.detach()), attention_mask=None)
    planned = layers.decoder_layer_bytes(shapes, length)[kind]
    rope = 2 * 2 * cos.shape[-1] if kind == "full_attention" else 0  # cos and sin, 16-bit, per token
    assert sum(storages.values()) / length == pytest.approx(planned + rope, rel=0.003)


def test_architecture_errors_and_local_dir() -> None:
    with pytest.raises(GraspConfigError, match="none of the known models.*Qwen3-VL-8B-Thinking.*Qwen3.5-9B"):
        architecture_config("runs/nowhere")
    local = architecture_config(str(REPO / "grasp_lightning/assets/tiny-qwen3vl"))
    assert local.model_type == "qwen3_vl"
    assert architecture_config(str(TINY35)).model_type == "qwen3_5"


def test_model_states_zero2_world_1_and_8(tiny) -> None:
    # vision frozen: 138112 trainable; weights 2 B * 246208 = 492416 on every rank
    one = plan_memory(spec(**SFT), tiny)
    assert (one.weights, one.gradients, one.optimizer_states) == (492416, 6 * TEXT, 12 * TEXT)  # 828672, 1657344
    assert one.zero_buffers == 2 * 1000 * 2  # two reduce buckets (overlap_comm) of 1000 bf16 elements
    eight = plan_memory(spec(**SFT, devices=8), tiny)
    assert (eight.weights, eight.gradients, eight.optimizer_states) == (492416, 103584, 207168)  # / 8
    # everything trainable: 2 P + 18 P / 8 = 492416 + 553968 = DeepSpeed's own estimate
    full = plan_memory(spec(**SFT, devices=8, freeze_vision=False), tiny)
    assert full.model_states == 1046384 == full.deepspeed_model_states


def test_model_states_lora_one_gpu(tiny) -> None:
    # no ZeRO; peft keeps adapters in float32: weights 2 * 246208 + 4 * 8192, grads 4 B, AdamW 8 B per adapter param
    plan = plan_memory(spec(zero_stage=0, lora=LoraConfig(enabled=True, r=4)), tiny)
    assert (plan.weights, plan.gradients, plan.optimizer_states) == (492416 + 32768, 32768, 65536)
    assert plan.params_trainable == LORA4 and plan.reference_model == 0 and plan.deepspeed_model_states is None
    # a full fine-tune without DeepSpeed: float32 master gradients (4 B), and the DDP bucket copy
    assert plan_memory(spec(zero_stage=0, devices=2), tiny).gradients == 2 * 4 * TEXT


# QLoRA on the tiny config: the 14 language-model Linears are quantized (vision and lm_head are not), 36864 values a
#   layer (q 4096, k 2048, v 2048, o 4096, gate/up/down 8192 each), 73728 in all. NF4 with double quantization, blocks
#   of 64: a 4096-value weight packs to 2048 B, 64 absmax codes of 1 B, one float32 absmax of theirs and their float32
#   mean (8 B), 16 float32 code values (64 B) -> 2184 B; 2048 values -> 1024 + 32 + 8 + 64 = 1128 B; 8192 -> 4096 +
#   128 + 8 + 64 = 4296 B; a layer 2 * 2184 + 2 * 1128 + 3 * 4296 = 19512 B, two 39024 B. Without double quantization
#   float32 absmax: 2048 + 256 + 64 = 2368, 1024 + 128 + 64 = 1216, 4096 + 512 + 64 = 4672 -> 2 x 21184 = 42368 B.
#   The rest, 246208 - 73728 = 172480 values, in bf16; the largest Linear (8192 values) dequantized in bf16: 16384 B.
QUANT4, QUANT4_DOUBLE, QUANT4_SINGLE, WORKSPACE = 73728, 39024, 42368, 2 * 8192


def test_model_states_qlora_one_gpu(tiny) -> None:
    lora = LoraConfig(enabled=True, r=4, quantize="nf4")
    plan = plan_memory(spec(zero_stage=0, lora=lora), tiny)
    assert plan.weights == QUANT4_DOUBLE + 2 * (TOTAL - QUANT4) + 4 * LORA4 + WORKSPACE  # 433136
    assert (plan.gradients, plan.optimizer_states, plan.reference_model) == (4 * LORA4, 8 * LORA4, 0)
    single = plan_memory(spec(zero_stage=0, lora=replace(lora, double_quant=False)), tiny)
    assert single.weights - plan.weights == QUANT4_SINGLE - QUANT4_DOUBLE
    assert "nf4 double-quantized" in plan.how["weights"] and "QLoRA" in format_plan(plan)
    with pytest.raises(GraspConfigError, match="does not run under DeepSpeed ZeRO-2"):
        plan_memory(spec(lora=lora), tiny)


@pytest.mark.parametrize("double_quant", [True, False])
def test_4bit_bytes_match_bitsandbytes(double_quant: bool) -> None:
    """The planner's bytes of one 4-bit weight against bitsandbytes' own (``quantize_4bit`` on the CPU) for
    Qwen3-VL-4B's MLP (9728 x 2560) and a width that leaves a partial block and a partial absmax block."""
    import bitsandbytes.functional as F

    from grasp_lightning.planning.quantized import quantized_weight_bytes

    for rows, cols in ((9728, 2560), (1000, 129)):
        packed, state = F.quantize_4bit(torch.zeros(rows, cols, dtype=torch.bfloat16).normal_(), blocksize=64,
                                        quant_type="nf4", compress_statistics=double_quant)
        held = [packed, state.absmax, state.code] + ([state.state2.absmax, state.offset] if double_quant else [])
        assert sum(t.nbytes for t in held) == quantized_weight_bytes(rows * cols, double_quant=double_quant)


def test_reference_model(tiny) -> None:
    assert plan_memory(spec(), tiny).reference_model == 2 * TOTAL
    assert plan_memory(spec(needs_reference=False), tiny).reference_model == 0  # GRPO with beta = 0
    assert plan_memory(spec(**SFT), tiny).reference_model == 0
    lora = LoraConfig(enabled=True, r=4)
    assert plan_memory(spec(lora=lora), tiny).reference_model == 0  # adapters disabled
    assert plan_memory(spec(lora=lora, separate_reference=True), tiny).reference_model == 2 * TOTAL


def test_tokens_activations_logits_rollout(tiny) -> None:
    plan = plan_memory(spec(), tiny)
    # GRPO: K = 4 sequences of 146 + 20 = 166 tokens -> 664 tokens
    assert (plan.prompt_tokens, plan.visual_tokens, plan.sequences, plan.sequence_tokens) == (PROMPT, 16, 4, 166)
    # layer bytes per token (planning.layers.full_attention_layer_bytes, Qwen3-VL's norm): each RMSNorm keeps its
    #   float32 input 4h, its 16-bit normalised 2h and a float32 rsqrt (4) = 388, + its 16-bit output 2h = 516, x 2
    #   norms = 1032; q/k-norm over (a+g)d = 96 in 6 rows: 384 + 192 + 24 = 600; q, k, v after RoPE 2(a+2g)d = 256,
    #   output 2ad = 128, log-sum-exp 4a = 16; MLP 2 x 4i = 1024 -> 3056. Checkpointed: 2 layers x 2h x 2 B = 256 +
    #   one layer 3056 = 3312 per token -> 664 * 3312 = 2199168; embeddings 2h + final norm 388 + 2h = 644 per token
    #   -> 427616; DeepStack 4 seq x 16 visual x 1 x 64 x 2 B = 8192 -> 2634976.
    assert plan.activations == 2634976
    assert plan.logits == 4 * 21 * 1000 * 6  # completion positions + 1, vocab, GRPO_LOGIT_BYTES (entropy row by row)
    # chunked log-probs: one chunk of 16 positions x vocab x CHUNK_LOGIT_BYTES (bf16 logits 2 + float32 copy 4
    #   + float32 softmax of the gradient 4 + bf16 gradient 2) = 192000; a chunk larger than the 84 positions holds them all
    chunked = plan_memory(spec(logprob_chunk_size=16), tiny)
    assert chunked.logits == 16 * 1000 * 12 and chunked.activations == plan.activations
    assert plan_memory(spec(logprob_chunk_size=1024), tiny).logits == 4 * 21 * 1000 * 12
    assert plan_memory(spec(logprob_chunk_size=16, **SFT), tiny).logits == plan_memory(spec(**SFT), tiny).logits
    # vision (frozen) transient: 256 patches x 2 B x (attention 2*32 + 6*16 + 32 = 192, MLP 2*32 + 2*64 = 192) = 196608
    assert plan.vision_transient == 196608
    # KV: 2 (K, V) x 2 layers x 2 KV heads x 16 x 2 B = 256 B per token
    assert plan.kv_cache == 664 * 256 and plan.kv_cache_shared_prefix == (PROMPT + 4 * 20) * 256
    # prefill: 4 x 146 prompt tokens x (256 B cache + 2 B x (2h + 3i) = 1024 B working set) = 747520
    assert plan.rollout == 747520
    # peak: static 492416 + 828672 + 1657344 + reference 492416 + buffers 4000 = 3474848, + training 3138976
    assert plan.static == 3474848 and plan.peak == 3474848 + 2634976 + 504000
    assert plan.linear_states == 0 and plan.rollout_cache == plan.kv_cache  # no linear-attention layers
    no_ckpt = plan_memory(spec(gradient_checkpointing=False), tiny)
    assert no_ckpt.activations == 664 * 2 * 3056 + 427616 + 8192
    eager = plan_memory(spec(gradient_checkpointing=False, attn_implementation="eager"), tiny)
    assert eager.activations - no_ckpt.activations == 664 * 2 * 5 * 4 * 166  # Korthikanti's 5 a s per token per layer
    sft = plan_memory(spec(**SFT, response_tokens=50), tiny)
    assert sft.logits == (50 + 1) * 1000 * 10 and sft.rollout == 0  # response positions only (logits_to_keep)


def test_shared_prompt_grpo(tiny) -> None:
    plan = plan_memory(spec(shares_prompt=True), tiny)
    # 1 prompt of 146 tokens + 4 completions of 20 = 226 tokens: 226 * 3312 = 748512, embeddings and final norm
    #   226 * 644 = 145544, DeepStack 1 * 16 * 64 * 2 = 2048; the prompt cache 146 * 256 = 37376 stays for backward,
    #   and one layer's K-fold keys/values 4 * 146 * 256 / 2 layers = 74752 -> 1008232
    assert plan.activations == 748512 + 145544 + 2048 + 37376 + 74752
    assert plan.vision_transient == 64 * 768  # the clip is encoded once: 16 tokens x 4 patches
    # generation: the cache is as large as before (664 * 256); repeating it holds 1 + 4 prompt copies: 5 * 146 * 256
    assert plan.kv_cache == 664 * 256 and plan.rollout == 5 * 146 * 256


def test_video_tokens_of_the_recipe() -> None:
    # 60 s at 2 fps, 448 x 448 frames: 120 frames, 60 groups x 196 tokens; group g holds the frames at g and g + 0.5 s:
    #   timestamps <0.2 seconds> .. <59.2 seconds> (t = g + 0.25): 10 below 10 s of 6 tokens, 50 of 7 -> 410;
    #   + 60 x (vision start, end) - the template's three placeholder tokens (start, pad, end)
    vt = video_tokens(60, 2.0, 512, 200704)
    assert (vt.frames, vt.groups, vt.tokens_per_group, vt.visual_tokens) == (120, 60, 196, 11760)
    assert vt.timestamp_tokens == 10 * 6 + 50 * 7 and vt.text_tokens == 410 + 120 - 3
    # 120 s: 240 frames; the processor caps a frame at 25165824 // 240 = 104857 pixels: smart_resize scales 448
    #   by sqrt(104857 / 200704) to 323.8 and rounds down to 320 = 10 x 32 -> 20 x 20 patches / 4 = 100 per group
    big = video_tokens(120, 2.0, 512, 200704)
    assert big.frame_size == (320, 320) and big.visual_tokens == 120 * 100
    # 640 x 360 source: decoded at 334 x 596 (data.video.reduced_size, even sides), then rounded to 320 x 608
    wide = video_tokens(10, 2.0, 512, 200704, frame_size=(360, 640))
    assert wide.frame_size == (320, 608) and wide.tokens_per_group == 10 * 19
    # an odd frame count is padded to a whole group: 1.5 s -> 3 frames -> 2 groups
    assert (video_tokens(1.5, 2.0, 512, 200704).frames, video_tokens(1.5, 2.0, 512, 200704).groups) == (3, 2)
    with pytest.raises(GraspConfigError):
        video_tokens(0, 2.0, 512, 200704)


@pytest.mark.parametrize("seconds", [0.0, 0.25, 9.75, 10.2, 59.8, 123.5, 255.7])
def test_timestamp_tokens_match_qwen3_tokenizer(qwen3_processor, seconds: float) -> None:
    text = f"<{seconds:.1f} seconds>"
    ids = qwen3_processor.tokenizer(f"<|vision_end|>{text}<|vision_start|>", add_special_tokens=False)["input_ids"]
    assert tokens.timestamp_tokens(seconds) == len(ids) - 2


@pytest.fixture(scope="module")
def qwen3_processor():
    """The 2B stand-in's processor: Qwen3's real tokenizer and the published video processor settings."""
    from grasp_lightning.synthetic.standin import build_processor

    return build_processor("Qwen3-VL-2B-Instruct")


def _processor_prompt_tokens(processor, seconds: float, size: tuple[int, int], sft: dict) -> tuple[int, int]:
    """(prompt tokens the processor produces, template tokens with the one video placeholder) for a
    synthetic ``seconds`` clip of ``size`` frames decoded as GraspDataModule decodes it (30 fps source)."""
    import numpy as np

    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, encode_example, render_texts
    from grasp_lightning.data.records import ClipRef, GraspItem
    from grasp_lightning.data.video import DecodedClip, reduced_size, sample_indices, video_metadata

    total = round(seconds * 30)
    indices = sample_indices(total, 30.0, fps=sft["fps"], max_frames=sft["max_frames"])
    height, width = reduced_size(*size, sft["max_pixels"])
    frames = np.zeros((len(indices), height, width, 3), dtype=np.uint8)
    clip = DecodedClip(frames=frames, timestamps=indices / 30.0, indices=indices, source_fps=30.0, total_frames=total)
    item = GraspItem(uid="u", origin="synthetic:1", clip=ClipRef("clip.mp4"),
                     question="Who is Person 0 looking at?\nA) Person 1\nB) Person 2",
                     options=("A) Person 1", "B) Person 2"),
                     answer="A")
    encoded = encode_example(processor, item, frames, video_metadata(clip), target=None)
    template = processor.tokenizer(render_texts(processor, item, None, DEFAULT_SYSTEM_PROMPT)[0])["input_ids"]
    return encoded.prompt_length, len(template)


@pytest.fixture(scope="module")
def sft_data() -> dict:
    """The DataModule's video settings of configs/sft.yaml, as the run instantiates them."""
    return dict(load_run(config_args([CONFIGS / "sft.yaml"])).datamodule.hparams["video"])


@pytest.mark.parametrize("size", [(448, 448), (360, 640)], ids=["448x448", "640x360"])
@pytest.mark.parametrize("seconds", [10, 30, 60, 120, 300])
def test_planned_prompt_tokens_match_the_processor(qwen3_processor, sft_data, seconds: int,
                                                   size: tuple[int, int]) -> None:
    """The planner's prompt length (recipe settings of configs/sft.yaml) against the Qwen3-VL processor's."""
    sft = sft_data
    actual, template = _processor_prompt_tokens(qwen3_processor, seconds, size, sft)
    plan = plan_from_config([CONFIGS / "sft.yaml"], {"model.policy.name_or_path": "Qwen3-VL-2B-Instruct"},
                            video_seconds=seconds, text_tokens=template, frame_size=size, source_fps=30.0)
    assert abs(plan.prompt_tokens - actual) <= 0.02 * actual
    assert plan.prompt_tokens == actual  # exact: the planner models every token the processor writes


def test_processor_settings_from_both_layouts(tmp_path, qwen3_processor) -> None:
    """transformers-5 ``processor_config.json`` (save_pretrained, stand-ins, exports) and the older
    ``video_preprocessor_config.json`` are both read; a changed budget changes the plan's tokens."""
    import json

    qwen3_processor.save_pretrained(tmp_path / "new")
    assert not (tmp_path / "new" / "video_preprocessor_config.json").exists()
    data = json.loads((tmp_path / "new" / "processor_config.json").read_text())
    data["video_processor"]["size"]["longest_edge"] = 4096 * 1024  # 4 Mpx per clip
    data["video_processor"]["max_video_tokens"] = 100
    (tmp_path / "new" / "processor_config.json").write_text(json.dumps(data))
    got = tokens.processor_video_settings(str(tmp_path / "new"))
    assert got["size"] == {"shortest_edge": 4096, "longest_edge": 4194304} and got["max_video_tokens"] == 100
    old = tmp_path / "old"
    old.mkdir()
    (old / "video_preprocessor_config.json").write_text(json.dumps(data["video_processor"]))
    assert tokens.processor_video_settings(str(old)) == got
    assert tokens.processor_video_settings(str(tmp_path / "nowhere")) == tokens.QWEN3VL_VIDEO_PROCESSOR
    # 10 s at 2 fps: 20 frames, each capped at min(100 x 1024, 4194304 // 20) = 102400 px -> 320 x 320 -> 100 tokens
    vt = video_tokens(10, 2.0, 512, 200704, settings=got)
    assert vt.frame_size == (320, 320) and vt.visual_tokens == 10 * 100


def test_run_spec_defaults_are_the_codes(tmp_path) -> None:
    """A config that leaves a key out is planned with what the code runs with (the objects are asked)."""
    import inspect

    import lightning as L

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.tasks.grpo import GRPOTask

    minimal = tmp_path / "minimal.yaml"
    minimal.write_text("model:\n  task:\n    class_path: grasp_lightning.tasks.grpo.GRPOTask\n")
    d, _ = load_spec(config_args([minimal]))
    policy, rollout = PolicyConfig(), RolloutConfig()
    task = {name: p.default for name, p in inspect.signature(GRPOTask).parameters.items()}  # the groups' defaults
    data = {name: p.default for name, p in inspect.signature(GraspDataModule).parameters.items()}
    assert (d.gradient_checkpointing, d.attn_implementation, d.dtype, d.freeze_vision) == (
        policy.gradient_checkpointing, policy.attn_implementation, policy.dtype, policy.freeze_vision)
    assert (d.num_generations, d.max_new_tokens) == (rollout.num_generations, rollout.max_new_tokens)
    assert (d.shares_prompt, d.needs_reference) == (task["compute"].share_prompt, task["loss"].beta != 0.0)
    assert d.logprob_chunk_size == task["compute"].logprob_chunk_size
    assert d.precision == L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False).precision
    video, prompt = data["video"], data["prompt"]
    assert (d.fps, d.max_frames, d.max_pixels, d.max_prompt_tokens, d.max_target_tokens, d.micro_batch_size) == (
        video.fps, video.max_frames, video.max_pixels, prompt.max_prompt_tokens, prompt.max_target_tokens,
        data["loader"].batch_size)


def test_float32_masters_without_deepspeed(tiny) -> None:
    """A single-GPU full fine-tune outside DeepSpeed keeps float32 masters of its trainable weights
    (GraspModule: policy.keep_float32_masters): 4 B weights and 4 B gradients per trainable parameter,
    AdamW states 8 B; the frozen vision tower stays bf16; autocast holds bf16 copies (2 B) in the pass."""
    plan = plan_memory(spec(**SFT, zero_stage=0, precision="bf16-mixed"), tiny)
    assert plan.weights == 2 * VISION + 4 * TEXT
    assert (plan.gradients, plan.optimizer_states) == (4 * TEXT, 8 * TEXT)
    plain = plan_memory(spec(**SFT, zero_stage=0, precision="32-true"), tiny)
    assert plan.activations - plain.activations == 2 * TEXT


def test_fits_margin(tiny) -> None:
    plan = plan_memory(spec(), tiny)  # 6.7 MB
    assert fits(plan, 3.0).fits and fits(plan, 3.0).usable_gib == pytest.approx(0.7)
    assert not fits(plan, 2.0).fits  # 2 GiB x 0.9 - 2 GiB < 0
    assert fits(plan, 3.0).need_gib == pytest.approx(plan.peak / GIB)


def test_colocated_vllm_engine_takes_its_share_of_the_gpu_and_the_trainer_keeps_no_rollout_cache(tiny) -> None:
    hf = plan_memory(spec(), tiny)
    vllm = plan_memory(spec(rollout_engine="vllm", engine_memory_fraction=0.3), tiny)
    assert hf.rollout > 0 and vllm.rollout == 0 and vllm.static == hf.static
    assert vllm.peak == hf.static + max(hf.training, 0)
    assert fits(vllm, 10.0).usable_gib == pytest.approx(10.0 * (1 - 0.1 - 0.3) - 2.0)
    assert "model.rollout.vllm.gpu_memory_utilization" in vllm.how["rollout"]
    assert "+ 0.3 for the vLLM engine" in format_plan(vllm, 10.0)
    remote = plan_from_config([CONFIGS / "sgr.yaml"], {"model.rollout.engine": "vllm",
                                                       "model.rollout.vllm.address": "node2:5555"})
    assert remote.spec.rollout_engine == "vllm" and remote.spec.engine_memory_fraction == 0.0 and remote.rollout == 0
    colocated = plan_from_config([CONFIGS / "sgr.yaml"], {"model.rollout.engine": "vllm",
                                                          "model.rollout.vllm.gpu_memory_utilization": 0.25})
    assert colocated.spec.engine_memory_fraction == 0.25
    assert fits(colocated, 141).usable_gib == pytest.approx(141 * 0.65 - 2.0)


def test_plan_from_configs() -> None:
    sgr = plan_from_config([CONFIGS / "sgr.yaml"], gpu_memory_gib=141)
    assert sgr.spec.zero_stage == 2 and sgr.spec.world_size == 8 and sgr.spec.task == "GRPO"
    assert sgr.spec.samples_rollouts and sgr.spec.needs_reference
    assert sgr.name == "Qwen3-VL-8B-Instruct" and any("runs/sft/export" in n for n in sgr.notes)
    lora = plan_from_config([CONFIGS / "sgr.yaml", CONFIGS / "lora.yaml"],
                            {"model.policy.name_or_path": "Qwen3-VL-2B-Instruct"})
    assert lora.spec.lora.enabled and lora.spec.lora.r == 16 and lora.spec.zero_stage == 0 and lora.spec.world_size == 1
    assert lora.reference_model == 0 and lora.spec.gradient_checkpointing
    small = plan_from_config([CONFIGS / "sgr.yaml"], {"model.rollout.num_generations": 4,
                                                      "model.task.init_args.compute.share_prompt": True})
    assert small.spec.num_generations == 4 and small.sequences == 4 and small.spec.shares_prompt
    assert strategy_settings("deepspeed_stage_2_offload") == {"zero_stage": 2, "offload_optimizer": True,
                                                              "reduce_bucket_size": 200_000_000, "overlap_comm": True}
    with pytest.raises(GraspConfigError, match="trainer.strategy"):
        strategy_settings("fsdp")


def test_cli_and_table(capsys) -> None:
    assert command.main(["--config", str(CONFIGS / "sgr.yaml"), "--gpu-memory-gib", "141"]) == 0
    out = capsys.readouterr().out
    assert "DeepSpeed ZeRO-2 on 8 GPU(s)" in out and "fits:" in out and "estimate_zero2_model_states_mem_needs" in out
    assert command.main(["--table", "--configs-dir", str(CONFIGS)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("| Model | Setup |"):].rstrip("\n")
    lines = table.splitlines()
    assert len([line for line in lines if line.startswith("| Qwen3-VL")]) == 16  # 2B: no QLoRA rows
    qwen35 = [line.split(" | ")[1] for line in lines if line.startswith("| Qwen3.5-9B |")]
    assert qwen35 == ["SFT, full, 8 x H200 ZeRO-2", "SGR, full, 8 x H200 ZeRO-2", "SFT, LoRA r16, 1 x 24 GB",
                      "SGR, LoRA r16, 1 x 24 GB", "SFT, LoRA r16, 1 x 48 GB", "SGR, LoRA r16, 1 x 48 GB",
                      "SFT, QLoRA r16 NF4, 1 x 24 GB", "SGR, QLoRA r16 NF4, 1 x 24 GB"]
    qlora = [line for line in lines if line.startswith("| ") and "QLoRA" in line]
    assert [line.split(" | ")[0] for line in qlora] == ["| Qwen3-VL-4B"] * 2 + ["| Qwen3-VL-8B"] * 2 + ["| Qwen3.5-9B"] * 2
    # docs/scaling.md's memory table is this table, exactly (regenerate it with `plan-memory --table`)
    assert table in (REPO / "docs" / "scaling.md").read_text(), \
        "docs/scaling.md's memory table is stale: paste plan-memory --table"


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
def test_cli_exit_code(monkeypatch, capsys) -> None:
    # `python -m grasp_lightning plan-memory ...` in this process (runpy), so transformers is not imported twice
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["grasp_lightning", "plan-memory", "--config", "configs/sgr.yaml", "--config",
                                      "configs/lora.yaml", "--gpu-memory-gib", "24"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("grasp_lightning", run_name="__main__")
    # the GRPO recipe with LoRA on 24 GB does not fit (32.6 GiB peak): status 1 and the change that would fit
    assert done.value.code == command.EXIT_DOES_NOT_FIT == 1
    out = capsys.readouterr().out
    assert "LoRA r=16" in out and "fits: no" in out
    assert ("the first change that fits: --model.lora.enabled true --model.lora.quantize nf4 --trainer.strategy auto "
            "--model.rollout.num_generations 2") in out


def test_cli_names_the_change_that_fits(capsys, caplog) -> None:
    """plan-memory exits 0 when the run fits and 1 when it does not, naming the first candidate change
    (fit's syntax) whose plan fits; every earlier candidate, planned independently here, does not fit."""
    sgr = ["--config", str(CONFIGS / "sgr.yaml")]
    assert command.main([*sgr, "--gpu-memory-gib", "141"]) == 0
    assert "fits: yes" in capsys.readouterr().out
    # 2 GPUs with ZeRO-2 on 80 GB: the 8B GRPO run needs 8 GPUs (the candidates try 4, then 8)
    assert command.main([*sgr, "--trainer.devices", "2", "--gpu-memory-gib", "80"]) == 1
    out = capsys.readouterr().out
    assert "fits: no" in out
    assert "the first change that fits: --trainer.devices 8 --trainer.strategy deepspeed_stage_2" in out
    four = plan_from_config([CONFIGS / "sgr.yaml"], {"trainer.devices": 4})
    eight = plan_from_config([CONFIGS / "sgr.yaml"], {"trainer.devices": 8})
    assert not fits(four, 80).fits and fits(eight, 80).fits
    assert f"(peak {fits(eight, 80).need_gib:.1f} GiB of {fits(eight, 80).usable_gib:.1f} usable)" in out
    # nothing fits 4 GB: status 1 and every change tried is named
    assert command.main([*sgr, "--config", str(CONFIGS / "lora.yaml"), "--gpu-memory-gib", "4"]) == 1
    out = capsys.readouterr().out
    assert "even with all of these changes: --model.lora.enabled true --model.lora.quantize nf4" in out
    assert "--model.rollout.num_generations 2" in out and "--data.video.max_frames 15" in out


def test_cli_takes_fits_override_syntax(capsys, caplog) -> None:
    """``--trainer.devices 2`` as fit takes it, ``--KEY=VALUE`` too, and the deprecated ``--set KEY=VALUE``
    (with a warning) plan the same run."""
    sgr = ["--config", str(CONFIGS / "sgr.yaml")]
    outs = []
    for override in (["--trainer.devices", "2"], ["--trainer.devices=2"], ["--set", "trainer.devices=2"]):
        assert command.main([*sgr, *override]) == 0
        outs.append(capsys.readouterr().out)
    assert "DeepSpeed ZeRO-2 on 2 GPU(s)" in outs[0] and outs[0] == outs[1] == outs[2]
    assert "--set trainer.devices=2 is deprecated: give --trainer.devices 2" in caplog.text
    with pytest.raises(SystemExit) as done:
        command.main([*sgr, "trainer.devices=2"])
    assert done.value.code == 2
    assert "overrides are --KEY VALUE" in capsys.readouterr().err


def test_cli_refuses_an_unknown_model(capsys) -> None:
    """An explicit ``--model`` that is neither a local checkpoint nor a published architecture is an error,
    not a plan of another model."""
    with pytest.raises(SystemExit) as done:
        command.main(["--config", str(CONFIGS / "sft.yaml"), "--model", "Qwen/Qwen3-VL-3B-Instruct"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "--model 'Qwen/Qwen3-VL-3B-Instruct': no config.json there" in err
    assert known_model_names() == ["Qwen3-VL-2B-Instruct", "Qwen3-VL-2B-Thinking", "Qwen3-VL-4B-Instruct",
                                   "Qwen3-VL-4B-Thinking", "Qwen3-VL-8B-Instruct", "Qwen3-VL-8B-Thinking", "Qwen3.5-9B"]
    assert all(name in err for name in known_model_names())
    with pytest.raises(GraspConfigError, match="Qwen3.5-9B"):
        architecture_config("Qwen/Qwen3.5-4B")
    assert command.main(["--config", str(CONFIGS / "sft.yaml"), "--model", "Qwen/Qwen3-VL-2B-Instruct"]) == 0
    assert "Qwen3-VL-2B" in capsys.readouterr().out
    # docs/models.md "Quick start": the SGR recipe on one 8 x H200 node.
    assert command.main(["--config", str(CONFIGS / "sgr.yaml"), "--model", "Qwen/Qwen3.5-9B",
                         "--gpu-memory-gib", "140.4"]) == 0
    out = capsys.readouterr().out
    assert "Memory plan: Qwen3.5-9B" in out and "24 linear-attention + 8 full-attention" in out
    assert "linear-attention states 8 x 51,904,512 B" in out
    assert "peak                   72.56" in out and "fits: yes" in out  # the table's SGR row (chunked log-probs)


# ------------------------------------------------------------------ sequence parallelism (model.sequence_parallel)
#: The released 8B GRPO recipe; a 512-frame clip (256 s at its 2 fps: 65,536 visual tokens), issue 52's case.
RECIPE = [CONFIGS / "sgr.yaml", CONFIGS / "released" / "sgr.yaml"]
MODEL = {"model.policy.name_or_path": "Qwen3-VL-8B-Instruct"}
CLIP = {"video_seconds": 256.0}
H200 = 140.4


def gib(n: int) -> float:
    return round(n / GIB, 2)


def sp_plan(n: int, *args: str, configs=RECIPE):
    return plan_from_config(configs, MODEL, args=["--model.sequence_parallel", str(n), *args], **CLIP)


def test_sequence_parallel_splits_the_sequence_terms_not_the_model_states() -> None:
    """SP = 8 on the released 8B GRPO recipe at 512 frames, with a colocated vLLM engine: the decoder holds
    ceil(68,239 / 8) prompt + 8 x ceil(1,024 / 8) completion tokens (9,554 of 76,431), the activations fall from
    52.19 to 8.57 GiB (the whole-clip DeepStack embeddings and input embeddings stay), weights, gradients,
    optimizer states, reference and the frozen vision tower's transient stay: the peak falls from 103.19 GiB
    (over an H200's 82.2 usable beside vLLM's 0.3) to 59.57 GiB, which fits."""
    one, eight = sp_plan(1, "--model.rollout.engine", "vllm"), sp_plan(8, "--model.rollout.engine", "vllm")
    assert (one.spec.sequence_parallel, eight.spec.sequence_parallel) == (1, 8)
    assert (one.prompt_tokens, one.visual_tokens) == (eight.prompt_tokens, eight.visual_tokens) == (68239, 65536)
    assert (one.decoder_tokens, eight.decoder_tokens) == (68239 + 8 * 1024, 8530 + 8 * 128) == (76431, 9554)
    assert (gib(one.activations), gib(eight.activations)) == (52.19, 8.57)
    for name in ("weights", "gradients", "optimizer_states", "reference_model", "zero_buffers", "vision_transient",
                 "logits", "rollout"):
        assert getattr(one, name) == getattr(eight, name), name
    assert (gib(one.weights), gib(one.gradients), gib(one.optimizer_states)) == (16.33, 5.72, 11.44)
    assert gib(one.logits) == 0.43  # one 256-token chunk of the LM head, with and without the split
    assert (gib(one.peak), gib(eight.peak)) == (103.19, 59.57)
    assert not fits(one, H200).fits and fits(eight, H200).fits
    # the decoder's share divides by 8 (up to the chunks' rounding) once the whole-clip terms every rank holds and
    # one layer's all-to-all buffers (send + receive of q, k, v: 2 x 2 B x (32 + 2 x 8) heads x 128) are set apart
    deepstack = 65536 * 3 * 4096 * 2  # the 3 DeepStack levels of the whole clip, bf16
    embeddings = 76431 * 2 * 4096  # the whole sample's input embeddings (a rank's chunk is a view of them)
    exchange = layers.all_to_all_bytes(layers.text_shapes(architecture_config("Qwen3-VL-8B-Instruct").text_config), 8)
    assert exchange == 2 * 2 * (32 + 2 * 8) * 128 == 24576
    assert (one.activations - deepstack - embeddings) / (eight.activations - deepstack - embeddings
                                                         - 9554 * exchange) == pytest.approx(8, rel=0.001)


def test_sequence_parallel_leaves_generation_whole() -> None:
    """With the recipe's own engine (hf) the rollout's KV cache, 8 copies of the 69,263-token sequence
    (76.09 GiB; 84.34 GiB prefill peak), sets the peak at SP = 1 and SP = 8 alike: 134.91 GiB, over an H200's
    124.4 usable; SP = 8 lowers only the training pass (52.62 -> 9.00 GiB) and says why."""
    one, eight = sp_plan(1), sp_plan(8)
    assert (gib(one.training), gib(eight.training)) == (52.62, 9.0)
    assert gib(one.rollout) == gib(eight.rollout) == 84.34 and gib(one.kv_cache) == 76.09
    assert gib(one.peak) == gib(eight.peak) == 134.91
    assert not fits(eight, H200).fits
    assert any("splits the training forwards, not generation" in note for note in eight.notes)


def test_sequence_parallel_leaves_the_sft_target_on_the_last_rank() -> None:
    """SFT (released 8B recipe, 512 frames): the 2,048-token target is the end of the 70,287-token sequence, all
    of it in the last rank's chunk of 8,786, so the logits (2.90 GiB) are not divided; the activations are
    (37.58 -> 6.68 GiB), the peak falls from 74.72 to 43.82 GiB."""
    sft = [CONFIGS / "sft.yaml", CONFIGS / "released" / "sft.yaml"]
    one, eight = sp_plan(1, configs=sft), sp_plan(8, configs=sft)
    assert (one.decoder_tokens, eight.decoder_tokens) == (70287, 8786)
    assert gib(one.logits) == gib(eight.logits) == 2.9
    assert (gib(one.activations), gib(eight.activations)) == (37.58, 6.68)
    assert (gib(one.peak), gib(eight.peak)) == (74.72, 43.82)


def test_sequence_parallel_read_from_yaml_and_overrides(tmp_path, capsys) -> None:
    """``model.sequence_parallel`` from a --config YAML, from fit's ``--model.sequence_parallel 8`` and from the
    deprecated ``--set``: the same plan, named in the header."""
    overlay = tmp_path / "sp.yaml"
    overlay.write_text("model:\n  sequence_parallel: 8\n")
    base = ["--config", str(RECIPE[0]), "--config", str(RECIPE[1]), "--model", "Qwen3-VL-8B-Instruct",
            "--video-seconds", "256"]
    outs = []
    for extra in (["--config", str(overlay)], ["--model.sequence_parallel", "8"], ["--set", "model.sequence_parallel=8"]):
        assert command.main([*base, *extra]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]
    assert "sequence parallel 8 (1 data-parallel group(s))" in outs[0]
    assert "9554 tokens of 76431 (SP 8: ceil(L/8) per forward)" in outs[0]
    run = load_run(["--config", str(RECIPE[0]), "--config", str(overlay)])
    assert spec_from_run(run.module, run.datamodule, run.trainer)[0].sequence_parallel == 8
    with pytest.raises(GraspConfigError, match="model.sequence_parallel"):
        sp_plan(0)


def test_sequence_parallel_refused_by_name() -> None:
    """An SP size the heads do not allow (the rule of ``sequence_parallel.config_unsupported_reason``), or that
    does not divide the run's GPUs, is refused naming ``model.sequence_parallel``."""
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 3: 32 attention heads do not split over 3"):
        sp_plan(3, "--trainer.devices", "6")
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 16 does not divide the 8 GPUs"):
        sp_plan(16)  # 32 heads and 8 key/value heads allow 16; the recipe's 8 GPUs do not
    spec, _ = load_spec(["--config", str(RECIPE[0]), "--model.policy.name_or_path=Qwen3.5-9B"])
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 32: 16 attention heads do not split"):
        plan_memory(replace(spec, sequence_parallel=32, devices=32))
    config = architecture_config("Qwen3.5-9B")
    config.text_config.linear_num_key_heads = 12  # 16 heads, 4 key/value heads allow 8; 12 Gated DeltaNet heads not
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 8: 12 Gated DeltaNet heads"):
        plan_memory(replace(spec, sequence_parallel=8), config)
    config = architecture_config("Qwen3-VL-8B-Instruct")
    config.text_config.layer_types = ["sliding_attention"] * config.text_config.num_hidden_layers
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 8: decoder layer types \['sliding_attention'\]"):
        plan_memory(replace(spec, model="Qwen3-VL-8B-Instruct", sequence_parallel=8), config)
    # Qwen3.5-9B's 4 key/value heads and 8 ranks: one repeated key/value head per rank, kept for the whole sequence
    nine = plan_memory(replace(spec, sequence_parallel=8))
    assert nine.decoder_tokens == -(-nine.prompt_tokens // 8) + 8 * 128


def test_recommends_sequence_parallel(capsys) -> None:
    """A run that does not fit names SP among its candidate changes (2, 4, 8 where the GPUs and heads allow) and
    the first that fits: the released recipe at 512 frames beside a colocated vLLM engine fits with SP = 2
    (79.0 GiB of 82.2 usable)."""
    spec, _ = load_spec(["--config", str(RECIPE[0]), "--config", str(RECIPE[1]), *[f"--{k}={v}" for k, v in MODEL.items()]],
                        **CLIP)
    changes = candidate_changes(spec)
    assert [c for c in changes if "model.sequence_parallel" in c] == [{"model.sequence_parallel": n}
                                                                      for n in SEQUENCE_PARALLEL_SIZES]
    assert changes.index({"model.sequence_parallel": 2}) < changes.index({"trainer.devices": 16,
                                                                          "trainer.strategy": "deepspeed_stage_2"})
    assert [c for c in candidate_changes(replace(spec, devices=4, sequence_parallel=2))
            if "model.sequence_parallel" in c] == [{"model.sequence_parallel": 4}]
    assert not [c for c in candidate_changes(replace(spec, devices=1)) if "model.sequence_parallel" in c]
    args = ["--config", str(RECIPE[0]), "--config", str(RECIPE[1]), "--model", "Qwen3-VL-8B-Instruct",
            "--video-seconds", "256", "--model.rollout.engine", "vllm", "--gpu-memory-gib", "140.4"]
    assert command.main(args) == command.EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    assert "the first change that fits: --model.sequence_parallel 2 (peak 79.0 GiB of 82.2 usable)" in out


def test_docs_sequence_parallel_section(capsys) -> None:
    """docs/scaling.md "Sequence parallelism (long clips)": its plan-memory commands print the figures the page
    quotes (beside a colocated vLLM engine SP = 1 does not fit and names SP = 2, SP = 8 fits; with hf rollouts SP = 8
    does not fit; LoRA with DDP), and its fit commands parse to an SP = 8 run on 8 GPUs with ZeRO-2 and with DDP."""
    text = section("### Sequence parallelism (long clips)", "docs/scaling.md")
    commands = [doc_command(part) for block in blocks(text, "bash")
                for part in re.split(r"\n(?=python -m grasp_lightning)", block.strip())]
    plans = [c for c in commands if c[0] == "plan-memory"]
    fit = [c for c in commands if c[0] == "fit"]
    assert len(plans) == 4 and len(fit) == 2
    outs = []
    for words in plans:
        code = command.main([str(REPO / w) if w.startswith("configs/") else w for w in words[1:]])
        outs.append((code, capsys.readouterr().out))
    (code1, out1), (code8, out8), (code_hf, out_hf), (code_lora, out_lora) = outs
    assert (code1, code8, code_hf, code_lora) == (command.EXIT_DOES_NOT_FIT, 0, command.EXIT_DOES_NOT_FIT, 0)
    rows = {"activations": ("52.19", "8.57"), "peak": ("103.19", "59.57")}
    for name, (one, eight) in rows.items():
        assert re.search(rf"^{name} +{one} ", out1, re.M) and re.search(rf"^{name} +{eight} ", out8, re.M)
        assert f"| {one} | {eight} |" in text or f"{one} (76,431) | {eight} (9,554)" in text
    for name in ("weights", "gradients", "optimizer states", "reference model"):
        assert re.search(rf"^{name} +(\S+) ", out1, re.M)[1] == re.search(rf"^{name} +(\S+) ", out8, re.M)[1]
    assert "fits: no (headroom -21.0 GiB)" in out1 and "(−21.0)" in text
    assert "fits: yes (headroom +22.7 GiB)" in out8 and "(+22.7 GiB)" in text
    assert "the first change that fits: --model.sequence_parallel 2 (peak 79.0 GiB" in out1 and "(79.0 GiB)" in text
    assert "note" not in out1  # the prompt budget covers the 68,239-token prompt
    assert re.search(r"^peak +134\.91 +static 50\.57 \+ max\(training 9\.00, rollout 84\.34\)", out_hf, re.M)
    assert "KV cache 8 x 69263 tokens x 147456 B = 76.09 GiB" in out_hf
    assert all(f in text for f in ("134.91", "76.09", "84.34", "52.62", "9.00"))
    assert re.search(r"^peak +27\.13 ", out_lora, re.M) and "DDP on 8 GPU(s)" in out_lora and "27.13" in text
    for words, strategy in zip(fit, ("GraspDeepSpeedStrategy", "ddp"), strict=True):
        args = [str(REPO / w) if w.startswith("configs/") else w for w in words[1:]]
        run = load_run(args)
        assert run.module.sequence_parallel_size == 8 and str(run.trainer.devices) == "8"
        assert strategy in str(run.trainer.strategy)
        assert run.config.trainer.accumulate_grad_batches == 32  # 1 data-parallel group: the global batch of 32 kept
        assert run.module.rollout_cfg.engine == "vllm" and run.datamodule.prompt.max_prompt_tokens == 69632
