"""Ulysses sequence parallelism on 2 gloo ranks equals one rank: log-probs, entropies and gradients.

Each case runs on both ranks twice: unsplit (the one-rank reference, the same on both) and split over
the 2-rank group (``model.sequence_parallel: 2``); the split gradients summed over the group must
equal the reference's. Both families (Qwen3-VL attention; Qwen3.5 Gated DeltaNet + attention), the
naive and the group-shared scoring, full and chunked log-probs, gradient checkpointing, LoRA, the
vision features computed once, SFT's response cross-entropy, and sequence lengths that 2 does not
divide (padded and cut).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from grasp_lightning.data.prompts import IGNORE_INDEX
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.scoring import full_sequences, score_completions
from grasp_lightning.grpo.vision import VisionFeatures, VisionForwardCounter
from grasp_lightning.sequence_parallel import SequenceParallel, SplitLayout, install, new_groups, unsupported_reason
from grasp_lightning.tasks.sft import response_cross_entropy, split_response_cross_entropy
from tests.helpers import LOGP_TOLS, TINY_MODELS, K, assert_grad_close, load_model, random_completions, spawn_two_ranks

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

#: (name, share the prompt, logprob chunk size, gradient checkpointing, LoRA, vision features once); a
#: ``one-kv-head`` case has one key/value head for 2 ranks (each rank gets a copy of it)
CASES = [
    ("naive", False, None, False, False, False),
    ("shared-one-kv-head", True, None, False, False, False),
    ("naive-chunked", False, 5, False, False, False),
    ("shared", True, None, False, False, False),
    ("shared-chunked-checkpointing", True, 4, True, False, False),
    ("naive-checkpointing", False, None, True, False, False),
    ("shared-lora", True, 4, False, True, False),
    ("shared-vision-once", True, None, False, False, True),
]


def _completion_length(share: bool) -> int:
    """Completion lengths giving split forwards of odd lengths: naive ``Lp + 10``; shared ``Lp`` then ``8``."""
    return 9 if share else 10


def _model(family: str, lora: bool, checkpointing: bool, one_kv_head: bool = False):
    if one_kv_head:  # the tiny model's config with 1 key/value head, seeded random weights
        from transformers import AutoConfig, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(str(TINY_MODELS[family]))
        config.text_config.num_key_value_heads = 1
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config).train()
    else:
        model = load_model(family, train=True, noise=0.1)
    model.model.visual.requires_grad_(False)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(3)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "in_proj_qkv",
                                                                                     "down_proj"], init_lora_weights=False))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _score(model, inputs, ids, mask, share, chunk, vision_once, sp):
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    model.zero_grad(set_to_none=True)
    vision = VisionFeatures.for_model(model) if vision_once else None
    with VisionForwardCounter(model) as counter:
        if vision_once:  # the old-policy pass fills the features, the update reuses them
            with torch.no_grad():
                score_completions(model, inputs, ids, mask, K, 0.7, share, chunk, vision=vision, sp=sp)
        logp, entropy = score_completions(model, inputs, ids, mask, K, 0.7, share, chunk, vision=vision, sp=sp)
        (logp * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads, counter.calls


def _rank(rank: int, family: str, inputs: dict, pad_id: int, out_path: str) -> None:
    torch.set_num_threads(1)
    with pytest.raises(GraspConfigError, match=r"4 does not divide the 2 ranks of this run .*a divisor of 2"):
        new_groups(4)
    sp = new_groups(2)
    assert (sp.size, sp.rank) == (2, rank)
    results, lengths = {}, []
    for name, share, chunk, checkpointing, lora, vision_once in CASES:
        model = _model(family, lora, checkpointing, one_kv_head=name.endswith("one-kv-head"))
        ids, mask = random_completions(type("T", (), {"pad_token_id": pad_id}), 2 * K, lc=_completion_length(share))
        reference = _score(model, inputs, ids, mask, share, chunk, vision_once, None)
        install(model, sp)
        model.eval()  # a rollout generates in eval mode; transformers re-kernelizes at train() (Qwen3.5's
        model.train()  # Gated DeltaNet forward is swapped): the split must survive it
        split = _score(model, inputs, ids, mask, share, chunk, vision_once, sp)
        lengths.append(sp.last_length)
        grads = {}
        for n, g in split[2].items():
            dist.all_reduce(g)  # each rank holds its chunk's part of the gradient
            grads[n] = g
        results[name] = {"reference": reference, "split": (*split[:2], grads, split[3])}
    results["sft"] = _sft(family, inputs, pad_id, sp)
    if rank == 0:
        torch.save({"results": results, "lengths": lengths}, out_path)


def _sft(family: str, inputs: dict, pad_id: int, sp: SequenceParallel) -> dict:
    """SFT's response cross-entropy and its gradients, whole and split: prompt + response rows, labels on the
    response only (``keep`` from the shortest prompt, as ``SFTTask``)."""
    ids, mask = random_completions(type("T", (), {"pad_token_id": pad_id}), 2 * K, lc=10)
    rows = full_sequences(inputs, ids, mask, K)
    labels = torch.cat([torch.full_like(rows["input_ids"][:, :-ids.shape[1]], IGNORE_INDEX),
                        ids.masked_fill(~mask, IGNORE_INDEX)], 1)
    keep = ids.shape[1] + 1
    model = _model(family, lora=False, checkpointing=True)
    out = {}
    for name, group in (("reference", None), ("split", sp)):
        model.zero_grad(set_to_none=True)
        if group is None:
            logits = model(**rows, use_cache=False, logits_to_keep=keep).logits
            loss, n = response_cross_entropy(logits, labels[:, -keep:])
        else:
            install(model, group)
            loss, n = split_response_cross_entropy(model, rows, labels, keep, group)
        loss.backward()
        grads = {p: g.grad.clone() for p, g in model.named_parameters() if g.grad is not None}
        if group is not None:
            for g in grads.values():
                dist.all_reduce(g)
        out[name] = (loss.detach(), n, grads)
    return out


def test_two_ranks_split_equal_one_rank(prompts, family, tmp_path):
    inputs, tok = prompts
    out = tmp_path / "sp.pt"
    spawn_two_ranks(_rank, family, dict(inputs), tok.pad_token_id, str(out))
    saved = torch.load(out, weights_only=False)
    prompt_length = inputs["input_ids"].shape[1]
    assert prompt_length % 2 == 1  # split forwards of Lp and Lp + 10 positions: padded to a multiple of 2
    assert saved["lengths"] == [prompt_length + 10 if not share else 8 for _, share, *_ in CASES]
    for name, share, chunk, checkpointing, lora, vision_once in CASES:
        ids, mask = random_completions(tok, 2 * K, lc=_completion_length(share))
        ref, split = saved["results"][name]["reference"], saved["results"][name]["split"]
        torch.testing.assert_close(split[0][mask], ref[0][mask], **LOGP_TOLS[family], msg=lambda m: f"{name} logp: {m}")
        torch.testing.assert_close(split[1][mask], ref[1][mask], **LOGP_TOLS[family], msg=lambda m: f"{name} H: {m}")
        assert set(split[2]) == set(ref[2]), name
        assert len(ref[2]) > 0 and max(g.abs().max() for g in ref[2].values()) > 1e-3, name  # real gradients
        if lora:
            assert all("lora_" in n for n in ref[2]), name
        for param, grad in ref[2].items():
            assert_grad_close(split[2][param], grad, f"{name} {param}", family)
        if vision_once:
            assert split[3] == ref[3] == 1, (name, split[3], ref[3])
    ref, split = saved["results"]["sft"]["reference"], saved["results"]["sft"]["split"]
    response_tokens = int(random_completions(tok, 2 * K, lc=10)[1].sum())
    assert int(split[1]) == int(ref[1]) == response_tokens and float(ref[0]) > 1.0
    torch.testing.assert_close(split[0], ref[0], rtol=1e-5, atol=1e-6)
    assert set(split[2]) == set(ref[2]) and max(g.abs().max() for g in ref[2].values()) > 1e-3
    for param, grad in ref[2].items():
        assert_grad_close(split[2][param], grad, f"sft {param}", family)


def test_split_layout_pads_the_tail_and_places_spans():
    layout = SplitLayout(size=2, rank=1, length=7)
    assert (layout.chunk, layout.padded, layout.lo) == (4, 8, 4)
    x = torch.arange(7.0)[None]
    assert layout.shard(x).tolist() == [[4.0, 5.0, 6.0, 0.0]]
    assert SplitLayout(2, 0, 7).shard(x).tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert layout.local_span(2, 6) == (4, 6) and layout.local_span(0, 3) == (4, 4)
    with pytest.raises(ValueError, match="expected length 7"):
        layout.shard(torch.zeros(1, 6))


def test_models_whose_heads_do_not_split_are_refused():
    model = load_model("qwen3_5")  # the hybrid: attention and Gated DeltaNet heads
    assert unsupported_reason(model, 2) is None
    assert "4 attention heads do not split over 3 ranks" in unsupported_reason(model, 3)
    assert "2 Gated DeltaNet heads (linear_num_key_heads) do not split over 4 ranks" in unsupported_reason(model, 4)
    with pytest.raises(GraspConfigError, match="model.sequence_parallel: 8: 4 attention heads do not split"):
        install(model, SequenceParallel(size=8, rank=0))
    with pytest.raises(GraspConfigError, match="needs a distributed run"):
        new_groups(2)
