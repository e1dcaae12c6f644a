"""Group-shared rollouts and scoring (grasp_lightning/grpo/scoring.py) against the naive repeated rows.

Sampling from one prefill expanded K times must give plain ``generate``'s tokens and per-step
logits; scoring the K completions against one prompt forward must give the naive per-row
log-probs, entropies and gradients (with and without gradient checkpointing, vision tower frozen
or trained). Every test runs on both tiny families: Qwen3-VL (full attention only) and the hybrid
Qwen3.5 (Gated DeltaNet linear-attention layers + a full-attention layer), whose shared path also
expands the convolution windows and recurrent states. The tiny models' weights are perturbed so
greedy decoding is not one repeated token.

Tolerances: Qwen3-VL's shared and naive paths differ only in the order of float32 sums. On Qwen3.5
the linear-attention recurrence also restarts at the prompt/completion boundary, and transformers'
chunked gated delta rule runs in float32 whatever the model dtype, with its per-chunk decay factors
``exp(cumsum g)`` regrouped, so the rounding is of a different kind (measured on the tiny model,
noise 0.1: log-probs 2.9e-6, gradients 8.5e-6 of each tensor's largest entry; a float64 copy of the
model still shows 1.9e-6, the float32 kernel's rounding). The Qwen3.5 bounds are a few times looser
than Qwen3-VL's and far below the effect of a lost state
(``test_hybrid_linear_states_are_what_the_completions_continue_from``).
"""

from __future__ import annotations

import pytest
import torch

from grasp_lightning.engines.decoding import sample_completions
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.scoring import (
    completion_logps,
    full_sequences,
    prefill_for_generation,
    prompt_tokens_forwarded,
    repeat_prompts,
    shared_completion_logps,
    sharing_unsupported_reason,
    vl_core,
)
from tests.helpers import (
    LOGIT_TOLS,
    LOGP_TOLS,
    TINY_MODELS,
    K,
    assert_grad_close,
    generate_with_logits,
    load_model,
    random_completions,
    sample_rl_datamodule,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")




def _assert_logits_close(a, b, family: str):
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x, y, **LOGIT_TOLS[family], msg=lambda m, s=step: f"step {s}: {m}")


def test_greedy_shared_generation_matches_plain_generate(prompts, family):
    inputs, tok = prompts
    model = load_model(family)
    greedy = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    plain = generate_with_logits(model, tok, repeat_prompts(inputs, K), **greedy)
    text, cache = prefill_for_generation(model, inputs, K)
    assert cache.get_seq_length() == inputs["input_ids"].shape[1] - 1
    assert vl_core(model).rope_deltas.shape == (2 * K, 1)
    shared = generate_with_logits(model, tok, text, cache=cache, **greedy)
    new = plain.sequences[:, inputs["input_ids"].shape[1]:]
    assert len(set(new[0].tolist())) > 3  # real text, not one repeated token
    assert (plain.logits[0][0] - plain.logits[0][K]).abs().max() > 1e-2  # the two prompts' logits differ
    assert torch.equal(shared.sequences, plain.sequences)
    _assert_logits_close(shared.logits, plain.logits, family)
    # Negative control: without the M-RoPE offsets the continuation is wrong (100x the tolerance).
    text, cache = prefill_for_generation(model, inputs, K)
    vl_core(model).rope_deltas = torch.zeros_like(vl_core(model).rope_deltas)
    wrong = generate_with_logits(model, tok, text, cache=cache, **greedy)
    assert (wrong.logits[0] - plain.logits[0]).abs().max() > 1e-2


def test_sampling_shared_matches_generate_with_num_return_sequences(prompts, family):
    inputs, tok = prompts
    model = load_model(family)
    sampling = dict(do_sample=True, temperature=0.9, top_p=0.95, top_k=0)
    torch.manual_seed(3)
    plain = generate_with_logits(model, tok, inputs, num_return_sequences=K, **sampling)
    torch.manual_seed(3)
    text, cache = prefill_for_generation(model, inputs, K)
    shared = generate_with_logits(model, tok, text, cache=cache, **sampling)
    assert torch.equal(shared.sequences, plain.sequences)
    _assert_logits_close(shared.logits, plain.logits, family)
    new = plain.sequences[:, inputs["input_ids"].shape[1]:]
    assert not torch.equal(new[0], new[1])  # the K rows of a group really differ

    outs = []
    for share in (False, True):
        torch.manual_seed(5)
        outs.append(sample_completions(model, tok, inputs, num_return_sequences=K, max_new_tokens=12, temperature=0.9,
                                       stop_strings=(), share_prompt=share))
    assert torch.equal(outs[0].ids, outs[1].ids) and torch.equal(outs[0].mask, outs[1].mask)
    assert outs[0].texts == outs[1].texts and outs[0].ids.shape[0] == 2 * K


