"""LoRA checkpoints hold the trainable state only: the adapters and their AdamW state, not the frozen base.

``configs/sft.yaml`` + ``configs/lora.yaml`` + ``configs/demo.yaml`` on the tiny model: a run checkpoints at
steps 2 and 4; the checkpoint's ``state_dict`` is the adapters, its optimizer state theirs, and its size
those tensors plus a few tens of KB of run state. A run resumed from step 2 (the base reloaded from
``model.policy.name_or_path``) takes the same steps as the uninterrupted one, bit for bit (LoRA dropout
included: its random stream is restored). ``export`` of the step-4 checkpoint, adapters merged and
alone, reproduces the trained policy's logits. On the 2B-width stand-in (one text and one vision layer,
the published widths and vocabulary) the checkpoint is below 5 % of one that keeps the whole model.

The ZeRO-2 path (DeepSpeed writes the module's weights itself) is in ``tests/cli/test_scale.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from grasp_lightning.checkpointing import check_trainable_state
from grasp_lightning.errors import GraspConfigError
from tests.helpers import REPO, read_steps, run_cli, run_state_tensors

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

LORA_SFT = ["fit", "--config", "configs/sft.yaml", "--config", "configs/lora.yaml", "--config", "configs/demo.yaml",
            "--data.source.bench=null", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.max_steps=4"]
IDS = torch.arange(3, 35).reshape(2, 16)


def _every_two_steps(run: Path) -> list[str]:
    """A checkpoint every 2 optimizer steps, kept, and the step recorder of ``tests.deepspeed_cpu``."""
    return ["--trainer.callbacks+=grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint",
            f"--trainer.callbacks.init_args.dirpath={run / 'ckpt'}", "--trainer.callbacks.init_args.every_n_train_steps=2",
            "--trainer.callbacks.init_args.save_top_k=-1",
            "--trainer.callbacks+=tests.helpers.StepRecorder", f"--trainer.callbacks.init_args.out_dir={run / 'rec'}",
            f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}"]


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor in a nested checkpoint structure (each storage counted once)."""
    seen: dict[int, int] = {}

    def walk(x) -> None:
        if torch.is_tensor(x):
            seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return sum(seen.values())


def whole_model_size(ckpt: Path, module: torch.nn.Module, out: Path) -> int:
    """Bytes of ``ckpt`` as it was written before checkpoints were trimmed: the same dict with the module's
    whole ``state_dict`` (what Lightning hands to ``on_save_checkpoint``)."""
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    torch.save({**checkpoint, "state_dict": module.state_dict()}, out)
    size = out.stat().st_size
    out.unlink()
    return size


def check_trainable_only(ckpt: Path, module, whole: int) -> dict:
    """Assert that ``ckpt`` holds the trainable parameters of ``module`` and their AdamW state, and little
    else; return its sizes in bytes."""
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    trainable = {name: p for name, p in module.named_parameters() if p.requires_grad}
    assert set(checkpoint["state_dict"]) == set(trainable)  # the adapters, nothing of the frozen base
    assert all(".lora_" in name for name in trainable)
    (optimizer,) = checkpoint["optimizer_states"]
    state = [optimizer["state"][i] for i in sorted(optimizer["state"])]
    assert [s["exp_avg"].shape for s in state] == [p.shape for p in trainable.values()]  # AdamW over them only
    weights = _tensor_bytes(checkpoint["state_dict"])
    adam = _tensor_bytes(optimizer)
    assert weights == sum(p.numel() * p.element_size() for p in trainable.values())
    size = ckpt.stat().st_size
    assert weights + adam < size < weights + adam + 100_000  # plus the run's state: RNG streams, loops, settings
    return {"size": size, "whole": whole, "weights": weights, "adam": adam}


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """The uninterrupted LoRA run (A, steps 0-3, checkpoints at 2 and 4) and its resume from step 2 (C)."""
    root = tmp_path_factory.mktemp("lora")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        a = run_cli([*LORA_SFT, *_every_two_steps(root / "a")], root / "a")
        step2 = root / "a" / "ckpt" / "epoch=0-step=2.ckpt"
        c = run_cli([*LORA_SFT, *_every_two_steps(root / "c"), f"--ckpt_path={step2}"], root / "c")
    yield {"root": root, "a": a, "c": c, "step2": step2, "step4": root / "a" / "ckpt" / "epoch=0-step=4.ckpt"}
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_lora_checkpoint_holds_the_adapters_and_their_adam_state_only(lora_runs):
    a = lora_runs["a"]
    sizes = check_trainable_only(lora_runs["step2"], a.model, whole_model_size(lora_runs["step2"], a.model,
                                                                                lora_runs["root"] / "whole.ckpt"))
    # The tiny model in float32: about 0.47 MB against 1.33 MB with the frozen base (87 % of its weight bytes).
    assert sizes["size"] < 0.4 * sizes["whole"]


