"""The training CLI's command line: ``null`` for every nullable key of the task and data groups, and
``--print_config`` writing a YAML file that ``fit --config`` runs again."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import typing

import pytest
import yaml

from grasp_lightning.__main__ import main as dispatch
from grasp_lightning.commands.config import load_run
from grasp_lightning.commands.train import null_group_args
from grasp_lightning.datamodule import GraspDataModule
from grasp_lightning.tasks.grpo import GRPOTask
from tests.helpers import FAST, REPO, run_cli

#: Keys a link fills from another key (``GraspCLI.add_arguments_to_parser``); jsonargparse refuses them
#: on the command line, null or not.
LINKED = {"data.prompt.processor"}


def nullable_group_keys(klass: type, prefix: str) -> list[tuple[str, str, str]]:
    """``(dotted key, group, field)`` of every field typed ``X | None`` in the dataclass groups that
    ``klass.__init__`` takes (GRPOTask's reward, advantage, ...; GraspDataModule's source, video, ...)."""
    keys = []
    for name, hint in typing.get_type_hints(klass.__init__).items():
        if not dataclasses.is_dataclass(hint):
            continue
        fields = typing.get_type_hints(hint)
        for field in dataclasses.fields(hint):
            if type(None) in typing.get_args(fields[field.name]) and f"{prefix}{name}.{field.name}" not in LINKED:
                keys.append((f"{prefix}{name}.{field.name}", name, field.name))
    return keys


TASK_KEYS = nullable_group_keys(GRPOTask, "model.task.init_args.")
DATA_KEYS = nullable_group_keys(GraspDataModule, "data.")


def test_the_nullable_keys_are_found_from_the_dataclasses() -> None:
    """The enumeration sees the keys the docs name (so a new nullable field is covered by itself)."""
    task = {key for key, _, _ in TASK_KEYS}
    assert {"model.task.init_args.compute.logprob_chunk_size", "model.task.init_args.reward.weights",
            "model.task.init_args.batching.rollout_batch_prompts", "model.task.init_args.advantage.clip",
            "model.task.init_args.loss.kl_clamp", "model.task.init_args.loss.delta",
            "model.task.init_args.loss.importance_sampling_floor", "model.task.init_args.loss.off_policy_mask_threshold",
            "model.task.init_args.loss.reference_sync_steps"} <= task
    assert len(task) == 13, sorted(task)
    data = {key for key, _, _ in DATA_KEYS}
    assert {"data.source.bench", "data.video.frame_max_tokens", "data.loader.data_mode"} <= data and len(data) == 9
    assert set(inspect.signature(GRPOTask.__init__).parameters) >= {group for _, group, _ in TASK_KEYS}


@pytest.mark.parametrize("spelling", ["equals", "two_arguments"])
def test_null_reaches_every_nullable_key_of_the_task_and_data_groups(spelling, in_repo) -> None:
    """``--KEY=null`` and ``--KEY null`` for every nullable key at once, on configs/sgr.yaml (which sets
    several of them, e.g. reward.weights [1.0, 0.1, 0.05, 0.2]): each one is ``None`` in the built task
    and DataModule. jsonargparse 4.53 alone refused the task's ("Does not validate against any of the
    Union subtypes") and read a ``str | None`` key as the text "None"."""
    args = ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml"]
    for key, _, _ in TASK_KEYS + DATA_KEYS:
        args += [f"--{key}=null"] if spelling == "equals" else [f"--{key}", "null"]
    run = load_run(args)
    for key, group, field in TASK_KEYS:
        assert getattr(getattr(run.task, group), field) is None, key
    for key, group, field in DATA_KEYS:
        assert getattr(getattr(run.datamodule, group), field) is None, key
    assert run.task.reward_weights == [1.0, 1.0, 1.0, 1.0]  # null: 1.0 each, as documented
    assert run.task.compute.share_prompt is True  # the group's other keys keep the recipe's values
    assert run.task.reward.terms == ["accuracy", "format", "grounding_presence", "social_grounding"]


