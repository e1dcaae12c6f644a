"""callbacks/watch.py: the console line of a step, for SFT and GRPO, from the logged values."""

from __future__ import annotations

from grasp_lightning.callbacks.watch import STEP_TIME, console_line


def test_sft_line_shows_loss_response_tokens_per_second_lr_time_and_eta() -> None:
    values = {"train/loss": 2.34567, "train/tokens/loss": 800.0, "lr": 1e-5, STEP_TIME: 2.0}
    assert console_line(9, 100, values, 3725.4) == (
        "step 10/100 | loss 2.346 | 400 tok/s | lr 1.00e-05 | 2.00 s/step | ETA 1:02:05")


def test_grpo_line_shows_reward_accuracy_kl_length_zero_variance_and_leaves_out_what_is_missing() -> None:
    values = {"train/reward/mean": 0.41234, "train/rewards/accuracy/mean": 0.25, "train/kl": 0.0012345,
              "train/completion_length/mean": 143.04, "train/zero_variance_groups/fraction": 0.5,
              "train/loss": 0.0123, "train/tokens/generated": 1000.0, STEP_TIME: 2.305}
    assert console_line(2, None, values, None) == (
        "step 3 | reward 0.4123 (accuracy 0.2500) | kl 0.001234 | len 143.0 | zero-var 0.50 | loss 0.0123 | 2.31 s/step")