@pytest.mark.slow
def test_lora_resume_from_adapters_only_continues_exactly(lora_runs):
    """Same samples, losses, learning rates, gradient norms and random draws after the resume, and the
    same adapters at the end, bit for bit."""
    full, resumed = read_steps(lora_runs["root"] / "a" / "rec"), read_steps(lora_runs["root"] / "c" / "rec")
    assert len(full) == 4 and [row["global_step"] for row in full] == [1, 2, 3, 4]
    assert resumed == full[2:]
    after_a, after_c = dict(lora_runs["a"].model.policy.named_parameters()), dict(lora_runs["c"].model.policy.named_parameters())
    trained = [name for name, p in after_a.items() if p.requires_grad]
    assert trained and all(torch.equal(after_a[name], after_c[name]) for name in trained)
    base = torch.load(lora_runs["step2"], map_location="cpu", weights_only=True)["state_dict"]
    assert not torch.equal(base["policy." + trained[-1]], after_a[trained[-1]])  # the adapters moved after step 2


@pytest.mark.slow
@pytest.mark.parametrize("merge", [True, False])
def test_export_of_an_adapters_only_checkpoint_reproduces_the_trained_logits(lora_runs, merge, tmp_path):
    """``export`` loads the base from ``model.policy.name_or_path`` and the adapters from the checkpoint:
    merged (``merge_and_unload``) or as an adapter directory, both give the trained policy's logits."""
    from huggingface_hub import ModelCard
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.__main__ import main as dispatch

    policy = lora_runs["a"].model.policy.eval()
    with torch.no_grad():
        trained = policy(input_ids=IDS).logits
    out = tmp_path / "export"
    config = Path(lora_runs["a"].trainer.log_dir) / "config.yaml"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        assert dispatch(["export", "--config", str(config), "--ckpt_path", str(lora_runs["step4"]), "--out", str(out),
                         "--merge_lora", str(merge).lower()]) == 0
        model = AutoModelForImageTextToText.from_pretrained(out).eval()
    assert (out / "adapter_config.json").exists() is not merge
    card = ModelCard.load(out / "README.md")  # the model card: an adapter loads through peft, onto the base
    assert (card.data.library_name, "lora" in card.data.tags) == ("transformers" if merge else "peft", True)
    assert ("PeftModel.from_pretrained(base, path)" in card.text) is not merge
    assert "| `model.lora.r` | `16` |" in card.text
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, trained, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_checkpoint_of_another_lora_run_is_refused(lora_runs, tmp_path):
    """Loaded without strictness (the base is not in it), a checkpoint must still hold every adapter and
    no name the model lacks; resume and export refuse it otherwise."""
    from grasp_lightning.commands.export import export_checkpoint

    module = lora_runs["a"].model
    state = torch.load(lora_runs["step2"], map_location="cpu", weights_only=True)["state_dict"]
    check_trainable_state(state, module, "ckpt")
    with pytest.raises(GraspConfigError, match="ckpt: 1 trainable parameter.* 0 unknown"):
        check_trainable_state(dict(list(state.items())[1:]), module, "ckpt")
    with pytest.raises(GraspConfigError, match=r"0 trainable parameter\(s\) missing.*1 unknown.*policy.extra"):
        check_trainable_state({**state, "policy.extra": torch.zeros(1)}, module, "ckpt")
    with pytest.raises(GraspConfigError, match="the resumed checkpoint: 1 trainable"):
        module.load_state_dict(dict(list(state.items())[1:]))
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": dict(list(state.items())[1:]), "global_step": 2}, bad)
    with pytest.raises(GraspConfigError, match="export: .*bad.ckpt: 1 trainable parameter"):
        export_checkpoint(bad, tmp_path / "out", module.policy_cfg, module.lora_cfg)


# ---------------------------------------------------------------------------- GRPO: nothing derived from data
LORA_GRPO = ["fit", "--config", "configs/sgr.yaml", "--config", "configs/lora.yaml", "--config", "configs/demo.yaml",
             "--data.source.bench=null", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false", "--trainer.accumulate_grad_batches=4", "--trainer.max_steps=1",
             "--data.loader.batch_size=1", "--model.rollout.num_generations=4", "--model.rollout.max_new_tokens=16"]
