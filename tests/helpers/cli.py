"""The command in this process (:func:`run_cli`), its TensorBoard logs (:func:`scalars`, :func:`event_tags`)
and the arguments several test files share (:data:`FAST`, :data:`SGR_REWARDS`, :func:`one_sgr_step_args`)."""

from __future__ import annotations

from pathlib import Path


def run_cli(args: list[str], tmp_path: Path):
    """Run ``python -m grasp_lightning`` in this process with logs under ``tmp_path``; return the CLI
    (built by :func:`grasp_lightning.commands.train.build_cli`, exactly as the command builds it)."""
    from grasp_lightning.commands.train import build_cli

    extra = [f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.default_root_dir={tmp_path}"]
    return build_cli([*args, *extra])


def scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of the TensorBoard event files under ``log_dir`` (read with EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def event_tags(log_dir: str | Path) -> dict[str, list[str]]:
    """Tags of every kind (scalars, images, histograms, tensors) in the event files under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc.Tags()


FAST = ["--data.loader.num_workers=0", "--trainer.enable_progress_bar=false"]


def find_callback(cli, cls):
    """The trainer's callback of class ``cls``."""
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, cls))


#: The SGR recipe plus :func:`checksum_reward` (non-zero advantages on the tiny models).
SGR_REWARDS = ["--model.task.init_args.reward.terms=[accuracy, format, grounding_presence, social_grounding, "
               "tests.helpers.checksum_reward]",
               "--model.task.init_args.reward.weights=[1.0, 0.1, 0.05, 0.2, 1.0]"]


def one_sgr_step_args(*configs: str) -> list[str]:
    """``fit`` of one SGR step (K = 4, 16 new tokens, lr without warm-up) over ``configs/<name>.yaml``."""
    return ["fit", *[a for name in configs for a in ("--config", f"configs/{name}.yaml")], *FAST, *SGR_REWARDS,
            "--trainer.max_steps=1", "--data.source.bench=null", "--model.rollout.num_generations=4",
            "--model.rollout.max_new_tokens=16", "--model.optim.warmup_steps=0"]


TIMES: dict[str, float] = {}  # seconds per run, printed by the session summary (conftest)
