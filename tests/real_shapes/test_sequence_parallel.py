"""Sequence parallelism at the published widths: 2 gloo ranks with SP = 2 equal one rank.

The decoders of stand-ins of Qwen3-VL-2B-Instruct (2 layers: hidden 2,048, 16 query heads and 8 key/value
heads of 128) and Qwen3.5-9B (4 layers, 3 Gated DeltaNet + 1 attention: hidden 4,096, 16 key and 32 value
heads of 128 in the linear attention, 16 query and 4 key/value heads of 256 with the output gate in the
full attention), random weights in float32 (:func:`grasp_lightning.synthetic.standin.standin_config`), the
vocabulary cut to 4,096 ids (it only sizes the LM head, which SP runs per position), the vision tower left
out (the prompt is text: SP splits the decoder). Each rank scores 2 rows of 151 tokens (odd, so the split
pads) whose last 24 are the completion, in log-prob chunks of 16, and back-propagates a weighted sum of
the log-probs; the split run's log-probs and its gradients summed over the group (of the token mixers and
norms: the MLPs' weights are frozen to keep a 9B-width rank under 7 GiB) equal the one-rank run's.

Cost on 2 CPU cores: about 2 minutes (the Qwen3.5 widths' backward most of it).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from grasp_lightning.grpo.scoring import completion_logps
from grasp_lightning.sequence_parallel import install, new_groups
from tests.helpers import spawn_two_ranks

pytestmark = [pytest.mark.real_shapes, pytest.mark.slow]

ROWS, LENGTH, COMPLETION, VOCAB = 2, 151, 24, 4096
#: Gradient tolerance, max |split - one rank| / max |one rank| per parameter (float32).
RTOL = 1e-4
#: The Gated DeltaNet decay gates' (``A_log``, ``dt_bias``, ``in_proj_a``): their gradients are sums over the
#: sequence with heavy cancellation, so float rounding upstream is amplified. On the Qwen3.5 widths, a relative
#: change of 1e-7 in one upstream weight matrix (layer 0's ``down_proj``, one run, no SP) moves layer 1's
#: ``A_log`` gradient by 1.7e-4 of its largest entry; the split (other rounding: chunked projections, heads
#: split) moves it by 4.4e-4.
DECAY_RTOL = 2e-3
DECAY_GATES = ("A_log", "dt_bias", "in_proj_a.weight")


def _model(like: str, layers: int):
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.synthetic.standin import standin_config

    config = standin_config(like, text_layers=layers, vision_layers=1)
    config.text_config.vocab_size = VOCAB
    config.text_config.pad_token_id = 0  # inside the cut vocabulary
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).train()
    for name, param in model.named_parameters():  # the MLPs' weights frozen (their gradients are 3/4 of the
        param.requires_grad_(".mlp." not in name)  # 9B-width layers' memory); their inputs still get gradients
    return model


def _score(model, sp):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    weights = torch.randn(ROWS, COMPLETION, generator=gen)
    model.zero_grad(set_to_none=True)
    logp, _ = completion_logps(model, inputs, ids[:, -COMPLETION:], 1.0, 16, sp=sp)
    (logp * weights).sum().backward()
    layers = model.model.language_model.layers
    grads = {n: p.grad.clone() for n, p in layers.named_parameters() if p.grad is not None}
    return logp.detach(), grads


def _rank(rank: int, like: str, layers: int, out_path: str) -> None:
    torch.set_num_threads(1)
    model = _model(like, layers)
    reference = _score(model, None)
    sp = new_groups(2)
    install(model, sp)
    logp, grads = _score(model, sp)
    for g in grads.values():
        dist.all_reduce(g)
    if rank == 0:
        torch.save({"reference": reference, "split": (logp, grads)}, out_path)


@pytest.mark.parametrize("like, layers", [("Qwen3-VL-2B-Instruct", 2), ("Qwen3.5-9B", 4)])
def test_split_equals_one_rank_at_the_published_widths(like, layers, tmp_path):
    out = tmp_path / "sp.pt"
    spawn_two_ranks(_rank, like, layers, str(out))
    saved = torch.load(out, weights_only=False)
    (ref_logp, ref_grads), (logp, grads) = saved["reference"], saved["split"]
    torch.testing.assert_close(logp, ref_logp, rtol=1e-4, atol=1e-4)
    assert set(grads) == set(ref_grads) and len(ref_grads) >= 6 * layers
    kinds = {name.split(".")[1] for name in ref_grads}
    assert kinds == ({"self_attn", "input_layernorm", "post_attention_layernorm"} if layers == 2
                     else {"self_attn", "linear_attn", "input_layernorm", "post_attention_layernorm"})
    rel = {name: float((grads[name] - want).abs().max() / want.abs().max()) for name, want in ref_grads.items()}
    print("\n[SP real widths]", like, "largest relative gradient differences:",
          [(name, f"{value:.2g}") for name, value in sorted(rel.items(), key=lambda kv: -kv[1])[:4]])
    for name, value in rel.items():
        assert value <= (DECAY_RTOL if name.endswith(DECAY_GATES) else RTOL), (name, value)
    assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-4  # real gradients were compared
