"""Completion masks: where a sampled completion ends."""

import torch

from grasp_lightning.generation import completion_mask, vision_token_ids

EOS, PAD = 7, 0


def test_mask_ends_after_eos_or_before_padding():
    ids = torch.tensor([
        [5, 6, EOS, PAD, PAD],   # ended on EOS: EOS is a trained token
        [5, 6, 9, PAD, PAD],     # stopped on a stop string: padded by generate
        [5, 6, 9, 9, 9],         # hit the budget
        [EOS, 5, 6, EOS, 9],     # only up to the first EOS
    ])
    mask = completion_mask(ids, [EOS], PAD)
    assert mask.int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_pad_that_is_also_eos_is_kept_as_the_end_token():
    ids = torch.tensor([[5, PAD, PAD]])
    assert completion_mask(ids, [EOS, PAD], PAD).int().tolist() == [[1, 1, 0]]


def test_vision_tokens_to_suppress(processor):
    ids = vision_token_ids(processor.tokenizer)
    assert processor.tokenizer.convert_tokens_to_ids("<|video_pad|>") in ids and len(ids) == 5
