"""Scaling: DeepSpeed ZeRO-2, gradient accumulation, exact resume, atomic checkpoints, HF export, LoRA.

The ZeRO-2 tests run DeepSpeed's real engine on 2 CPU processes over gloo
(``tests/helpers/recorders.py``), launched the way ``torchrun`` launches them (one process per rank with
``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set). One module fixture runs,
on the SFT demo (deterministic):

* ``A``: ZeRO-2, 2 ranks x batch 1 x accumulate 2, 8 optimizer steps (crossing into epoch 2),
  a checkpoint every 2 steps;
* ``P``: the same global batch without DeepSpeed: 1 process x batch 1 x accumulate 4;
* ``C``: resumed from A's step-2 checkpoint (a mid-epoch, mid-schedule checkpoint, byte for byte
  what a run killed after step 2 leaves; a run stopped with ``max_steps=2`` instead would have built
  a 2-step cosine schedule) to step 8;
* ``G``: GRPO-SGR under ZeRO-2, starting from A's exported policy (the next stage after SFT).
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
import yaml

from grasp_lightning.checkpointing import COMPLETE_MARKER, remove_partials, require_complete, save_checkpoint_atomic
from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from grasp_lightning.errors import GraspConfigError
from tests.helpers import REPO, SAMPLE, TINY, launch_ranks, read_meta, read_steps, run_cli, scalars, wait_ranks

SFT = ["--config", "configs/sft.yaml", "--config", "configs/demo.yaml"]
STEPS, RESUME_AT = 8, 2
RUN_TIMEOUT = 420


def _config(path: Path, trainer: dict, data: dict | None = None, model: dict | None = None) -> list[str]:
    path.write_text(yaml.safe_dump({"trainer": trainer, "data": data or {}, "model": model or {}}))
    return ["--config", str(path)]


def _zero2(devices: int = 2) -> dict:
    """The recipes' ZeRO-2 settings (configs/sft.yaml) on the CPU test strategy."""
    return {"devices": devices, "strategy": {"class_path": "grasp_lightning.strategies.CPUDeepSpeedStrategy", "init_args": {
        "stage": 2, "overlap_comm": True, "contiguous_gradients": True, "allgather_bucket_size": 200000000,
        "reduce_bucket_size": 200000000}}}


def _sft_trainer(run: Path, accumulate: int, devices: int, zero2: bool, checkpoints: bool) -> dict:
    callbacks = [{"class_path": "tests.helpers.StepRecorder", "init_args": {"out_dir": str(run / "rec")}}]
    if checkpoints:
        callbacks.insert(0, {"class_path": "grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint", "init_args": {
            "dirpath": str(run / "ckpt"), "every_n_train_steps": RESUME_AT, "save_top_k": -1}})
    trainer = {"devices": devices, "accumulate_grad_batches": accumulate, "max_steps": STEPS, "max_epochs": 2,
               "limit_val_batches": 0, "enable_progress_bar": False, "enable_model_summary": False,
               "callbacks": callbacks, "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                                                  "init_args": {"save_dir": str(run), "name": "tb"}},
               "default_root_dir": str(run)}
    return {**trainer, **(_zero2(devices) if zero2 else {})}


