"""Multi-stage recipes (grasp_lightning/commands/pipeline.py): SFT -> SGR on the tiny model, each stage from the
previous export, an interruption mid-stage, and a resume at the stage and step where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from transformers import AutoConfig

from grasp_lightning.commands.config import override_args
from grasp_lightning.commands.pipeline import (
    STATE_FILE,
    Pipeline,
    PipelineInterrupted,
    Stage,
    latest_checkpoint,
    pipeline_from_args,
)
from tests.helpers import scalars

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _pipeline(run: Path, model: Path, interrupt_at: int | None = None) -> Pipeline:
    sgr_args = [] if interrupt_at is None else ["--trainer.callbacks+=tests.helpers.SigtermAt",
                                                f"--trainer.callbacks.init_args.step={interrupt_at}"]
    stages = [
        Stage("sft", ["configs/sft.yaml"], overrides={"trainer.max_steps": 2, "data.source.bench": None,
                                                      "model.policy.name_or_path": str(model)}),
        Stage("sgr", ["configs/sgr.yaml"], args=sgr_args,
              overrides={"trainer.max_steps": 4, "model.rollout.num_generations": 2, "data.source.val_limit": 2,
                         "data.loader.val_batch_size": 2, "model.evaluation.max_new_tokens": 4}),
    ]
    return Pipeline(stages, run, common_configs=["configs/demo.yaml"], launcher="inprocess",
                    common_overrides={"data.loader.num_workers": 0, "trainer.enable_progress_bar": False,
                                      "model.rollout.max_new_tokens": 8})


def test_two_stages_interrupted_then_resumed_at_the_stage_and_step(tiny_model_path, in_repo, tmp_path):
    """On both tiny families: each stage starts from the previous stage's export (config, weights,
    processor), so the next stage loads the family's model class from it."""
    run = tmp_path / "run"
    with pytest.raises(PipelineInterrupted, match="stage sgr stopped at step 2"):
        _pipeline(run, tiny_model_path, interrupt_at=1).run()
    state = json.loads((run / STATE_FILE).read_text())["stages"]
    assert state["sft"]["status"] == "done" and state["sft"]["global_step"] == 2
    assert state["sgr"]["status"] == "interrupted" and state["sgr"]["attempts"] == 1
    sft_export = Path(state["sft"]["export"])
    assert (sft_export / "model.safetensors").is_file() and (sft_export / "processor_config.json").is_file()
    exported_at = (sft_export / "model.safetensors").stat().st_mtime_ns
    checkpoint = latest_checkpoint(run / "stages" / "sgr")
    assert checkpoint is not None and checkpoint.name == "last.ckpt"

    results = _pipeline(run, tiny_model_path).run()  # the same command again: skip sft, resume sgr at step 2

    state = json.loads((run / STATE_FILE).read_text())["stages"]
    assert state["sft"]["attempts"] == 1 and (sft_export / "model.safetensors").stat().st_mtime_ns == exported_at
    sgr = state["sgr"]
    assert sgr["status"] == "done" and sgr["attempts"] == 2 and sgr["global_step"] == 4
    assert sgr["resumed_from"] == str(checkpoint)
    first, resumed = sorted((run / "stages" / "sgr" / "logs").glob("version_*"))
    steps_before = [s for s, _ in scalars(first)["train/loss"]]
    steps_after = [s for s, _ in scalars(resumed)["train/loss"]]
    # Preemption stops inside the 2nd batch's end hooks, after that optimizer step and its metrics (the module
    # writes a step's metrics at its last micro-batch): 2 losses logged before, then the resumed run makes
    # exactly the 2 missing optimizer steps (3 and 4), logged at steps 2 and 3
    assert steps_before == [0, 1] and steps_after == [2, 3]
    # each stage starts from the previous export; the GRPO reference is that starting policy (KL 0 at step 0)
    config = yaml.safe_load((first / "config.yaml").read_text())
    assert config["model"]["policy"]["name_or_path"] == str(sft_export)
    assert config["model"]["reference"]["name_or_path"] is None
    assert scalars(first)["train/kl"][0][1] == 0.0
    export_info = json.loads((Path(sgr["export"]) / "export_info.json").read_text())
    assert export_info["global_step"] == 4
    # each export's card names the first stage's base (SGR started from SFT's export)
    cards = [ModelCard.load(Path(d) / "README.md") for d in (sft_export, sgr["export"])]
    assert [c.data.base_model for c in cards] == [str(tiny_model_path)] * 2
    assert "- Task: `grasp_lightning.tasks.grpo.GRPOTask`" in cards[1].text and "- Training steps: 4" in cards[1].text
    family = AutoConfig.from_pretrained(tiny_model_path).model_type
    assert [AutoConfig.from_pretrained(d).model_type for d in (sft_export, sgr["export"])] == [family, family]
    # the final report sits in the run folder
    assert results == run / "results.json"
    report = json.loads(results.read_text())
    assert report["metrics"]["n/overall"] == 2 and report["meta"]["step"] == 4
    assert (run / "table.md").is_file()


def test_pipeline_config_demo_and_stage_arguments(in_repo, tmp_path):
    pipeline, only = pipeline_from_args(["--config", "configs/grasp_pipeline.yaml", "--demo", "true",
                                         "--run_dir", str(tmp_path)])
    assert only is None and [s.name for s in pipeline.stages] == ["sft", "sgr"]
    assert pipeline.run_dir == tmp_path  # --run_dir on the command line wins over the demo's folder
    assert pipeline_from_args(["--config", "configs/grasp_pipeline.yaml", "--demo", "true"])[0].run_dir == \
        Path("runs/grasp_pipeline_demo")
    assert pipeline.launcher == "subprocess" and pipeline.final_validate == ["configs/eval_suites.yaml"]
    args = pipeline.stage_args(pipeline.stages[1], "runs/x/stages/sft/export")
    assert args[:4] == ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml"]
    assert "--data.loader.num_workers=0" in args and args[-1] == "--model.policy.name_or_path=runs/x/stages/sft/export"
    assert pipeline.stage_args(pipeline.stages[0], None)[-1] != "--model.policy.name_or_path=None"
    assert override_args({"a.b": None, "c": True, "d": [1, 2], "e": 0.5}) == ["--a.b=null", "--c=true", "--d=[1, 2]",
                                                                               "--e=0.5"]
    real, _ = pipeline_from_args(["--config", "configs/grasp_pipeline.yaml"])
    assert real.run_dir == Path("runs/grasp_pipeline") and real.common_configs == [] and real.final_validate is None
    with pytest.raises(Exception, match="unique"):
        Pipeline([Stage("a", []), Stage("a", [])], tmp_path)