def test_the_null_rewrite_keeps_other_arguments_and_their_order() -> None:
    args = ["fit", "--config", "a.yaml", "--model.task.init_args.compute.logprob_chunk_size=null",
            "--model.task.init_args.reward.weights", "~", "--model.task.init_args.loss.beta", "0.1",
            "--model.task.init_args.x=null", "--trainer.max_steps", "null",
            "--model.task.init_args.batching.dynamic_sampling", "refill",
            "--a.init_args.b.init_args.c", "null"]
    assert null_group_args(args) == [
        "fit", "--config", "a.yaml", '--model.task.init_args.compute={"logprob_chunk_size": null}',
        '--model.task.init_args.reward={"weights": null}', "--model.task.init_args.loss.beta", "0.1",
        "--model.task.init_args.x=null", "--trainer.max_steps", "null",
        "--model.task.init_args.batching.dynamic_sampling", "refill", '--a.init_args.b={"init_args": {"c": null}}']


#: Each recipe and overlay, on the demo (the order a user gives them).
COMBOS = {
    "sft": ["configs/sft.yaml"],
    "sgr": ["configs/sgr.yaml"],
    "grpo": ["configs/sgr.yaml", "configs/grpo.yaml"],
    "lora": ["configs/sgr.yaml", "configs/lora.yaml"],
    "qlora": ["configs/sft.yaml", "configs/qlora.yaml"],
    "released_sft": ["configs/sft.yaml", "configs/released/sft.yaml"],
    "released_sgr": ["configs/sgr.yaml", "configs/released/sgr.yaml"],
    "released_sgr_as_run": ["configs/sgr.yaml", "configs/released/sgr.yaml", "configs/released/sgr_as_run.yaml"],
}


def _config_args(paths: list[str]) -> list[str]:
    return [arg for path in [*paths, "configs/demo.yaml"] for arg in ("--config", path)]


