"""The command table and its dispatcher, the one config loader, the planner asking the task, and the errors
a command stops with before it starts: ``build-model``'s usage errors, a vLLM ``fit`` without room to sync
the weights."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from grasp_lightning.__main__ import main as dispatch
from grasp_lightning.commands import COMMANDS
from grasp_lightning.commands.config import config_args, load_run
from grasp_lightning.task import Task
from tests.helpers import REPO, run_cli

#: Every command users are told about: LightningCLI's four, ours, and the synthetic models' and data's.
EXPECTED = ["fit", "validate", "test", "predict", "chat", "export", "pipeline", "check-data", "plan-memory", "plot",
            "build-model", "make-sample"]


def test_the_table_holds_every_command_and_help_lists_them() -> None:
    """``python -m grasp_lightning --help`` (a real process) lists each command with its one-line help."""
    assert list(COMMANDS) == EXPECTED
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name, command in COMMANDS.items():
        assert re.search(rf"^ +{re.escape(name)}\s", proc.stdout, re.M), name
        assert command.help.split(",")[0] in " ".join(proc.stdout.split()), name


def test_a_configuration_error_on_the_command_line_is_its_message_alone() -> None:
    """A bad value from the command line: exit status 1 and one line naming the key and what is wrong,
    no traceback through LightningCLI; ``GRASP_TRACEBACK=1`` brings the traceback back."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml",
           "--model.task.init_args.batching.max_resample=-1"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "error: GraspConfigError: model.task.init_args.batching.max_resample must be >= 0, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(cmd, cwd=REPO, env={**env, "GRASP_TRACEBACK": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "max_resample must be >= 0" in proc.stderr


def test_a_gpu_recipe_on_a_cpu_machine_is_one_line_naming_the_demo_overlay() -> None:
    """``fit --config configs/sgr.yaml`` without ``configs/demo.yaml`` on a machine without a GPU: Lightning's
    refusal of the trainer settings, in one line with what to do, status 1 (a 44-line traceback before)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", "configs/sgr.yaml", "--trainer.max_steps=1"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: MisconfigurationException: ") and "--config configs/demo.yaml" in line, line
    assert "Traceback" not in proc.stderr


def test_export_of_a_file_that_is_no_checkpoint_says_so(tmp_path) -> None:
    """``export --ckpt_path`` naming a file torch cannot read (a YAML here): one error naming the file, not
    torch's advice to load it with ``weights_only=False``."""
    from grasp_lightning.commands.export import load_checkpoint_state
    from grasp_lightning.errors import GraspConfigError

    bad = tmp_path / "run.yaml"
    bad.write_text("model: {}\n")
    with pytest.raises(GraspConfigError, match=rf"{re.escape(str(bad))}: not a Lightning checkpoint \(torch.load cannot"):
        load_checkpoint_state(bad)


def test_no_command_lists_them_too_and_an_unknown_one_is_refused(capsys) -> None:
    assert dispatch([]) == 2
    out = capsys.readouterr().out
    assert all(re.search(rf"^ +{re.escape(name)}\s", out, re.M) for name in COMMANDS)
    with pytest.raises(SystemExit) as done:
        dispatch(["fitt"])
    assert done.value.code == 2 and "unknown command 'fitt'" in capsys.readouterr().err


