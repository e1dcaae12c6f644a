"""The compiled decode (grasp_lightning/engines/compiled_decode.py, ``model.rollout.compile_decode``) against eager decoding.

On both tiny families (Qwen3-VL; the hybrid Qwen3.5, whose Gated DeltaNet layers get transformers'
static ``LinearAttentionLayer``), greedy decoding through a static cache and a compiled decode step
must give eager decoding's tokens, and per-step log-probs within the shared-prefill tolerances of
``tests/unit/grpo/test_scoring.py``. The compile backend is a counting wrapper of ``aot_eager`` (the
FX graph traced by dynamo, run through AOTAutograd without code generation), so the test proves the
decode step went through ``torch.compile`` without inductor's C++ build time on a CPU.
"""

from __future__ import annotations

import pytest
import torch

from grasp_lightning.engines.compiled_decode import prefill_static, static_cache_for
from grasp_lightning.engines.decoding import RolloutConfig, sample_completions
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.scoring import prefill_for_generation, repeat_prompts, vl_core
from tests.helpers import LOGIT_TOLS, K, generate_with_logits, load_model

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

NEW = 6  # decode steps per test: enough to cover several compiled calls, few enough to stay fast


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it is given and runs them through ``aot_eager``.

    ``generate`` deep-copies its generation config, compile config and backend included, so the count
    lives in a list every copy shares (``__deepcopy__`` returns the object itself).
    """

    def __init__(self):
        self.counts: list[int] = []

    @property
    def graphs(self) -> int:
        return len(self.counts)

    def __deepcopy__(self, memo):
        return self

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.counts.append(1)
        return lookup_backend("aot_eager")(gm, example_inputs)


@pytest.fixture
def fresh_dynamo():
    """Each test compiles anew (dynamo's cache is keyed on the code object, shared across models)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _greedy():
    return dict(do_sample=False, temperature=None, top_p=None, top_k=None)


def _logps(logits: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """``(N, T)`` log-probs of ``tokens`` under each step's ``(N, V)`` logits."""
    steps = torch.stack(logits, 1).float().log_softmax(-1)
    return steps.gather(-1, tokens[:, :steps.shape[1], None]).squeeze(-1)


def test_static_shared_prefill_decodes_the_eager_tokens_and_logps(prompts, family, fresh_dynamo):  # noqa: F811
    inputs, tok = prompts
    model = load_model(family)
    length = inputs["input_ids"].shape[1]
    text, cache = prefill_for_generation(model, inputs, K)
    eager = generate_with_logits(model, tok, text, cache=cache, **_greedy())
    text, static = prefill_static(model, inputs, K, max_new_tokens=10)
    assert int(static.get_seq_length()) == length - 1
    assert static.layers[-1].max_cache_len == length + 10 + 1 and static.is_compileable
    assert vl_core(model).rope_deltas.shape == (2 * K, 1)
    backend = CountingBackend()
    from grasp_lightning.engines.compiled_decode import decode_compile_config

    compiled = generate_with_logits(model, tok, text, cache=static, compile_config=decode_compile_config(backend), **_greedy())
    assert backend.graphs >= 1  # the decode step went through torch.compile
    new = eager.sequences[:, length:]
    assert len(set(new[0].tolist())) > 3  # real text, not one repeated token
    assert torch.equal(compiled.sequences, eager.sequences)
    torch.testing.assert_close(_logps(compiled.logits, new), _logps(eager.logits, new), **LOGIT_TOLS[family])
    # Negative control: a cache whose rows were not expanded per prompt (all rows prompt 0's) decodes other logits.
    text, static = prefill_static(model, inputs, K, max_new_tokens=10)
    for layer in static.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys.copy_(layer.keys[:1].expand_as(layer.keys))
    wrong = generate_with_logits(model, tok, text, cache=static, compile_config=decode_compile_config(backend), **_greedy())
    assert (wrong.logits[0][K:] - eager.logits[0][K:]).abs().max() > 1e-2


@pytest.mark.parametrize("share", [True, False])
def test_sample_completions_compiled_equals_eager(prompts, family, share, fresh_dynamo):  # noqa: F811
    inputs, tok = prompts
    model = load_model(family)
    if not share:  # greedy generate takes one sequence per prompt: repeat the prompts instead
        inputs = repeat_prompts(inputs, K)
    common = dict(num_return_sequences=K if share else 1, max_new_tokens=NEW, do_sample=False, stop_strings=(),
                  share_prompt=share)
    eager = sample_completions(model, tok, inputs, **common)
    backend = CountingBackend()
    compiled = sample_completions(model, tok, inputs, compile_decode=True, compile_backend=backend, **common)
    assert backend.graphs >= 1
    assert eager.ids.shape == (2 * K, NEW)
    assert torch.equal(compiled.ids, eager.ids) and torch.equal(compiled.mask, eager.mask)
    assert compiled.texts == eager.texts


def test_compile_decode_setting_is_validated_and_reaches_the_hf_engine(monkeypatch):
    assert RolloutConfig().compile_decode is False
    with pytest.raises(GraspConfigError, match="model.rollout.compile_decode must be true or false"):
        RolloutConfig(compile_decode="yes")
    with pytest.raises(GraspConfigError, match="model.rollout.compile_backend"):
        RolloutConfig(compile_backend="")
    import grasp_lightning.engines.hf as hf

    seen = {}
    monkeypatch.setattr(hf, "sample_completions", lambda *a, **kw: seen.update(kw))
    hf.HFEngine().sample(None, None, {}, RolloutConfig(compile_decode=True, compile_backend="aot_eager"))
    assert seen["compile_decode"] is True and seen["compile_backend"] == "aot_eager"


def test_a_cache_without_a_compileable_static_form_is_refused_by_name(prompts, family, monkeypatch):  # noqa: F811
    from transformers.cache_utils import StaticLayer

    model = load_model(family, noise=0.0)
    assert static_cache_for(model, 8).is_compileable  # both families: Qwen3.5's linear layers included
    monkeypatch.setattr(StaticLayer, "is_compileable", False)
    with pytest.raises(GraspConfigError, match=r"model\.rollout\.compile_decode: .*\['StaticLayer'\].*false"):
        static_cache_for(model, 8)


def test_compiled_decode_through_a_lora_policy(prompts, family, fresh_dynamo):  # noqa: F811
    """A peft-wrapped policy (LoRA on attention and MLP projections, non-zero B) decodes the same tokens."""
    from peft import LoraConfig, get_peft_model

    inputs, tok = prompts
    model = load_model(family)
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    common = dict(num_return_sequences=K, max_new_tokens=NEW, do_sample=False, stop_strings=(), share_prompt=True)
    eager = sample_completions(policy, tok, inputs, **common)
    with policy.disable_adapter():
        base = sample_completions(policy, tok, inputs, **common)
    assert not torch.equal(base.ids, eager.ids)  # the adapter changes the decoding
    backend = CountingBackend()
    compiled = sample_completions(policy, tok, inputs, compile_decode=True, compile_backend=backend, **common)
    assert backend.graphs >= 1
    assert torch.equal(compiled.ids, eager.ids)