@pytest.mark.parametrize("name", list(COMBOS))
def test_print_config_is_a_config_that_loads_as_the_run(name, in_repo, tmp_path, capsys, monkeypatch) -> None:
    """``fit ... --print_config`` (in this process) prints YAML only; ``--config run.yaml`` alone then
    builds the same run: the same task settings, policy, data groups and trainer settings."""
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # the arguments are the dispatcher's, not pytest's
    args = _config_args(COMBOS[name])
    with pytest.raises(SystemExit) as done:
        dispatch(["fit", *args, "--print_config"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("# lightning.pytorch==") and isinstance(yaml.safe_load(text), dict)
    (tmp_path / "run.yaml").write_text(text)
    again, first = load_run(["--config", str(tmp_path / "run.yaml")]), load_run(args)
    assert type(again.task) is type(first.task)
    assert vars(again.task).keys() == vars(first.task).keys()
    for group in ("reward", "advantage", "loss", "batching", "compute"):
        assert getattr(again.task, group, None) == getattr(first.task, group, None), group
    assert again.module.policy_cfg == first.module.policy_cfg and again.module.lora_cfg == first.module.lora_cfg
    assert again.module.rollout_cfg == first.module.rollout_cfg and again.module.optim_cfg == first.module.optim_cfg
    for group in ("source", "video", "prompt", "loader", "errors"):
        assert getattr(again.datamodule, group) == getattr(first.datamodule, group), group
    for key in ("precision", "devices", "max_steps", "accumulate_grad_batches", "limit_val_batches"):
        assert again.trainer[key] == first.trainer[key], key


@pytest.mark.slow
def test_print_config_to_a_file_then_fit_from_it_a_real_process(tmp_path) -> None:
    """The user's round trip in real processes, for GRPO with LoRA (configs/sgr.yaml + lora.yaml + demo):
    ``--print_config > run.yaml`` is YAML from its first line (DeepSpeed's import warning "Setting
    accelerator to CPU" went to stdout before) and ``fit --config run.yaml`` trains 2 steps from it.
    About 35 s on 2 CPU cores (two interpreter starts and 2 GRPO steps of K = 8)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", *_config_args(COMBOS["lora"]), "--print_config"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("# lightning.pytorch=="), proc.stdout[:300]
    assert "[WARNING]" not in proc.stdout
    assert yaml.safe_load(proc.stdout)["model"]["lora"]["enabled"] is True
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(proc.stdout)
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", str(run_yaml), "--trainer.max_steps=2",
           "--trainer.limit_val_batches=0", *FAST, f"--trainer.logger.init_args.save_dir={tmp_path}",
           f"--trainer.default_root_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in out
    assert list(tmp_path.glob("**/checkpoints/last.ckpt"))
    # from the tiny model's random weights the groups have equal rewards (README says so)
    assert "step 0: every group of this step has equal rewards" in out


@pytest.mark.slow
def test_an_sft_run_trains_from_its_printed_config(in_repo, tmp_path, capsys, monkeypatch) -> None:
    """configs/sft.yaml + demo: ``--print_config`` then ``fit --config run.yaml`` for 2 steps (in this
    process, about 7 s)."""
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    with pytest.raises(SystemExit):
        dispatch(["fit", *_config_args(COMBOS["sft"]), "--print_config"])
    (tmp_path / "run.yaml").write_text(capsys.readouterr().out)
    cli = run_cli(["fit", "--config", str(tmp_path / "run.yaml"), "--trainer.max_steps=2",
                   "--trainer.limit_val_batches=0", *FAST], tmp_path)
    assert cli.trainer.global_step == 2 and type(cli.model.task).__name__ == "SFTTask"



def test_task_help_by_class_name_needs_no_config() -> None:
    """``fit --model.task.help GRPOTask`` (docs/training.md) without a --config, in a fresh process (this
    one has imported the task already): the groups' keys with their help. Before: "Expected a dot import
    path string: GRPOTask", the task's module being imported only by a config naming its class_path."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning", "fit", "--model.task.help", "GRPOTask"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--model.task.reward.weights" in proc.stdout and "--model.task.compute.logprob_chunk_size" in proc.stdout
    assert "one weight per term" in " ".join(proc.stdout.split())


def test_new_reward_terms_without_weights_say_how_to_give_them(in_repo) -> None:
    """configs/sgr.yaml's four weights stay when only the terms change: the error shows both lists and
    the two ways out, and each of them loads."""
    from grasp_lightning.errors import GraspConfigError

    args = ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml",
            "--model.task.init_args.reward.terms=[accuracy, format]"]
    with pytest.raises(GraspConfigError) as raised:
        load_run(args)
    key = "model.task.init_args.reward."
    assert str(raised.value) == (
        f"{key}terms and {key}weights: 2 terms ['accuracy', 'format'] but 4 weights [1.0, 0.1, 0.05, 0.2]. A recipe's "
        f"weights stay when only the terms change: give one weight per term with them (--{key}weights '[1.0, 1.0]'), "
        f"or --{key}weights null for 1.0 each")
    assert load_run([*args, f"--{key}weights", "[1.0, 1.0]"]).task.reward_weights == [1.0, 1.0]
    assert load_run([*args, f"--{key}weights", "null"]).task.reward_weights == [1.0, 1.0]


def test_the_readme_quickstart_says_grpo_starts_from_random_weights_and_names_the_pipeline() -> None:
    """README's GRPO quickstart runs from the random tiny model (every step warns of equal rewards, as the
    real-process round trip above shows): it says so, and its pipeline command parses into SFT then SGR
    on the demo, the SGR stage starting from the SFT stage's export."""
    from grasp_lightning.commands.pipeline import pipeline_from_args

    text = (REPO / "README.md").read_text()
    quickstart = text[text.index("Then GRPO with the Social Grounding Reward"):text.index("## Recipes")]
    assert "equal rewards" in quickstart and "random weights" in quickstart
    (command,) = re.findall(r"^python -m grasp_lightning (pipeline .*?)\s+#", quickstart, re.M)
    pipeline, only = pipeline_from_args(command.split()[1:])
    assert only is None and [stage.name for stage in pipeline.stages] == ["sft", "sgr"]
    args = pipeline.stage_args(pipeline.stages[1], "runs/x/stages/sft/export")
    assert "configs/demo.yaml" in args and args[-1] == "--model.policy.name_or_path=runs/x/stages/sft/export"
