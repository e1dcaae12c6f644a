"""``export``'s model card (README.md beside the weights) and ``--push_to_hub`` without a token or network.

One GRPO-SGR demo step on the tiny Qwen3-VL with a validation (so the run folder has ``bench/latest``),
exported with the run's saved config, as docs/lora-checkpoints.md shows.
"""

import sys
from pathlib import Path

import pytest

from grasp_lightning.commands.model_card import HubPushError, push_folder
from tests.helpers import one_sgr_step_args, run_cli

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

TINY = "grasp_lightning/assets/tiny-qwen3vl"


@pytest.fixture(scope="module")
def grpo_export(tmp_path_factory):
    """A one-step GRPO-SGR demo run with a validation, and ``export`` of its last checkpoint."""
    from grasp_lightning.__main__ import main as dispatch
    from tests.helpers import REPO

    tmp = tmp_path_factory.mktemp("card")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        cli = run_cli([*one_sgr_step_args("sgr", "demo"), "--data.source.bench=test/grasp_bench.tar",
                       "--data.source.val_limit=2", "--trainer.limit_val_batches=1",
                       "--model.evaluation.max_new_tokens=24"], tmp)
        log_dir = Path(cli.trainer.log_dir)
        (ckpt,) = log_dir.rglob("last.ckpt")
        out = log_dir / "export"
        assert dispatch(["export", "--config", str(log_dir / "config.yaml"), "--ckpt_path", str(ckpt),
                         "--out", str(out)]) == 0
    return {"out": out, "log_dir": log_dir, "ckpt": ckpt}


def test_export_writes_a_model_card_the_hub_parser_reads(grpo_export):
    from huggingface_hub import ModelCard

    card = ModelCard.load(grpo_export["out"] / "README.md")
    assert card.data.base_model == TINY
    assert card.text.lstrip().startswith("# tiny-qwen3vl, trained with grasp_lightning (GRPOTask)\n")
    assert card.data.license == "cc-by-nc-4.0"
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "image-text-to-text"
    assert card.data.datasets == ["interlive/GRASP"]
    assert {"grasp", "grpo", "video"} <= set(card.data.tags)
    recipe = card.text.split("## Recipe", 1)[1].split("\n## ", 1)[0]
    assert "- Task: `grasp_lightning.tasks.grpo.GRPOTask`" in recipe
    assert "- Training steps: 1" in recipe
    assert "| `model.rollout.num_generations` | `4` |" in recipe  # K of this run
    assert ("| `model.task.reward.terms` | `accuracy, format, grounding_presence, social_grounding, "
            "tests.helpers.checksum_reward` |") in recipe  # the recipe's four terms and the tests' checksum term
    assert "| `model.task.loss.beta` | `0.05` |" in recipe
    assert "| `model.lora.enabled` | `False` |" in recipe
    # the run's last validation, as bench/latest/table.md wrote it
    table = (grpo_export["log_dir"] / "bench" / "latest" / "table.md").read_text().strip()
    assert "## Evaluation" in card.text and "(step 1," in card.text and table in card.text
    assert "AutoModelForImageTextToText.from_pretrained(path" in card.text
    assert "Apache-2.0" in card.text  # the base model's own licence is named beside the weights'


def test_push_to_hub_offline_says_why_in_one_line_and_exits_1(grpo_export, monkeypatch, capsys):
    """On the command line: the export is written (its card naming ``--base_model``), then one line says why
    it was not uploaded; exit 1."""
    from grasp_lightning.__main__ import main

    out = grpo_export["out"].parent / "export_push"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["grasp_lightning", "export", "--config", str(grpo_export["log_dir"] / "config.yaml"),
                                      "--ckpt_path", str(grpo_export["ckpt"]), "--out", str(out),
                                      "--push_to_hub", "someone/grasp-demo", "--base_model", "Qwen/Qwen3-VL-2B-Instruct"])
    assert main() == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0] == ("error: HubPushError: --push_to_hub someone/grasp-demo: not uploaded: HF_HUB_OFFLINE is set "
                      f"(offline mode); unset it and run again, or upload {out} later with "
                      f"`hf upload someone/grasp-demo {out}`")
    from huggingface_hub import ModelCard

    assert ModelCard.load(out / "README.md").data.base_model == "Qwen/Qwen3-VL-2B-Instruct"  # --base_model


def test_push_without_a_token_or_network_names_the_reason(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    with pytest.raises(HubPushError, match=r"^--push_to_hub a/b: not uploaded: no Hugging Face token \(set HF_TOKEN"):
        push_folder(tmp_path, "a/b")
    # a token, but nothing listens at the endpoint (port 9 on this machine): the connection's error, one line
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    with pytest.raises(HubPushError, match=r"^--push_to_hub a/b: not uploaded: .*http://127\.0\.0\.1:9") as e:
        push_folder(tmp_path, "a/b", endpoint="http://127.0.0.1:9")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("base", "warns"), [("grasp_lightning/assets/tiny-qwen3vl", True), ("/models/qwen", True),
                                             ("Qwen/Qwen3-VL-8B-Instruct", False)])
def test_a_base_model_that_is_no_hub_id_is_named_in_a_warning(base, warns, caplog):
    """The Hub links ``base_model`` only as ``owner/name``: a local path gets a warning naming ``--base_model``."""
    from grasp_lightning.commands.model_card import build_card

    with caplog.at_level("WARNING", logger="grasp_lightning.commands.model_card"):
        card = build_card({"model": {"task": {"class_path": "grasp_lightning.tasks.sft.SFTTask"}}},
                          {"base_model": base, "global_step": 3}, run=None)
    assert card.data.base_model == base
    named = [r.getMessage() for r in caplog.records if "--base_model" in r.getMessage()]
    assert named == ([f"the model card's base_model {base!r} is not a Hugging Face Hub id (owner/name): the Hub will "
                      "not link it; give export --base_model OWNER/NAME"] if warns else [])