@pytest.mark.parametrize("name", EXPECTED)
def test_every_command_has_its_own_help(name, in_repo, capsys) -> None:
    """``python -m grasp_lightning NAME --help`` exits 0 with the command's own usage; fit's is LightningCLI's."""
    with pytest.raises(SystemExit) as done:
        dispatch([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    if COMMANDS[name].lightning:  # LightningCLI's subcommand parser: the trainer, model and data arguments
        assert "--trainer.max_steps" in out and "--model.task" in out and "--data.video.fps" in out
        assert "--watch.console" in out and "--watch.curves" in out  # the console line and curves.png of every run
    if name == "plot":
        assert "RUN_DIR" in out and "--out" in out
    if name in ("export", "check-data"):  # the run's configuration plus the command's own arguments
        assert "--model.policy.name_or_path" in out and ("--out" in out if name == "export" else "--files" in out)


def _yaml(*paths: str) -> list[dict]:
    return [yaml.safe_load((REPO / p).read_text()) for p in paths]


def test_the_loader_instantiates_the_run_with_the_yaml_values(in_repo) -> None:
    """configs/sgr.yaml then configs/demo.yaml: the later file wins, every key as the YAML says."""
    sgr, demo = _yaml("configs/sgr.yaml", "configs/demo.yaml")
    run = load_run(config_args(["configs/sgr.yaml", "configs/demo.yaml"]))
    from grasp_lightning.tasks.grpo import GRPOTask

    task_args = sgr["model"]["task"]["init_args"]
    assert isinstance(run.task, GRPOTask) and run.task is run.module.task
    assert (run.task.reward.terms, run.task.reward.weights) == (task_args["reward"]["terms"],
                                                                  task_args["reward"]["weights"])
    assert (run.task.loss.beta, run.task.compute.share_prompt) == (task_args["loss"]["beta"],
                                                                   task_args["compute"]["share_prompt"])
    assert run.task.needs_reference and run.task.samples_rollouts and run.task.shares_prompt
    policy = {**sgr["model"]["policy"], **demo["model"]["policy"]}
    assert run.module.policy_cfg.name_or_path == policy["name_or_path"] == "grasp_lightning/assets/tiny-qwen3vl"
    assert (run.module.policy_cfg.dtype, run.module.policy_cfg.gradient_checkpointing,
            run.module.policy_cfg.freeze_vision) == (policy["dtype"], policy["gradient_checkpointing"],
                                                      policy["freeze_vision"])
    assert run.module.policy is None  # the loader loads no weights
    assert run.module.rollout_cfg.num_generations == sgr["model"]["rollout"]["num_generations"]
    assert run.module.rollout_cfg.max_new_tokens == demo["model"]["rollout"]["max_new_tokens"]
    assert run.module.optim_cfg.lr == demo["model"]["optim"]["lr"]
    assert run.module.optim_cfg.scheduler == sgr["model"]["optim"]["scheduler"]
    assert not run.module.lora_cfg.enabled
    h = run.datamodule.hparams
    for group, key in (("source", "root"), ("source", "train_file"), ("video", "fps"), ("video", "max_frames"),
                       ("video", "max_pixels"), ("prompt", "max_prompt_tokens"), ("loader", "batch_size"),
                       ("errors", "on_bad_item")):
        assert h[group][key] == {**sgr["data"][group], **demo["data"][group]}[key], key
    assert run.datamodule.prompt.processor == policy["name_or_path"]  # linked to the policy, as for fit
    trainer = {**sgr["trainer"], **demo["trainer"]}
    for key in ("precision", "devices", "num_nodes", "accumulate_grad_batches", "max_steps", "strategy"):
        assert run.trainer[key] == trainer[key], key


class SamplingObjective(Task):
    """A task of some other name that samples rollouts against a reference model (for the planner)."""

    needs_reference = True
    samples_rollouts = True
    shares_prompt = False
    data_mode = "rl"


class TargetObjective(Task):
    """The same without rollouts: trained on targets, no reference model."""


@pytest.mark.parametrize("name", ["SamplingObjective", "TargetObjective"])
def test_the_planner_asks_the_task_not_its_name(name, in_repo, tmp_path) -> None:
    """plan-memory on a custom task: rollout memory, K sequences and a reference model because the task
    says it samples rollouts and needs a reference, whatever its class is called."""
    from grasp_lightning.commands.plan_memory import plan_from_config

    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump({"model": {"task": {"class_path": f"tests.cli.test_commands.{name}"}}}))
    plan = plan_from_config(["configs/demo.yaml", task], video_seconds=4)
    k, batch = plan.spec.num_generations, _yaml("configs/demo.yaml")[0]["data"]["loader"]["batch_size"]
    if name == "SamplingObjective":
        assert plan.spec.task == "SamplingObjective" and plan.spec.samples_rollouts and not plan.spec.shares_prompt
        assert plan.rollout > 0 and plan.kv_cache > 0 and plan.how["rollout"].startswith("KV cache")
        assert plan.sequences == batch * k and plan.reference_model > 0
    else:
        assert plan.rollout == 0 and plan.kv_cache == 0 and plan.sequences == batch and plan.reference_model == 0
        assert plan.how["rollout"] == "TargetObjective: no rollout"


def test_usage_lines_name_the_command_users_type(in_repo, capsys) -> None:
    """The usage line of every command starts with ``python -m grasp_lightning`` (not ``__main__.py``)."""
    for name in EXPECTED:
        with pytest.raises(SystemExit):
            dispatch([name, "--help"])
        out = capsys.readouterr().out
        assert "__main__.py" not in out, name
        assert re.search(r"usage: python -m grasp_lightning( \[options\] " + re.escape(name) + r"| " + re.escape(name)
                         + r")\b", out), (name, out[:200])


def test_settings_the_task_refuses_stop_the_loader_as_they_stop_fit(in_repo) -> None:
    """K = 1 has no group advantage: GRPOTask refuses it when the module is built, so check-data and
    plan-memory (through load_run) refuse it too, before any weight is loaded."""
    from grasp_lightning.errors import GraspConfigError

    with pytest.raises(GraspConfigError, match="model.rollout.num_generations must be >= 2"):
        load_run(config_args(["configs/sgr.yaml", "configs/demo.yaml"], {"model.rollout.num_generations": 1}))
    with pytest.raises(SystemExit) as done:
        dispatch(["plan-memory", "--config", "configs/sgr.yaml", "--gpu-memory-gib", "0"])
    assert done.value.code == 2


def test_a_demo_fit_logs_each_line_once_and_no_bitsandbytes_warning(tmp_path) -> None:
    """A one-step demo fit (a real process): Lightning's INFO lines are printed once, by the root handler
    (``lightning``'s own console handler would print each again as ``INFO: ...``), and bitsandbytes'
    import warning (peft imports it in every run) does not appear in a run without 4-bit weights."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", "configs/sft.yaml", "--config",
           "configs/demo.yaml", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
           "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.default_root_dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count("Seed set to 0") == 1, out
    assert out.count("`Trainer.fit` stopped: `max_steps=1` reached.") == 1, out
    assert re.search(r"^\S+ \S+ INFO lightning.fabric.utilities.seed: Seed set to 0$", out, re.M), out
    assert not re.search(r"^INFO: ", out, re.M), out
    assert "bitsandbytes" not in out, [line for line in out.splitlines() if "bitsandbytes" in line]


def test_bitsandbytes_warnings_pass_once_four_bit_weights_are_asked_for(monkeypatch, caplog) -> None:
    """The filter on bitsandbytes' loggers drops their warnings until :func:`bnb_config` runs (QLoRA);
    errors always pass."""
    import logging

    from grasp_lightning import quantization

    monkeypatch.setattr(quantization, "_four_bit_requested", False)
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        bnb.warning("Failed to load CPU gemm_4bit_forward")
        bnb.error("a real failure")
        hub = logging.getLogger("kernels._internals.hf_hub")
        hub.warning("Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'")
        hub.warning("another kernel")
        assert [r.getMessage() for r in caplog.records] == ["a real failure", "another kernel"]
        monkeypatch.setattr(quantization, "_four_bit_requested", True)
        bnb.warning("Failed to load CPU gemm_4bit_forward")
    assert [r.getMessage() for r in caplog.records] == ["a real failure", "another kernel",
                                                        "Failed to load CPU gemm_4bit_forward"]


def test_help_says_what_each_command_does_and_names_its_page(in_repo, capsys, monkeypatch) -> None:
    """predict's help was Lightning's docstring cut mid-sentence ("... Useful to"), the top-level help
    called predict "Lightning's predict loop" and sent plan-memory's table to the README (it is in
    docs/scaling.md), and pipeline --help gave runs/pipeline_demo for --demo true while
    configs/grasp_pipeline.yaml says runs/grasp_pipeline_demo."""
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    for name, command in COMMANDS.items():
        assert command.doc is None or (REPO / command.doc).is_file(), (name, command.doc)
    assert "Lightning's" not in COMMANDS["predict"].help and "README" not in COMMANDS["plan-memory"].help

    def help_of(name: str) -> str:
        with pytest.raises(SystemExit) as done:
            dispatch([name, "--help"])
        assert done.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    predict = help_of("predict").split(" options: ")[0]  # the usage, then the description
    assert "Answer every evaluation suite's items, or data.source.predict_file's, without scoring them" in predict
    assert "How-to: docs/predict.md." in predict and "Run inference on your data" not in predict
    assert "How-to: docs/evaluation.md." in help_of("validate") and "How-to: docs/training.md." in help_of("fit")
    plan = help_of("plan-memory")
    assert "--table: the memory table of docs/scaling.md" in plan and "How-to: docs/scaling.md." in plan
    assert "README" not in plan
    pipeline = help_of("pipeline")
    demo_dir = yaml.safe_load((REPO / "configs/grasp_pipeline.yaml").read_text())["demo_settings"]["run_dir"]
    assert f"--demo_settings.run_dir RUN_DIR the demo's run folder, instead of run_dir (configs/grasp_pipeline.yaml's). " \
           f"(type: str, default: {demo_dir})" in pipeline, pipeline
    assert "pipeline_demo" not in pipeline.replace(demo_dir, "")


# ------------------------------------------------------------------ errors before a command starts
def test_command_line_lists_qwen3_5_and_refuses_a_stand_in_without_full_attention(tmp_path):
    """``python -m grasp_lightning build-model``: the help names every known checkpoint; a Qwen3.5 stand-in of
    3 layers is a usage error before anything is written (the 4-layer one is built in the real-shape tier), and
    so is an unknown ``--like`` to ``python -m grasp_lightning.synthetic.tiny`` (exit status 2, no traceback)."""
    from grasp_lightning.synthetic.standin import checkpoint_names

    run = [sys.executable, "-m", "grasp_lightning", "build-model"]
    help_text = subprocess.run([*run, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    assert all(name in " ".join(help_text.split()) for name in checkpoint_names()) and "Qwen3.5-9B" in help_text
    out = tmp_path / "never"
    proc = subprocess.run([*run, str(out), "--like", "Qwen/Qwen3.5-9B", "--text-layers", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "error: --text-layers 3: in Qwen3.5 every 4th decoder layer" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning.synthetic.tiny", str(out), "--like", "Qwen3-VL-8B-Base"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "error: --like 'Qwen3-VL-8B-Base': not a known checkpoint; known: " in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_fit_with_a_too_small_weight_sync_dir_stops_before_the_first_step(tmp_path, monkeypatch, in_repo):
    """``fit`` of GRPO-SGR with ``engine: vllm`` (no vLLM environment needed: the check comes first) stops at
    the first rollout, before the server starts and before any optimizer step, naming the setting."""
    import shutil

    from grasp_lightning.engines.vllm import VLLMEngine
    from grasp_lightning.errors import GraspConfigError

    python = tmp_path / "python"
    python.write_text("")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=4096))
    started = []
    monkeypatch.setattr(VLLMEngine, "_connect", lambda self, *a: started.append(a))
    args = ["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
            "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0", "--data.source.train_limit=4",
            "--trainer.max_steps=1", "--model.rollout.engine=vllm", f"--model.rollout.vllm.python={python}",
            f"--model.rollout.vllm.weight_sync_dir={tmp_path / 'shm'}"]
    with pytest.raises(GraspConfigError, match=rf"{tmp_path / 'shm'} has 4096 bytes \(0.00 MiB\) free, but the policy's "
                                               r"language-model weights need \d+ bytes .*Set "
                                               r"model.rollout.vllm.weight_sync_dir to a directory with room"):
        run_cli(args, tmp_path / "run")
    assert started == [] and not list((tmp_path / "run").rglob("*.ckpt"))


def test_cli_writes_a_stand_in_that_loads_like_a_download(tmp_path):
    """``python -m grasp_lightning.synthetic.tiny OUT --like ...``: real widths, 1 + 1 layers (for speed), loaded
    back through the policy loader (``AutoModelForImageTextToText`` / ``AutoProcessor``)."""
    import json

    import torch

    from grasp_lightning.policy import load_model, load_processor
    from grasp_lightning.synthetic.tiny import main

    out = tmp_path / "standin"
    main([str(out), "--like", "Qwen3-VL-2B-Thinking", "--text-layers", "1", "--vision-layers", "1"])
    model = load_model(str(out), dtype="auto")
    processor = load_processor(str(out))
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    t = model.config.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.vocab_size, model.config.vision_config.depth) == (2048, 1, 151_936, 1)
    assert model.dtype == torch.bfloat16
    g = model.generation_config
    assert (g.eos_token_id, g.pad_token_id, g.do_sample, g.top_k, g.top_p, g.temperature) == \
        ([151645, 151643], 151643, True, 20, 0.95, 1.0)
    assert len(processor.tokenizer) == 151_669 and processor.tokenizer.pad_token_id == 151643
    assert processor.video_processor.size["longest_edge"] == 25_165_824 and processor.video_processor.patch_size == 16
    assert processor.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         tokenize=False) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert (out / "processor_config.json").is_file()
    info = json.loads((out / "STANDIN.json").read_text())
    assert info["like"] == "Qwen3-VL-2B-Thinking" and info["parameters"] == sum(p.numel() for p in model.parameters())