#: What a checkpointed rollout holds: the sampled completions and their scores (no prompt, item or vision feature).
ROLLOUT_KEYS = {"shared", "indices", "texts", "opened", "ids", "mask", "truncated", "zero_variance", "prompt_tokens",
                "terms", "rewards", "advantages", "penalty", "old_logp", "ref_logp", "loss_mask", "sampled_logp"}


@pytest.mark.slow
def test_lora_grpo_checkpoint_holds_adapters_optimizer_state_and_counters_only(in_repo, tmp_path):
    """A LoRA GRPO-SGR run of the demo with accumulate 4 (K = 4, the frozen tower's features kept for the
    window): its checkpoint at the step boundary holds the adapters, their AdamW state, the RNG streams and
    counters, and no rollout (``num_iterations`` 1: nothing would reuse them). Before, it also held the
    window's four rollouts with their vision features: 609,615 bytes, of which 122,880 were vision features,
    against 469,659 now. With ``num_iterations`` 2 the checkpoint between the two uses keeps the rollouts,
    without the vision features or anything else of the prompts."""
    from grasp_lightning.module import TASK_STATE_KEY

    cli = run_cli(LORA_GRPO, tmp_path / "one")
    (ckpt,) = Path(cli.trainer.log_dir).rglob("last.ckpt")
    sizes = check_trainable_only(ckpt, cli.model, whole=0)
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert checkpoint[TASK_STATE_KEY] == [{}]
    rest = run_state_tensors(checkpoint)
    assert {path: (t.dtype, tuple(t.shape)) for path, t in rest.items() if t.dim()} == \
        {"grasp_rng_states[0]/torch": (torch.uint8, (5056,))}  # the CPU generator; the rest 0-d counters
    assert sizes["weights"] == 139_264 and sizes["size"] < sizes["weights"] + sizes["adam"] + 60_000, sizes

    cli = run_cli([*LORA_GRPO, "--model.task.init_args.loss.num_iterations=2"], tmp_path / "two")
    (ckpt,) = Path(cli.trainer.log_dir).rglob("last.ckpt")
    (state,) = torch.load(ckpt, map_location="cpu", weights_only=True)[TASK_STATE_KEY]
    assert len(state["rollouts"]) == 4 and all(set(ro) == ROLLOUT_KEYS for ro in state["rollouts"])
    assert [len(ro["indices"]) for ro in state["rollouts"]] == [1, 1, 1, 1]
    assert all(ro["ids"].shape[0] == 4 and ro["ids"].shape[1] <= 16 for ro in state["rollouts"])


# ---------------------------------------------------------------------------- the 2B widths
@pytest.mark.slow
@pytest.mark.real_shapes
def test_lora_checkpoint_of_the_2b_width_standin_is_below_5_percent(tmp_path_factory, tmp_path):
    """The Qwen3-VL-2B stand-in with one text and one vision layer (the published widths and 151,936-token
    vocabulary, bf16 as published; 428 M parameters), one LoRA SFT step with ``configs/lora.yaml``'s
    rank 16: the checkpoint holds 2.5 MB of adapters and 5.0 MB of AdamW state (7.5 MB in all) against
    864 MB with the frozen base (0.9 %). At the published depth (28 + 24 layers) the ratio is larger, as
    the adapters grow with the layers and the embedding does not (the figures are in
    ``docs/lora-checkpoints.md``)."""
    from grasp_lightning.synthetic.standin import build_standin
    from tests.helpers import scratch, standin_args, write_dataset

    root = scratch(tmp_path_factory, "standin-1-layer", 2.5)  # stand-in 0.87 GB, a whole-model copy 0.87 GB
    try:
        model = build_standin(root / "Qwen3-VL-2B-Instruct", "Qwen3-VL-2B-Instruct", text_layers=1, vision_layers=1)
        data = write_dataset(root / "GRASP")
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(REPO)
            cli = run_cli(["fit", "--config", "configs/sft.yaml", "--config", "configs/lora.yaml", "--config",
                           "configs/demo.yaml", *standin_args(model, data, "bfloat16"), "--data.loader.batch_size=1",
                           "--trainer.max_steps=1", "--data.source.bench=null", "--trainer.enable_model_summary=false",
                           f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"],
                          tmp_path)
        (ckpt,) = Path(cli.trainer.log_dir).rglob("last.ckpt")
        sizes = check_trainable_only(ckpt, cli.model, whole_model_size(ckpt, cli.model, root / "whole.ckpt"))
        print(f"\n[2B-width stand-in, 1 + 1 layers] LoRA checkpoint {sizes['size']} B, with the frozen base "
              f"{sizes['whole']} B ({100 * sizes['size'] / sizes['whole']:.2f} %)")
        assert sizes["size"] < 0.05 * sizes["whole"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
