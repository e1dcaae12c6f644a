"""Chunked log-probs (grasp_lightning/grpo/logprobs.py) against the full-logits path.

The LM head over chunks of completion tokens, recomputed in the backward, must give the log-probs,
entropies and gradients of ``logps_and_entropy`` on the full ``(N, Lc, V)`` logits (float32: the
head's matmul over fewer rows may sum in another order), in the group-shared and the naive scoring,
on both tiny families, through LoRA (adapters on the LM head included) and for the GRPO loss; and
no head call may ever see more than ``chunk_size`` tokens, forward or backward.
"""

from __future__ import annotations

import pytest
import torch

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.grpo.logprobs import chunked_logps_and_entropy, hidden_states_as_logits, output_head
from grasp_lightning.grpo.scoring import logps_and_entropy, score_completions
from tests.helpers import K, assert_grad_close, load_model, random_completions

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def test_chunked_head_equals_full_logits_with_gradients() -> None:
    gen = torch.Generator().manual_seed(0)
    n, lc, d, v = 3, 7, 16, 50
    head = torch.nn.Linear(d, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, d, generator=gen))
    hidden = torch.randn(n, lc, d, generator=gen, requires_grad=True)
    ids = torch.randint(0, v, (n, lc), generator=gen)
    weights = torch.randn(n, lc, generator=gen)

    def run(chunk):
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        if chunk is None:
            logp, ent = logps_and_entropy(head(hidden), ids, temperature=0.7)
        else:
            logp, ent = chunked_logps_and_entropy(hidden, head, ids, 0.7, chunk)
        (logp * weights).sum().backward()
        return logp.detach(), ent, hidden.grad.clone(), head.weight.grad.clone()

    full = run(None)
    # by hand: log softmax of the scaled logits at the chosen ids, and -sum p log p
    scaled = (hidden.detach() @ head.weight.detach().T) / 0.7
    by_hand = scaled.log_softmax(-1).gather(-1, ids[..., None])[..., 0]
    torch.testing.assert_close(full[0], by_hand, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full[1], -(scaled.softmax(-1) * scaled.log_softmax(-1)).sum(-1), rtol=1e-5, atol=1e-5)
    for chunk in (1, 4, 21, 100):  # 21 = N*Lc, 4 leaves a remainder
        got = run(chunk)
        for a, b in zip(got, full):  # entropies of logits up to ~30: lse - sum p z cancels to ~1e-6 relative
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(b.abs().max())))
        assert not got[1].requires_grad
    with pytest.raises(GraspConfigError, match="logprob_chunk_size must be >= 1"):
        chunked_logps_and_entropy(hidden, head, ids, 1.0, 0)
    with pytest.raises(GraspConfigError, match="temperature must be > 0"):
        chunked_logps_and_entropy(hidden, head, ids, 0.0, 4)


def _head_rows(model) -> list[int]:
    """Token rows of every LM-head application (forward and recompute), recorded by a forward hook;
    the head's identity calls while the model returns hidden states are left out."""
    rows: list[int] = []

    def hook(module, args, out):
        if out.shape[-1] == module.out_features:
            rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])

    output_head(model).register_forward_hook(hook)
    return rows


