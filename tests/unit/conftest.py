"""Fixtures of the unit tests of the model paths: the tiny family under test and two RL prompts of it."""

import pytest

from tests.helpers import FAMILIES, TINY_MODELS, sample_rl_datamodule


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> str:
    """The tiny model family under test: every test of this module runs on both."""
    return request.param


@pytest.fixture(scope="module")
def prompts(family):
    """Two left-padded RL prompts of different lengths with their 8-frame clips (sample data)."""
    dm = sample_rl_datamodule(TINY_MODELS[family])
    batch = next(iter(dm.train_dataloader()))
    lengths = batch.inputs["attention_mask"].sum(1)
    assert lengths[0] != lengths[1]  # the left padding is exercised
    return batch.inputs, dm.processor.tokenizer
