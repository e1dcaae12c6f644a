"""grasp_lightning/policy.py: a model folder that is not on this machine stops the load with one error."""

from __future__ import annotations

import pytest

from grasp_lightning import policy
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.policy import PolicyConfig, ReferenceConfig, missing_model_message
from tests.helpers import TINY


@pytest.mark.parametrize(("name", "missing"), [
    ("runs/sft/export", True),  # configs/sgr.yaml's start before the SFT stage wrote it
    ("./model", True), ("/no/such/model", True), ("~/no_such_model_dir", True),
    ("tests/no_such_model", True),  # one slash, but tests/ is a folder here
    ("Qwen/Qwen3-VL-8B-Instruct", False), ("Qwen/Qwen2.5-VL-7B-Instruct", False),  # Hub ids (a dot is no suffix)
    ("gpt2", False), (str(TINY), False),
])
def test_a_missing_folder_is_told_from_a_hub_id(name, missing, in_repo) -> None:
    assert policy.is_missing_local_path(name) is missing


def test_loading_a_missing_folder_names_the_key_and_what_to_do(in_repo) -> None:
    """The processor, the policy and a separate reference: GraspConfigError with the key and path, not
    transformers' "Repo id must be in the form ..." after a 40-line traceback."""
    message = missing_model_message("runs/sft/export")
    assert message.startswith("model.policy.name_or_path: model 'runs/sft/export' is not on this machine")
    assert "python -m grasp_lightning fit --config configs/sft.yaml" in message
    assert "--out runs/sft/export" in message
    with pytest.raises(GraspConfigError) as raised:
        policy.load_processor("runs/sft/export")
    assert str(raised.value) == message
    with pytest.raises(GraspConfigError) as raised:
        policy.load_model("runs/sft/export", dtype="float32")
    assert str(raised.value) == message
    with pytest.raises(GraspConfigError, match=r"^model.reference.name_or_path: model './ref' is not on this machine"):
        policy.load_reference(PolicyConfig(name_or_path=str(TINY)), ReferenceConfig(name_or_path="./ref"))