def _ckpt(run: Path, step: int) -> Path:
    (path,) = (run / "ckpt").glob(f"epoch=*-step={step}.ckpt")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A and P (together), export A, then C and G (together); return their folders."""
    root = tmp_path_factory.mktemp("scale")
    a, p, c, g = (root / n for n in "apcg")
    for d in (a, p, c, g):
        d.mkdir()
    t0 = time.monotonic()
    data = {"loader": {"batch_size": 1, "num_workers": 0}}
    procs_a = launch_ranks(["fit", *SFT, *_config(a / "c.yaml", _sft_trainer(a, 2, 2, True, True), data)], a / "run")
    with ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        mp.chdir(REPO)
        run_cli(["fit", *SFT, *_config(p / "c.yaml", _sft_trainer(p, 4, 1, False, False), data)], p)
    wait_ranks(procs_a, a / "run", RUN_TIMEOUT)
    t1 = time.monotonic()
    from grasp_lightning.commands.export import main as export_main

    with ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        mp.chdir(REPO)
        export_main([*SFT, "--ckpt_path", str(_ckpt(a, STEPS)), "--out", str(a / "export")])
    procs_c = launch_ranks(["fit", *SFT, *_config(c / "c.yaml", _sft_trainer(c, 2, 2, True, True), data),
                       "--ckpt_path", str(_ckpt(a, RESUME_AT))], c / "run")
    grpo_trainer = {**_zero2(), "max_steps": 2, "accumulate_grad_batches": 1, "limit_val_batches": 0,
                    "enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": str(g),
                    "logger": False, "callbacks": [{"class_path": "tests.helpers.StepRecorder",
                                                    "init_args": {"out_dir": str(g / "rec")}}]}
    procs_g = launch_ranks(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml",
                       *_config(g / "c.yaml", grpo_trainer, {"loader": {"batch_size": 1, "num_workers": 0}},
                                {"policy": {"name_or_path": str(a / "export")},
                                 "rollout": {"num_generations": 4, "max_new_tokens": 16}})], g / "run")
    wait_ranks(procs_c, c / "run", RUN_TIMEOUT)
    wait_ranks(procs_g, g / "run", RUN_TIMEOUT)
    print(f"\n[test_scale] A+P {t1 - t0:.0f}s, export+C+G {time.monotonic() - t1:.0f}s")
    return {"a": a, "p": p, "c": c, "g": g}


# ---------------------------------------------------------------------------- ZeRO-2 runs
@pytest.mark.slow
def test_zero2_accumulation_equals_plain_accumulation(runs):
    """ZeRO-2 (2 ranks x accumulate 2) and a plain run (1 process x accumulate 4) see the same 4 samples
    per optimizer step; with the loss scaled once, their gradients and updates agree. (Stock Lightning
    + DeepSpeed divides twice: the gradient norm is then exactly 1/2 of the plain one.)"""
    ranks = [read_steps(runs["a"] / "rec", r) for r in (0, 1)]
    plain = read_steps(runs["p"] / "rec")
    assert len(plain) == 4 * STEPS and all(len(rows) == 2 * STEPS for rows in ranks)
    # Rank r takes positions r, r+2, ... of the epoch's order; the plain run takes them all in turn.
    assert [row["indices"] for row in plain[0::2]] == [row["indices"] for row in ranks[0]]
    assert [row["indices"] for row in plain[1::2]] == [row["indices"] for row in ranks[1]]
    zero_norms = [row["grad_norm"] for row in ranks[0] if row["grad_norm"] is not None]
    plain_norms = [row["grad_norm"] for row in plain if row["grad_norm"] is not None]
    assert len(zero_norms) == len(plain_norms) == STEPS
    torch.testing.assert_close(torch.tensor(zero_norms), torch.tensor(plain_norms), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor([row["loss"] for row in ranks[0]]),
                               torch.tensor([row["loss"] for row in plain[0::2]]), rtol=2e-6, atol=2e-6)
    # One optimizer step per accumulation window, in Lightning's counter and in DeepSpeed's engine.
    assert [row["global_step"] for row in ranks[0]] == [(i + 1) // 2 for i in range(2 * STEPS)]
    end = read_meta(runs["a"] / "rec", "end")
    assert end == {"global_step": STEPS, "engine_global_steps": STEPS, "engine_micro_steps": 2 * STEPS}
    # The learning rate changes only at step boundaries and follows the plain run's schedule.
    assert [row["lr"] for row in ranks[0][1::2]] == [row["lr"] for row in plain[3::4]]
    assert all(ranks[0][i]["lr"] == ranks[0][i + 1]["lr"] for i in range(1, 2 * STEPS - 1, 2))


@pytest.mark.slow
def test_zero2_resume_continues_exactly(runs):
    """Resumed from the step-2 sharded checkpoint, every later micro-batch matches the uninterrupted run:
    same samples, losses, learning rates, RNG draws and gradient norms, across the epoch boundary."""
    for rank in (0, 1):
        full = read_steps(runs["a"] / "rec", rank)
        resumed = read_steps(runs["c"] / "rec", rank)
        assert resumed == full[2 * RESUME_AT:], f"rank {rank}"
    assert {row["epoch"] for row in resumed} == {0, 1}
    for step in (2, 4, 6, 8):
        assert (_ckpt(runs["c"], step) if step > RESUME_AT else _ckpt(runs["a"], step)).is_dir()
    require_complete(_ckpt(runs["c"], STEPS))


@pytest.mark.slow
def test_export_of_zero2_checkpoint_reloads_with_identical_logits(runs):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = runs["a"] / "export"
    saved = torch.load(runs["a"] / "rec" / "final_logits.pt")
    model = AutoModelForImageTextToText.from_pretrained(out)
    with torch.no_grad():
        logits = model(input_ids=saved["input_ids"], attention_mask=torch.ones_like(saved["input_ids"])).logits
    torch.testing.assert_close(logits, saved["logits"], rtol=0, atol=1e-6)
    base = AutoModelForImageTextToText.from_pretrained(TINY)
    with torch.no_grad():
        before = base(input_ids=saved["input_ids"]).logits
    assert (before - logits).abs().max() > 1e-2  # the export holds the trained weights
    assert AutoProcessor.from_pretrained(out).tokenizer.get_vocab() == AutoProcessor.from_pretrained(TINY).tokenizer.get_vocab()
    info = json.loads((out / "export_info.json").read_text())
    assert info["global_step"] == STEPS and info["lora"] is False
    assert not list(out.parent.glob(".partial-*"))


@pytest.mark.slow
def test_grpo_under_zero2_from_exported_sft(runs):
    """GRPO-SGR generates under ZeRO-2, starting from the exported SFT policy, which is also the frozen
    reference: the KL is exactly 0 at step 0, the reference is neither in the optimizer nor saved."""
    for rank in (0, 1):
        rows = read_steps(runs["g"] / "rec", rank)
        assert len(rows) == 2 and all(row["loss"] is not None for row in rows)
        assert rows[0]["kl"] == 0.0
        meta = read_meta(runs["g"] / "rec", "start", rank)
        assert meta["optimizer"] == "DeepSpeedZeroOptimizer" and meta["world_size"] == 2
        assert meta["reference_loaded"] and meta["reference_params_in_optimizer"] == 0
        assert meta["optimizer_numel"] == meta["policy_trainable_numel"] > 0
        assert not meta["reference_in_state_dict"]


@pytest.mark.slow
def test_incomplete_deepspeed_checkpoint_is_refused(runs, tmp_path):
    from grasp_lightning.commands.export import export_checkpoint
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.strategies import GraspDeepSpeedStrategy

    good = _ckpt(runs["a"], RESUME_AT)
    no_marker = shutil.copytree(good, tmp_path / "no_marker.ckpt")
    (no_marker / COMPLETE_MARKER).unlink()
    truncated = shutil.copytree(good, tmp_path / "truncated.ckpt")
    shard = truncated / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    strategy = GraspDeepSpeedStrategy(stage=2)
    with pytest.raises(GraspConfigError, match="save did not finish"):
        strategy.load_checkpoint(no_marker)
    with pytest.raises(GraspConfigError, match="zero_pp_rank_1.*truncated"):
        strategy.load_checkpoint(truncated)
    with pytest.raises(GraspConfigError, match="save did not finish"):
        export_checkpoint(no_marker, tmp_path / "out", PolicyConfig(name_or_path=str(TINY), dtype="float32"))
    assert not (tmp_path / "out").exists()


def test_deepspeed_accumulation_windows_must_not_straddle_epochs():
    from grasp_lightning.strategies import check_accumulation

    check_accumulation(12, 2, 2)
    check_accumulation(13, 2, 1)  # one epoch: the last partial window is simply not applied
    check_accumulation(float("inf"), 4, None)
    with pytest.raises(GraspConfigError, match="limit_train_batches=12 .*last 1 batches"):
        check_accumulation(13, 4, 2)
    with pytest.raises(GraspConfigError, match="not a multiple"):
        check_accumulation(13, 2, -1)


# ---------------------------------------------------------------------------- atomic saves
class _FakeStrategy:
    def broadcast(self, obj):
        return obj

    def barrier(self, name=None):
        pass


class _FakeTrainer:
    """Just what :func:`save_checkpoint_atomic` touches; ``save_checkpoint`` writes a sharded directory."""

    is_global_zero, global_step, current_epoch, world_size = True, 7, 0, 2
    strategy = _FakeStrategy()

    def __init__(self, crash_after: int | None = None):
        self.crash_after = crash_after

    def save_checkpoint(self, path, weights_only=False):
        (Path(path) / "checkpoint").mkdir(parents=True)
        for i in range(3):
            if self.crash_after == i:
                raise KeyboardInterrupt("killed while writing")
            (Path(path) / "checkpoint" / f"shard{i}.pt").write_bytes(bytes(1000 + i))


def test_atomic_directory_save_marker_and_crash(tmp_path):
    final = tmp_path / "last.ckpt"
    save_checkpoint_atomic(_FakeTrainer(), final)
    require_complete(final)
    marker = json.loads((final / COMPLETE_MARKER).read_text())
    assert marker["files"] == {f"checkpoint/shard{i}.pt": 1000 + i for i in range(3)} and marker["global_step"] == 7
    # A crash during the next save leaves the previous checkpoint intact under the final name ...
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint_atomic(_FakeTrainer(crash_after=1), final)
    require_complete(final)
    partials = list(tmp_path.glob(".partial-*"))
    assert len(partials) == 1 and not (partials[0] / COMPLETE_MARKER).exists()
    with pytest.raises(GraspConfigError, match="save did not finish"):
        require_complete(partials[0])
    assert remove_partials(tmp_path) == partials and not list(tmp_path.glob(".partial-*"))
    # ... and a crash on the first save leaves nothing at all under it.
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint_atomic(_FakeTrainer(crash_after=2), tmp_path / "epoch=0-step=9.ckpt")
    assert not (tmp_path / "epoch=0-step=9.ckpt").exists()


# ---------------------------------------------------------------------------- LoRA
def _rl_batch():
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=str(TINY)),
                         loader=LoaderConfig(data_mode="rl", batch_size=2, num_workers=0))
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.mark.parametrize("separate_reference", [False, True])
def test_lora_reference_kl_is_exactly_zero_at_step_0(separate_reference):
    """LoRA's reference is the policy with adapters disabled (no second copy), or a configured separate
    model; either way the KL of the first step is exactly 0, and it is not once the adapters moved."""
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import LoraConfig, PolicyConfig, ReferenceConfig
    from grasp_lightning.tasks.grpo import GRPOTask, LossConfig

    torch.manual_seed(0)
    module = GraspModule(GRPOTask(loss=LossConfig(beta=0.05)), policy=PolicyConfig(name_or_path=str(TINY), dtype="float32"),
                         reference=ReferenceConfig(name_or_path=str(TINY) if separate_reference else None),
                         lora=LoraConfig(enabled=True), rollout=RolloutConfig(num_generations=4, max_new_tokens=16))
    module.configure_model()
    assert module.uses_adapter_reference is not separate_reference
    assert (module.reference_model is not None) is separate_reference
    batch = _rl_batch()
    module.task.prepare(module, batch)
    out = module.task.training_step(module, batch)
    assert out.rollout.kl_tokens.numel() > 0
    assert torch.equal(out.rollout.kl_tokens, torch.zeros_like(out.rollout.kl_tokens))
    assert float(out.metrics["kl"]) == 0.0
    with torch.no_grad():
        for name, p in module.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    module.task.prepare(module, batch)  # sampled again, with the perturbed adapters
    assert float(module.task.training_step(module, batch).metrics["kl"]) > 0.0


def test_export_lora_checkpoint_merged_and_as_adapter(tmp_path):
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.commands.export import export_checkpoint
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import LoraConfig, PolicyConfig
    from grasp_lightning.tasks.sft import SFTTask

    policy, lora = PolicyConfig(name_or_path=str(TINY), dtype="float32"), LoraConfig(enabled=True)
    module = GraspModule(SFTTask(), policy=policy, lora=lora)
    module.configure_model()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in module.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    ckpt = tmp_path / "run.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 5, "epoch": 0}, ckpt)
    ids = torch.arange(3, 35).reshape(2, 16)
    module.policy.eval()
    with torch.no_grad():
        expected = module.policy(input_ids=ids).logits
        base = AutoModelForImageTextToText.from_pretrained(TINY)(input_ids=ids).logits
    assert (expected - base).abs().max() > 1e-2  # the adapters matter
    merged = export_checkpoint(ckpt, tmp_path / "merged", policy, lora)
    adapter = export_checkpoint(ckpt, tmp_path / "adapter", policy, lora, merge_lora=False)
    assert not (merged / "adapter_config.json").exists() and (merged / "model.safetensors").exists()
    assert (adapter / "adapter_config.json").exists() and not (adapter / "model.safetensors").exists()
    for out in (merged, adapter):
        with torch.no_grad():
            logits = AutoModelForImageTextToText.from_pretrained(out)(input_ids=ids).logits
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(GraspConfigError, match="exists"):
        export_checkpoint(ckpt, merged, policy, lora)
    with pytest.raises(GraspConfigError, match="does not match"):
        export_checkpoint(ckpt, tmp_path / "wrong", policy, LoraConfig(enabled=False))


def test_sgr_lora_demo_composes_and_runs_on_cpu(in_repo, tmp_path):
    """``--config configs/sgr.yaml --config configs/lora.yaml --config configs/demo.yaml``: lora.yaml's
    GPU settings (bf16, accumulate 32, gradient checkpointing) are reset by demo.yaml, the LoRA flag
    stays, the reference is the adapter-disabled policy and the KL starts at exactly 0."""
    cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/lora.yaml", "--config",
                   "configs/demo.yaml", "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--data.loader.num_workers=0",
                   "--trainer.enable_progress_bar=false", "--model.rollout.num_generations=4"], tmp_path)
    trainer, module = cli.trainer, cli.model
    assert trainer.precision == "32-true" and trainer.accumulate_grad_batches == 1 and trainer.num_devices == 1
    assert module.lora_cfg.enabled and module.uses_adapter_reference and module.reference_model is None
    assert not module.policy_cfg.gradient_checkpointing
    assert trainer.global_step == 2
    kl = scalars(trainer.log_dir)["train/kl"]
    assert kl[0] == (0, 0.0)


def test_adapter_export_of_a_relative_base_loads_from_any_directory(tmp_path, monkeypatch):
    """``--merge_lora false`` of a run whose base is a relative local path (``configs/demo.yaml``'s
    tiny model) writes the base's absolute path into ``adapter_config.json``, so the adapter loads
    from another working directory."""
    import json

    from transformers import AutoModelForImageTextToText

    from grasp_lightning.commands.export import export_checkpoint
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import LoraConfig, PolicyConfig
    from grasp_lightning.tasks.sft import SFTTask

    monkeypatch.chdir(TINY.parents[2])
    relative = str(TINY.relative_to(TINY.parents[2]))
    policy, lora = PolicyConfig(name_or_path=relative, dtype="float32"), LoraConfig(enabled=True)
    module = GraspModule(SFTTask(), policy=policy, lora=lora)
    module.configure_model()
    ckpt = tmp_path / "run.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 1, "epoch": 0}, ckpt)
    adapter = export_checkpoint(ckpt, tmp_path / "adapter", policy, lora, merge_lora=False)
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(TINY.resolve())
    monkeypatch.chdir(tmp_path)
    assert AutoModelForImageTextToText.from_pretrained(adapter) is not None


# ---------------------------------------------------------------------------- LoRA under ZeRO-2
LORA_STEPS = 4


@pytest.fixture(scope="module")
def lora_zero2(tmp_path_factory):
    """A LoRA SFT run under ZeRO-2 (2 ranks x batch 1 x accumulate 2, 4 steps, checkpoints at 2 and 4; LoRA
    dropout 0 so the recorder's final logits are the trained function), its resume from step 2, and the
    merged export of its step-4 checkpoint."""
    from grasp_lightning.commands.export import main as export_main

    root = tmp_path_factory.mktemp("lora-zero2")
    a, c = root / "a", root / "c"
    data, model = {"loader": {"batch_size": 1, "num_workers": 0}}, {"lora": {"enabled": True, "dropout": 0.0}}
    for run, resume in ((a, []), (c, ["--ckpt_path", str(a / "ckpt" / f"epoch=0-step={RESUME_AT}.ckpt")])):
        run.mkdir()
        trainer = {**_sft_trainer(run, 2, 2, True, True), "max_steps": LORA_STEPS}
        wait_ranks(launch_ranks(["fit", *SFT, *_config(run / "c.yaml", trainer, data, model), *resume], run / "run"),
                   run / "run", RUN_TIMEOUT)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        export_main([*SFT, *_config(a / "c.yaml", {}, data, model), "--ckpt_path", str(_ckpt(a, LORA_STEPS)),
                     "--out", str(a / "export")])
    yield {"a": a, "c": c}
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_zero2_lora_checkpoint_leaves_the_frozen_base_out(lora_zero2):
    """DeepSpeed writes the module's weights itself; with LoRA the strategy's ``exclude_frozen_parameters``
    is on, so its model-states file holds the adapters only (no frozen weights, nor ZeRO-2's
    ``frozen_param_fragments``, a second copy of them), and its optimizer shards the adapters' float32
    partitions and AdamW state."""
    from grasp_lightning.policy import LoraConfig, PolicyConfig, load_policy

    policy = load_policy(PolicyConfig(name_or_path=str(TINY), dtype="float32"), LoraConfig(enabled=True))
    trainable = {f"policy.{n}": p.numel() for n, p in policy.named_parameters() if p.requires_grad}
    ckpt = _ckpt(lora_zero2["a"], RESUME_AT) / "checkpoint"
    states = torch.load(ckpt / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    assert set(states["module"]) == set(trainable) and states["frozen_param_fragments"] is None
    numel = sum(states["param_shapes"][0][name].numel() for name in states["param_shapes"][0])
    assert set(states["param_shapes"][0]) == set(trainable) and numel == sum(trainable.values())
    for rank in (0, 1):
        shard = torch.load(ckpt / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", map_location="cpu",
                           weights_only=False)["optimizer_state_dict"]
        (flat,) = shard["single_partition_of_fp32_groups"]
        assert flat.numel() * 2 >= numel and flat.numel() * 2 - numel < 2 * 2 ** 10  # half each, up to padding
    frozen = sum(p.numel() for p in policy.parameters() if not p.requires_grad)
    # float32 bytes: the adapters once in the model states (plus the run's state: RNG streams, loops, settings),
    # their partitions and AdamW moments in the shards; the frozen base alone would be 4 x 206,304 B.
    assert (ckpt / "mp_rank_00_model_states.pt").stat().st_size < 4 * numel + 100_000 < 4 * frozen
    for rank in (0, 1):
        assert (ckpt / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").stat().st_size < 3 * 4 * numel / 2 + 20_000


@pytest.mark.slow
def test_zero2_lora_resume_continues_exactly(lora_zero2):
    """Resumed from the adapters-only directory (the base reloaded from ``model.policy.name_or_path``), every
    later micro-batch matches the uninterrupted run on both ranks."""
    for rank in (0, 1):
        full = read_steps(lora_zero2["a"] / "rec", rank)
        assert len(full) == 2 * LORA_STEPS
        assert read_steps(lora_zero2["c"] / "rec", rank) == full[2 * RESUME_AT:], f"rank {rank}"
    torch.testing.assert_close(torch.load(lora_zero2["c"] / "rec" / "final_logits.pt"),
                               torch.load(lora_zero2["a"] / "rec" / "final_logits.pt"), rtol=0, atol=0)


@pytest.mark.slow
def test_zero2_lora_export_reproduces_the_trained_logits(lora_zero2):
    from transformers import AutoModelForImageTextToText

    saved = torch.load(lora_zero2["a"] / "rec" / "final_logits.pt")
    model = AutoModelForImageTextToText.from_pretrained(lora_zero2["a"] / "export").eval()
    assert not any("lora_" in name for name, _ in model.named_parameters())  # merged
    with torch.no_grad():
        logits = model(input_ids=saved["input_ids"], attention_mask=torch.ones_like(saved["input_ids"])).logits
    torch.testing.assert_close(logits, saved["logits"], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        base = AutoModelForImageTextToText.from_pretrained(TINY)(input_ids=saved["input_ids"]).logits
    assert (base - logits).abs().max() > 1e-3  # the export holds the trained adapters