@pytest.mark.parametrize("checkpointing, train_vision", [(False, False), (True, False), (False, True)])
def test_shared_scoring_matches_naive_logps_and_gradients(prompts, family, checkpointing, train_vision):
    inputs, tok = prompts
    model = load_model(family, train=True, noise=0.1)
    if not train_vision:
        model.model.visual.requires_grad_(False)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, mask = random_completions(tok, 2 * K)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))

    def run(share: bool):
        model.zero_grad(set_to_none=True)
        if share:
            logp, entropy = shared_completion_logps(model, inputs, ids, mask, K, temperature=0.7)
        else:
            logp, entropy = completion_logps(model, full_sequences(inputs, ids, mask, K), ids, temperature=0.7)
        (logp * weights * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logp.detach(), entropy, grads

    naive, shared = run(False), run(True)
    torch.testing.assert_close(shared[0][mask], naive[0][mask], **LOGP_TOLS[family])
    torch.testing.assert_close(shared[1][mask], naive[1][mask], **LOGP_TOLS[family])
    assert set(shared[2]) == set(naive[2])
    assert any("visual" in n for n in naive[2]) == train_vision
    for name, grad in naive[2].items():
        assert_grad_close(shared[2][name], grad, name, family)
    assert max(g.abs().max() for g in naive[2].values()) > 1e-3  # real gradients were compared
    assert not any("_can_checkpoint_with_cache" in vars(m) for m in model.modules())  # flag restored


def test_shared_scoring_without_grad_equals_naive(prompts, family):
    inputs, tok = prompts
    model = load_model(family, noise=0.1)
    ids, mask = random_completions(tok, 2 * K)
    with torch.no_grad():
        shared, _ = shared_completion_logps(model, inputs, ids, mask, K, temperature=1.0)
        naive, _ = completion_logps(model, full_sequences(inputs, ids, mask, K), ids, temperature=1.0)
    torch.testing.assert_close(shared[mask], naive[mask], **LOGP_TOLS[family])
    assert not shared.requires_grad


def test_prompt_token_accounting_and_fallbacks(prompts, family):
    inputs, tok = prompts
    b, lp = inputs["input_ids"].shape
    assert prompt_tokens_forwarded(inputs, 8, share=True) == b * lp
    assert prompt_tokens_forwarded(inputs, 8, share=False) == 8 * b * lp
    assert prompt_tokens_forwarded(inputs, 8, share=True, generation=True) == b * (lp - 1) + 8 * b
    model = load_model(family)
    assert sharing_unsupported_reason(model, inputs) is None
    text_only = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
    assert "no image or video" in sharing_unsupported_reason(model, text_only)
    assert "M-RoPE" in sharing_unsupported_reason(torch.nn.Linear(2, 2), inputs)
    rep = repeat_prompts(inputs, K)
    assert rep["pixel_values_videos"].shape[0] == K * inputs["pixel_values_videos"].shape[0]
    assert torch.equal(rep["input_ids"][K], inputs["input_ids"][1])
    bad = dict(inputs, video_grid_thw=inputs["video_grid_thw"][:1])
    with pytest.raises(GraspConfigError, match="video_grid_thw has 1 rows for 2 prompts"):
        repeat_prompts(bad, K)


def _task_step(share: bool, prompts_batch, family: str):
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.tasks.grpo import ComputeConfig, GRPOTask, LossConfig

    module = GraspModule(GRPOTask(loss=LossConfig(beta=0.05, num_iterations=1), compute=ComputeConfig(share_prompt=share)),
                         policy=PolicyConfig(name_or_path=str(TINY_MODELS[family]), dtype="float32", freeze_vision=True),
                         rollout=RolloutConfig(num_generations=K, max_new_tokens=12, stop_at_answer=False))
    module.configure_model()
    torch.manual_seed(0)
    module.training_step(prompts_batch, 0)  # prepare (the sampling) and the task's step; metrics of both
    out = module.last_task_output
    out.loss.backward()
    grads = {n: p.grad for n, p in module.policy.named_parameters() if p.grad is not None}
    return out, grads


def test_grpo_task_shared_step_equals_naive_step(prompts, family):
    batch = next(iter(sample_rl_datamodule(TINY_MODELS[family]).train_dataloader()))
    (naive, naive_grads), (shared, shared_grads) = _task_step(False, batch, family), _task_step(True, batch, family)
    assert shared.rollout.completions == naive.rollout.completions
    torch.testing.assert_close(shared.loss, naive.loss, rtol=1e-5, atol=1e-6)
    for name, grad in naive_grads.items():
        assert_grad_close(shared_grads[name], grad, name, family)
    b, lp = batch.inputs["input_ids"].shape
    # Per step: generation, reference and policy scoring. Naive forwards K times the prompts.
    assert naive.metrics["tokens/prompt_forwarded"] == 3 * K * b * lp
    assert shared.metrics["tokens/prompt_forwarded"] == b * (lp - 1) + K * b + 2 * b * lp
    assert shared.metrics["rollout/shared_prompt"] == 1.0 and naive.metrics["rollout/shared_prompt"] == 0.0


def test_sharing_through_a_lora_policy_and_its_adapter_disabled_reference(prompts, family):
    """peft-wrapped policy: shared sampling and scoring (adapters on and off) equal the naive paths."""
    from peft import LoraConfig, get_peft_model

    inputs, tok = prompts
    model = get_peft_model(load_model(family, train=True, noise=0.1),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj", "in_proj_qkv", "out_proj"],
                                      init_lora_weights=False))
    assert sharing_unsupported_reason(model, inputs) is None
    ids, mask = random_completions(tok, 2 * K)
    naive_logp, _ = completion_logps(model, full_sequences(inputs, ids, mask, K), ids, 1.0)
    naive_logp[mask].sum().backward()
    naive_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    shared_logp, _ = shared_completion_logps(model, inputs, ids, mask, K, 1.0)
    shared_logp[mask].sum().backward()
    torch.testing.assert_close(shared_logp[mask], naive_logp[mask], **LOGP_TOLS[family])
    assert naive_grads and all("lora_" in n for n in naive_grads)
    for name, grad in naive_grads.items():
        assert_grad_close(model.get_parameter(name).grad, grad, name, family)
    with torch.no_grad(), model.disable_adapter():
        ref_shared, _ = shared_completion_logps(model, inputs, ids, mask, K, 1.0)
        ref_naive, _ = completion_logps(model, full_sequences(inputs, ids, mask, K), ids, 1.0)
    torch.testing.assert_close(ref_shared[mask], ref_naive[mask], **LOGP_TOLS[family])
    assert (ref_shared - shared_logp.detach())[mask].abs().max() > 1e-3  # the adapters really were off
    model.eval()
    outs = []
    for share in (False, True):
        torch.manual_seed(9)
        outs.append(sample_completions(model, tok, inputs, num_return_sequences=K, max_new_tokens=8, stop_strings=(),
                                       share_prompt=share))
    assert torch.equal(outs[0].ids, outs[1].ids)


