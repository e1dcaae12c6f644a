"""``fit --config configs/sgr.yaml --config configs/demo.yaml`` for two steps with each loss type, with the
sequence-level ratio, and with docs/training.md's overlay of the objective family (its YAML block, as written).

Each run is in-process on the tiny Qwen3-VL (K = 2, 16 new tokens, no validation), with the SGR rewards plus
``tests.helpers.checksum_reward`` so that the advantages are not all zero.
"""

from __future__ import annotations

import math

import pytest
import yaml

from grasp_lightning.grpo.objective import LOSS_TYPES
from tests.helpers import FAST, SGR_REWARDS, blocks, run_cli, section

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

TWO_STEPS = ["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *FAST, *SGR_REWARDS,
             "--trainer.max_steps=2", "--data.source.bench=null", "--model.rollout.num_generations=2",
             "--model.rollout.max_new_tokens=16", "--model.optim.warmup_steps=0"]


def _run(extra: list[str], tmp_path) -> dict[str, float]:
    cli = run_cli([*TWO_STEPS, *extra], tmp_path)
    assert cli.trainer.global_step == 2
    metrics = cli.model.last_step_metrics
    assert math.isfinite(metrics["train/loss"])
    return metrics


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_two_steps_with_each_loss_type(loss_type, in_repo, tmp_path):
    extra = [f"--model.task.init_args.loss.type={loss_type}"]
    if loss_type == "cispo":
        extra.append("--model.task.init_args.loss.epsilon_high=5.0")
    metrics = _run(extra, tmp_path)
    assert ("train/clip_ratio" in metrics) == (loss_type not in ("sapo", "vespo"))
    assert ("train/vespo/weight_mean" in metrics) == (loss_type == "vespo")


def test_two_steps_with_the_sequence_level_ratio(in_repo, tmp_path):
    metrics = _run(["--model.task.init_args.loss.ratio_level=sequence", "--model.task.init_args.loss.type=luspo"],
                   tmp_path)
    assert metrics["train/ratio/mean"] == pytest.approx(1.0)  # each rollout used once, at the step that sampled it


def test_the_docs_overlay_of_the_objective_family(in_repo, tmp_path):
    (overlay,) = blocks(section("### The objective family", "docs/training.md"), "yaml")
    loss = yaml.safe_load(overlay)["model"]["task"]["init_args"]["loss"]
    path = tmp_path / "objective.yaml"
    path.write_text(overlay)
    cli = run_cli([*TWO_STEPS, "--config", str(path), "--model.task.init_args.loss.top_entropy_quantile=0.5"],
                  tmp_path)
    task = cli.model.task
    assert task.loss.ratio_level == loss["ratio_level"] == "sequence" and task.loss.adaptive_entropy
    assert task.loss.beta == 0.05  # the recipe's other keys stay
    metrics = cli.model.last_step_metrics
    # 16 new tokens: every completion of the tiny model is cut off, so mask_truncated leaves no loss token
    assert metrics["train/completion_length/truncated_fraction"] == 1.0
    assert metrics["train/masked/truncated_completions"] == 2 * 2  # the step's 2 prompts x K = 2
    assert metrics["train/masked/low_entropy_tokens"] == 0.0
    # the first step's entropy over no token is 0 (TRL: 0 / max(0, 1)), at or below the 0.5 target: at the
    # second step the coefficient rose by entropy_coef_delta (0.005) and the bonus acted
    assert task.entropy_control.last_entropy == 0.0
    assert metrics["train/entropy/coef"] == pytest.approx(loss["entropy_coef"] + 0.005)
    assert metrics["train/entropy/coef_applied"] == pytest.approx(loss["entropy_coef"] + 0.005)