@pytest.mark.parametrize("share", [True, False])
def test_chunked_scoring_equals_full_logits_on_both_families(prompts, family, share):  # noqa: F811
    inputs, tok = prompts
    model = load_model(family, train=True, noise=0.1)
    model.model.visual.requires_grad_(False)
    ids, mask = random_completions(tok, 2 * K)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    rows = _head_rows(model)

    def run(chunk):
        model.zero_grad(set_to_none=True)
        rows.clear()
        logp, entropy = score_completions(model, inputs, ids, mask, K, 0.7, share, chunk_size=chunk)
        (logp * weights * mask).sum().backward()
        return logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full = run(None)
    assert max(rows) > 5  # the full path runs the head over every scored position at once
    chunked = run(5)
    assert rows and max(rows) <= 5 and len(rows) >= 2 * (2 * K * ids.shape[1] // 5)  # forward + recompute
    torch.testing.assert_close(chunked[0], full[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(chunked[1], full[1], rtol=1e-5, atol=2e-5)
    assert set(chunked[2]) == set(full[2])
    assert output_head(model).weight.grad is not None  # the head (tied to the embeddings here) was compared
    for name, grad in full[2].items():
        assert_grad_close(chunked[2][name], grad, name, family)
    with torch.no_grad():
        rows.clear()
        nograd, _ = score_completions(model, inputs, ids, mask, K, 0.7, share, chunk_size=5)
    assert not nograd.requires_grad and max(rows) <= 5
    torch.testing.assert_close(nograd, full[0], rtol=1e-5, atol=2e-5)
    assert output_head(model).forward.__func__ is type(output_head(model)).forward  # head restored


def test_chunked_scoring_through_lora_and_the_grpo_loss(prompts, family):  # noqa: F811
    """LoRA policy with an adapter on the LM head: the GRPO loss and its gradients, adapters on and off."""
    from peft import LoraConfig, get_peft_model

    inputs, tok = prompts
    model = get_peft_model(load_model(family, train=True, noise=0.1),
                           LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                      target_modules=["q_proj", "v_proj", "down_proj", "in_proj_qkv", "lm_head"]))
    ids, mask = random_completions(tok, 2 * K)
    gen = torch.Generator().manual_seed(4)
    advantages = torch.randn(2 * K, generator=gen)
    old = ref = None

    def run(chunk):
        model.zero_grad(set_to_none=True)
        logp, entropy = score_completions(model, inputs, ids, mask, K, 1.0, True, chunk_size=chunk)
        loss, _ = objective.grpo_loss(logp, old, ref, advantages, mask, epsilon=0.2, epsilon_high=None, beta=0.05,
                                 loss_type="grpo", max_completion_length=ids.shape[1])
        loss.backward()
        return loss.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with torch.no_grad():
        old, _ = score_completions(model, inputs, ids, mask, K, 1.0, True)
        old = old + 0.05 * torch.randn(old.shape, generator=gen)  # ratios away from 1: the clip is exercised
        with model.disable_adapter():
            ref, _ = score_completions(model, inputs, ids, mask, K, 1.0, True)
            ref_chunked, _ = score_completions(model, inputs, ids, mask, K, 1.0, True, chunk_size=4)
    torch.testing.assert_close(ref_chunked, ref, rtol=1e-5, atol=2e-5)
    full, chunked = run(None), run(4)
    torch.testing.assert_close(chunked[0], full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked[1], full[1], rtol=1e-5, atol=2e-5)
    assert any("lm_head" in n for n in full[2]) and all("lora_" in n for n in full[2])
    for name, grad in full[2].items():
        assert_grad_close(chunked[2][name], grad, name, family)


def test_hidden_states_as_logits_restores_the_head(prompts, family):  # noqa: F811
    inputs, _ = prompts
    model = load_model(family, noise=0.1).eval()
    with torch.no_grad():
        logits = model(**inputs, logits_to_keep=2).logits
        with hidden_states_as_logits(model) as head:
            hidden = model(**inputs, logits_to_keep=2).logits
        again = model(**inputs, logits_to_keep=2).logits
    assert hidden.shape[-1] == model.config.get_text_config().hidden_size
    torch.testing.assert_close(head(hidden), logits)
    torch.testing.assert_close(again, logits)


def test_entropy_bonus_gradient_on_both_families(prompts, family):  # noqa: F811
    """``entropy_grad``: the entropies carry their gradient (the entropy bonus) on the shared and the naive scoring,
    full logits and chunks alike, equal to TRL's ``entropy_from_logits`` on the model's own logits; without it
    they carry none."""
    from trl.trainer.utils import entropy_from_logits

    from grasp_lightning.grpo.scoring import full_sequences

    inputs, tok = prompts
    model = load_model(family, train=True, noise=0.1)
    model.model.visual.requires_grad_(False)
    ids, mask = random_completions(tok, 2 * K)
    gen = torch.Generator().manual_seed(6)
    advantages = torch.randn(2 * K, generator=gen)

    def run(share, chunk):
        model.zero_grad(set_to_none=True)
        logp, entropy = score_completions(model, inputs, ids, mask, K, 0.7, share, chunk_size=chunk, entropy_grad=True)
        loss, metrics = objective.grpo_loss(logp, None, None, advantages, mask, loss_type="grpo", entropies=entropy,
                                            entropy_coef=0.1)
        loss.backward()
        return entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full = run(False, None)
    # TRL's entropy of the same logits (naive rows), with its gradient: the bonus alone
    model.zero_grad(set_to_none=True)
    lc = ids.shape[1]
    logits = model(**full_sequences(inputs, ids, mask, K), use_cache=False, logits_to_keep=lc + 1).logits[:, :-1] / 0.7
    trl_entropy = entropy_from_logits(logits)
    torch.testing.assert_close(full[0] * mask, trl_entropy.detach() * mask, rtol=1e-5, atol=2e-5)
    m = mask.float()
    (-(0.1 * (trl_entropy * m).sum() / m.sum())).backward()
    bonus_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logp, _ = score_completions(model, inputs, ids, mask, K, 0.7, False)
    objective.grpo_loss(logp, None, None, advantages, mask, loss_type="grpo")[0].backward()
    for name, grad in bonus_grads.items():  # the policy term's gradient plus TRL's bonus gradient
        policy = dict(model.named_parameters())[name].grad
        assert_grad_close(full[1][name], grad + (0 if policy is None else policy), name, family)
    assert float(sum(g.abs().sum() for g in bonus_grads.values())) > 0
    for share, chunk in ((True, None), (True, 5), (False, 5)):
        got = run(share, chunk)  # padding positions differ between the shared and the naive rows: left out
        torch.testing.assert_close(got[0] * mask, full[0] * mask, rtol=1e-5, atol=2e-5)
        for name, grad in full[1].items():
            assert_grad_close(got[1][name], grad, name, family)
    _, plain = score_completions(model, inputs, ids, mask, K, 0.7, True, chunk_size=5)
    assert not plain.requires_grad