def test_hybrid_cache_expansion_repeats_every_layer_state(prompts, family):
    """After the shared prefill each layer's state has ``B*K`` rows, row ``b*K + j`` equal to prompt ``b``'s."""
    from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin

    from grasp_lightning.grpo.scoring import _prompt_forward, expand_cache, layer_types

    inputs, _ = prompts
    model = load_model(family)
    kinds = layer_types(model)
    assert set(kinds) == ({"full_attention"} if family == "qwen3_vl" else {"full_attention", "linear_attention"})
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        _prompt_forward(model, inputs, cache, drop_last=True)
        before = [(layer.conv_states[0].clone(), layer.recurrent_states[0].clone())
                  if isinstance(layer, LinearAttentionCacheLayerMixin) else (layer.keys.clone(), layer.values.clone())
                  for layer in cache.layers]
        expand_cache(cache, K)
    for kind, layer, (a, b) in zip(kinds, cache.layers, before, strict=True):
        after = ((layer.conv_states[0], layer.recurrent_states[0]) if kind == "linear_attention"
                 else (layer.keys, layer.values))
        for old, new in ((a, after[0]), (b, after[1])):
            assert new.shape[0] == 2 * K and torch.equal(new, old.repeat_interleave(K, 0))
        # Two prompts, two different states. (A convolution window holds the prompts' last tokens, which
        # are the same chat-template tokens in both, so it is compared on shape and repetition only.)
        assert not torch.equal(after[1][0], after[1][K])


@pytest.mark.parametrize("state", ["conv", "recurrent"])
def test_hybrid_linear_states_are_what_the_completions_continue_from(state, monkeypatch):
    """Negative control on Qwen3.5 (Qwen3-VL has no linear attention): zeroing the prompt's convolution
    window or recurrent state in the read-mode cache moves the completions' log-probs by four orders of
    magnitude more than the tolerance."""
    from grasp_lightning.grpo import scoring

    family = "qwen3_5"
    dm = sample_rl_datamodule(TINY_MODELS[family])
    inputs, tok = next(iter(dm.train_dataloader())).inputs, dm.processor.tokenizer
    model = load_model(family, noise=0.1)
    ids, mask = random_completions(tok, 2 * K)
    with torch.no_grad():
        right, _ = shared_completion_logps(model, inputs, ids, mask, K, temperature=1.0)
        getter = {"conv": "conv_window", "recurrent": "recurrent"}[state]
        original = getattr(scoring._PrefixLinearLayer, getter)
        monkeypatch.setattr(scoring._PrefixLinearLayer, getter, lambda self: torch.zeros_like(original(self)))
        wrong, _ = shared_completion_logps(model, inputs, ids, mask, K, temperature=1.0)
    gap = (wrong - right)[mask].abs().max().item()
    assert gap > 0.1, gap  # measured: 1.78 (conv window), 1.71 (recurrent state); the tolerance is 2e-5


def test_sliding_window_models_are_refused(prompts, family, monkeypatch):
    """A decoder with a layer kind the shared cache does not cover falls back, naming the kind."""
    inputs, _ = prompts
    model = load_model(family)
    text = model.config.get_text_config(decoder=True)
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    monkeypatch.setattr(text, "layer_types", ["sliding_attention", *kinds[1:]], raising=False)
    assert "['sliding_attention'] are neither full nor linear attention" in sharing_unsupported_reason(model, inputs)
