"""End-to-end runs of the CLI on the tiny models and the sample data (SFT, GRPO-SGR, LoRA, export, validate).

The paths that depend on the model run on both tiny families (``conftest.FAMILIES``): Qwen3-VL (full
attention only) and the hybrid Qwen3.5 (Gated DeltaNet linear-attention layers + a full-attention
layer). Each family's SFT run is made once (``sft_run``) and read by the SFT and export tests; the
LoRA GRPO run starts from that export, as a pipeline's next stage does. The resume test is about the
loader's sample order, not the model, and runs on Qwen3-VL only. Every test runs with one intra-op
thread (``conftest.one_intra_op_thread``): ten times faster on the tiny models on a busy 2-core machine.
"""

import json
import logging
import re
from pathlib import Path

import lightning as L
import pytest
import torch

from grasp_lightning.data.datamodule_config import LoaderConfig, SourceConfig, VideoConfig
from grasp_lightning.errors import GraspConfigError
from tests.helpers import (
    FAMILIES,
    FAST,
    GRAD_TOLS,
    REPO,
    TINY_MODELS,
    GradRecorder,
    MicroBatchLosses,
    ModelLoads,
    WeightRecorder,
    event_tags,
    find_callback,
    one_sgr_step_args,
    run_cli,
    scalars,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

# configs/demo.yaml's budgets fit a whole SFT-format completion (288 tokens); tests that need none use these
SHORT = ["--model.rollout.max_new_tokens=32", "--model.evaluation.max_new_tokens=24"]
SFT_STEPS = 24
FALLBACK = "GRPO share_prompt: falling back to repeated prompt rows"


def _log_dir(cli):
    return cli.trainer.log_dir


def _assert_grads_close(got: dict, expected: dict, family: str) -> None:
    """Every gradient within ``GRAD_TOLS[family]`` of its tensor's largest entry (test_rollout_sharing's bound)."""
    assert set(got) == set(expected) and expected
    for name, grad in expected.items():
        scale = float(grad.abs().max())
        assert scale > 0, f"{name}: zero gradient, nothing compared"
        assert float((got[name] - grad).abs().max()) <= GRAD_TOLS[family] * scale, name


# ------------------------------------------------------------------ SFT, on both families
@pytest.fixture(scope="module")
def sft_run(tiny_model_path, tmp_path_factory):
    """The SFT demo overfitting two samples for ``SFT_STEPS`` steps on one family (run once per family)."""
    tmp = tmp_path_factory.mktemp(f"sft-{tiny_model_path.name}")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        cli = run_cli(["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", *FAST,
                       f"--model.policy.name_or_path={tiny_model_path}", "--data.source.train_limit=2",
                       "--data.loader.batch_size=2", f"--trainer.max_steps={SFT_STEPS}", "--trainer.max_epochs=-1",
                       "--model.optim.lr=3e-3", "--model.optim.scheduler=constant_with_warmup", "--data.source.bench=null"],
                      tmp)
    return cli


@pytest.fixture(scope="module")
def sft_export(sft_run):
    """``python -m grasp_lightning export`` of the SFT run's last checkpoint, with the run's saved config."""
    from grasp_lightning.__main__ import main as dispatch

    log_dir = Path(_log_dir(sft_run))
    (ckpt,) = log_dir.rglob("last.ckpt")
    out = log_dir / "export"
    assert dispatch(["export", "--config", str(log_dir / "config.yaml"), "--ckpt_path", str(ckpt),
                     "--out", str(out)]) == 0
    return out


def test_sft_overfits_two_samples(sft_run):
    loss = [v for _, v in scalars(_log_dir(sft_run))["train/loss"]]
    assert len(loss) == SFT_STEPS
    first, last = loss[0], sum(loss[-3:]) / 3
    assert last < 0.5 * first, (first, last)


def test_sft_loss_covers_the_response_tokens_only(sft_run):
    """Labels are the target's tokens (response + end of turn) and -100 elsewhere; the task's loss
    (logits of the response positions only) is the cross-entropy over exactly those tokens."""
    from grasp_lightning.data.prompts import IGNORE_INDEX

    module, tok = sft_run.model, sft_run.model.tokenizer
    batch = next(iter(sft_run.datamodule.train_dataloader()))
    inputs = batch.inputs
    labels, ids = inputs["labels"], inputs["input_ids"]
    for row, item in enumerate(batch.items):
        learnt = (labels[row] != IGNORE_INDEX).nonzero().flatten()
        length = int(inputs["attention_mask"][row].sum())
        assert learnt.tolist() == list(range(int(batch.prompt_lengths[row]), length))  # the response, to the end
        assert torch.equal(labels[row, learnt], ids[row, learnt])
        assert tok.decode(ids[row, learnt]) == f"{item.response}<|im_end|>\n"
    module.policy.eval()
    with torch.no_grad():
        loss = module.task.training_step(module, batch).loss
        logits = module.policy(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False).logits
    shifted = labels[:, 1:]
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), shifted.flatten(),
                                                 ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert float(loss) < 0.5 * scalars(_log_dir(sft_run))["train/loss"][0][1]  # the trained policy


def test_sft_logs_each_step_once_as_the_mean_over_its_micro_batches(in_repo, tmp_path):
    """Accumulate 3: ``train/loss`` is the mean of the step's 3 micro-batch losses (what the optimizer step
    averages), ``train/tokens/loss`` the sum of their response tokens; one point per step."""
    cli = run_cli(["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", *FAST, "--data.source.bench=null",
                   "--data.loader.batch_size=1", "--trainer.accumulate_grad_batches=3", "--trainer.max_steps=2",
                   "--trainer.callbacks+=tests.helpers.MicroBatchLosses"], tmp_path)
    rows = find_callback(cli, MicroBatchLosses).rows
    series = scalars(_log_dir(cli))
    assert [s for s, _ in series["train/loss"]] == [0, 1] and [s for s, _ in series["train/tokens/loss"]] == [0, 1]
    for step in (0, 1):
        mine = [r for r in rows if r[0] == step]
        assert len(mine) == 3 and len({r[1] for r in mine}) == 3
        assert dict(series["train/loss"])[step] == pytest.approx(sum(r[1] for r in mine) / 3, rel=1e-6)
        assert dict(series["train/tokens/loss"])[step] == sum(r[2] for r in mine)


def test_sft_export_reloads_with_the_trained_policy_logits(sft_run, sft_export, tiny_model_path):
    from transformers import AutoConfig, AutoModelForImageTextToText

    info = json.loads((sft_export / "export_info.json").read_text())
    assert info["global_step"] == SFT_STEPS and not info["lora"]
    assert AutoConfig.from_pretrained(sft_export).model_type == AutoConfig.from_pretrained(tiny_model_path).model_type
    reloaded = AutoModelForImageTextToText.from_pretrained(sft_export, dtype=torch.float32).eval()
    batch = next(iter(sft_run.datamodule.train_dataloader()))
    inputs = {k: v for k, v in batch.inputs.items() if k != "labels"}
    policy = sft_run.model.policy.eval()
    with torch.no_grad():
        expected, got = (m(**inputs, use_cache=False).logits for m in (policy, reloaded))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


class _Seen:
    """Records the dataset indices of every training batch."""

    def __new__(cls):
        from lightning.pytorch.callbacks import Callback

        class Seen(Callback):
            def __init__(self):
                self.indices = []

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self.indices.append(list(batch.indices))

        return Seen()


def _sft_run(tmp_path, max_steps, ckpt=None, save=None):

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.tasks.sft import SFTTask

    seen = _Seen()
    module = GraspModule(SFTTask(), policy=PolicyConfig(name_or_path="grasp_lightning/assets/tiny-qwen3vl",
                                                        dtype="float32"))
    dm = GraspDataModule(source=SourceConfig(bench=None), video=VideoConfig(max_frames=8, max_pixels=4096),
                         loader=LoaderConfig(batch_size=2, num_workers=0, seed=0))
    callbacks = [seen]
    if save:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=save, save_last=True, every_n_train_steps=1))
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, max_steps=max_steps, logger=False, callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, dm, ckpt_path=ckpt)
    return seen.indices


def test_resume_continues_with_the_next_unseen_samples(in_repo, tmp_path):
    full = _sft_run(tmp_path, 16)  # 24 rows / batch 2 = 12 batches per epoch: the run crosses into epoch 2
    first = _sft_run(tmp_path, 7, save=tmp_path / "ck")
    rest = _sft_run(tmp_path, 16, ckpt=str(tmp_path / "ck" / "last.ckpt"))
    assert len(full) == 16
    assert first == full[:7]
    assert rest == full[7:]
    assert sorted(i for b in full[:12] for i in b) == list(range(24))  # one epoch: each row exactly once
    assert full[12:] != full[:4]  # epoch 2 is reshuffled


#: The sections of docs/metrics.md whose tags a demo run of each recipe logs, every one of them.
GLOSSARY_SECTIONS = {
    "sft": ["Every training run", "SFT"],  # sft_run: no validation (data.source.bench=null)
    "grpo": ["Every training run", "GRPO", "Validation (GRASP-Bench)", "Callbacks of the GRPO recipe"],
}


def glossary() -> dict[str, list[str]]:
    """The tags of docs/metrics.md by section (``### `` heading): the first cell of each table row."""
    out: dict[str, list[str]] = {}
    section = None
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
        elif section and (m := re.match(r"\| `([^`]+)` \|", line)):
            out.setdefault(section, []).append(m.group(1))
    return out


def assert_glossary_lists_exactly(logged: set[str], recipe: str) -> None:
    """Every tag ``logged`` is in the recipe's glossary sections and every tag there is logged (``<term>``,
    ``<code>`` stand for one path component)."""
    sections = glossary()
    patterns = [p for name in GLOSSARY_SECTIONS[recipe] for p in sections[name]]
    regex = {p: re.compile(re.sub(r"<[^>]+>", "[^/]+", re.escape(p)) + r"\Z") for p in patterns}
    unlisted = sorted(t for t in logged if not any(r.match(t) for r in regex.values()))
    unlogged = [p for p, r in regex.items() if not any(r.match(t) for t in logged)]
    assert not unlisted and not unlogged, f"not in docs/metrics.md: {unlisted}; listed, not logged: {unlogged}"


def test_glossary_lists_every_sft_tag(sft_run):
    assert_glossary_lists_exactly(set(event_tags(_log_dir(sft_run))["scalars"]), "sft")


def test_sgr_demo_logs_every_metric_kl_section_rollouts_and_validation(tiny_model_path, in_repo, tmp_path):
    cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *FAST, *SHORT,
                   "--trainer.max_steps=3", "--model.rollout.num_generations=4",
                   f"--model.policy.name_or_path={tiny_model_path}"], tmp_path)
    log_dir = _log_dir(cli)
    tags = event_tags(log_dir)
    assert_glossary_lists_exactly(set(tags["scalars"]), "grpo")
    assert "kl/per_token" in tags["histograms"]
    assert "rollouts/samples/text_summary" in tags["tensors"]
    assert "bench/category_accuracy" in tags["images"]
    series = scalars(log_dir)
    assert len(series["train/loss"]) == 3
    # Step 0 starts from the reference weights: the KL to the frozen copy is exactly zero.
    assert series["train/kl"][0][1] == 0.0
    rows = [json.loads(line) for line in open(f"{log_dir}/rollouts.jsonl")]
    assert len(rows) == 2 * 4 and {"rewards", "answer", "participants_named", "completion"} <= set(rows[0])


def test_step_timing_logs_every_phase_each_step(in_repo, tmp_path):
    """The SGR demo (sgr.yaml lists grasp_lightning.callbacks.timing.StepTiming) logs the time accounting every step."""
    cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
                   "--trainer.enable_progress_bar=false", "--trainer.max_steps=3", "--data.source.bench=null",
                   "--model.rollout.num_generations=4", "--model.rollout.max_new_tokens=32"], tmp_path)
    series = {k: [v for _, v in vals] for k, vals in scalars(cli.trainer.log_dir).items()}
    keys = ["time/data_wait_s", "time/step_s", "time/update_s", "time/model_s", "time/other_s",
            "time/overhead_fraction", "throughput/samples_per_s", "throughput/generated_tokens_per_s",
            "train/tokens/prompt_forwarded", "train/time/rollout_s", "train/time/scoring_s"]
    for key in keys:
        assert len(series[key]) == 3, key
    timing = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "StepTiming")
    for rec in timing.history:
        assert rec["time/data_wait_s"] >= 0 and rec["time/update_s"] > 0 and rec["time/model_s"] > 0
        inside = rec["time/rollout_s"] + rec["time/scoring_s"] + rec["time/update_s"]
        assert inside <= rec["time/step_s"] + 1e-6 and rec["time/model_s"] < rec["time/step_s"]
        assert 0.0 <= rec["time/overhead_fraction"] < 1.0
        assert rec["throughput/samples_per_s"] == pytest.approx(
            2 * 4 / (rec["time/step_s"] + rec["time/data_wait_s"]), rel=1e-6)
    assert "throughput/prompt_tokens_per_step" not in series  # one name per series: the task's
    assert series["train/rollout/shared_prompt"] == [1.0, 1.0, 1.0]


def _completions(cli) -> list[str]:
    return [json.loads(line)["completion"] for line in open(f"{_log_dir(cli)}/rollouts.jsonl")]


@pytest.mark.parametrize("family", FAMILIES)
def test_sgr_step_is_the_same_with_the_shared_prompt_and_with_repeated_rows(family, in_repo, tmp_path, caplog):
    """``share_prompt: true`` (sgr.yaml) really shares on both families (no fall-back warning) and its
    first step has the loss and gradients of ``share_prompt: false`` (K repeated rows, like TRL)."""
    args = [*one_sgr_step_args("sgr", "demo"), f"--model.policy.name_or_path={TINY_MODELS[family]}",
            "--trainer.callbacks+=tests.helpers.GradRecorder"]
    with caplog.at_level(logging.WARNING, logger="grasp_lightning.tasks.grpo"):
        shared = run_cli(args, tmp_path / "shared")
    assert not [r for r in caplog.records if FALLBACK in r.getMessage()]
    naive = run_cli([*args, "--model.task.init_args.compute.share_prompt=false"], tmp_path / "naive")
    s, n = scalars(_log_dir(shared)), scalars(_log_dir(naive))
    assert s["train/rollout/shared_prompt"] == [(0, 1.0)] and n["train/rollout/shared_prompt"] == [(0, 0.0)]
    assert _completions(shared) == _completions(naive) and len(set(_completions(shared))) == 2 * 4
    assert s["train/advantage/std"][0][1] > 0.5  # every group has distinct rewards (checksum_reward)
    assert s["train/tokens/prompt_forwarded"][0][1] < n["train/tokens/prompt_forwarded"][0][1] / 2
    assert s["train/loss"][0][1] == pytest.approx(n["train/loss"][0][1], rel=1e-5, abs=1e-6)
    _assert_grads_close(find_callback(shared, GradRecorder).grads, find_callback(naive, GradRecorder).grads, family)
    assert s["train/kl"][0][1] == 0.0


def test_lora_grpo_adapts_every_decoder_layer_and_trains_only_the_adapters(sft_export, in_repo, tmp_path):
    """SGR + configs/lora.yaml from the SFT export (the pipeline's next stage): the default targets put
    adapters on every decoder layer's attention (full: q/k/v/o; Gated DeltaNet: in_proj_qkv, in_proj_z,
    out_proj) and MLP; a step moves the adapters only; the reference is the policy with its adapters
    disabled, i.e. the export; ``export`` merges the adapters into weights that reload to the same logits."""
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.__main__ import main as dispatch
    from grasp_lightning.grpo.scoring import layer_types

    cli = run_cli([*one_sgr_step_args("sgr", "lora", "demo"), f"--model.policy.name_or_path={sft_export}",
                   "--trainer.callbacks+=tests.helpers.WeightRecorder"], tmp_path)
    module, policy, log_dir = cli.model, cli.model.policy, Path(_log_dir(cli))
    assert module.lora_cfg.enabled and module.uses_adapter_reference and module.reference_model is None
    kinds = layer_types(policy)
    projections = {"full_attention": ["self_attn." + p for p in ("q_proj", "k_proj", "v_proj", "o_proj")],
                   "linear_attention": ["linear_attn." + p for p in ("in_proj_qkv", "in_proj_z", "out_proj")]}
    expected = {(i, name) for i, kind in enumerate(kinds)
                for name in [*projections[kind], "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]}
    names = [n for n, _ in policy.named_parameters()]
    found = (re.search(r"language_model\.layers\.(\d+)\.(\w+\.\w+)\.lora_A\.", n) for n in names)
    adapted = {(int(m[1]), m[2]) for m in found if m}
    assert adapted == expected
    assert len([n for n in names if ".lora_A." in n]) == len(expected)  # nowhere else (the vision tower neither)
    assert all(".lora_" in n for n, p in policy.named_parameters() if p.requires_grad)
    before, after = find_callback(cli, WeightRecorder).before, dict(policy.named_parameters())
    changed = {n for n, w in before.items() if not torch.equal(w, after[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert {n for n in names if ".lora_B." in n} <= changed  # every adapter learnt (lora_A has no gradient yet)
    assert scalars(log_dir)["train/kl"] == [(0, 0.0)]
    ids = torch.arange(3, 35).reshape(2, 16)
    policy.eval()
    base = AutoModelForImageTextToText.from_pretrained(sft_export, dtype=torch.float32).eval()
    with torch.no_grad():
        trained = policy(input_ids=ids).logits
        with module.reference() as reference:
            ref = reference(input_ids=ids).logits
        torch.testing.assert_close(ref, base(input_ids=ids).logits, rtol=1e-6, atol=1e-6)
    assert float((trained - ref).abs().max()) > 1e-4  # the adapters matter
    (ckpt,) = log_dir.rglob("last.ckpt")
    export = ["export", "--config", str(log_dir / "config.yaml"), "--ckpt_path", str(ckpt), "--out"]
    out, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert dispatch([*export, str(out)]) == 0
    assert dispatch([*export, str(adapter), "--merge_lora", "false"]) == 0
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "model.safetensors").exists()
    merged = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32).eval()
    assert type(merged) is type(base) and not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        for reloaded in (merged, AutoModelForImageTextToText.from_pretrained(adapter, dtype=torch.float32).eval()):
            torch.testing.assert_close(reloaded(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)


def test_validate_of_a_checkpoint_files_its_reports_under_its_step(in_repo, tmp_path):
    """``validate --ckpt_path CKPT`` of a 2-step run: ``bench/step_2/`` and ``results.json`` meta naming the
    checkpoint and its step (``bench/step_0/``, step 0 and the base model alone before: reports of two
    checkpoints could not be told apart); validation during fit names no checkpoint."""
    demo = ["--config", "configs/sft.yaml", "--config", "configs/demo.yaml", *FAST, *SHORT,
            "--data.source.val_limit=2", "--trainer.limit_val_batches=1"]
    fit = run_cli(["fit", *demo, "--trainer.max_steps=2"], tmp_path / "fit")
    (ckpt,) = Path(fit.trainer.log_dir).rglob("last.ckpt")
    fitted = json.load(open(f"{fit.trainer.log_dir}/bench/step_2/results.json"))["meta"]
    assert fitted["step"] == 2 and fitted["checkpoint"] is None
    cli = run_cli(["validate", *demo, f"--ckpt_path={ckpt}"], tmp_path / "validate")
    bench = Path(cli.trainer.log_dir) / "bench"
    assert sorted(p.name for p in bench.iterdir()) == ["latest", "step_2"]
    meta = json.load(open(bench / "step_2" / "results.json"))["meta"]
    assert (meta["step"], meta["checkpoint"]) == (2, str(ckpt))
    assert meta["model"] == "grasp_lightning/assets/tiny-qwen3vl"


@pytest.mark.parametrize("command", ["validate", "predict"])
def test_evaluation_and_predict_load_one_model_and_fit_loads_the_reference(command, tiny_model_path, in_repo, tmp_path,
                                                                           monkeypatch):
    """``configs/sgr.yaml`` (KL beta 0.05, a full fine-tune: a frozen reference copy when it fits): ``validate``
    and ``predict`` load the policy alone; ``fit`` loads the policy and the reference from the same path."""
    loads = ModelLoads(monkeypatch)
    common = ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *FAST, *SHORT,
              f"--model.policy.name_or_path={tiny_model_path}", "--data.source.val_limit=2"]
    cli = run_cli([command, *common], tmp_path / command)
    assert loads.paths == [str(tiny_model_path)] and cli.model.reference_model is None
    assert cli.model.task.needs_reference and not cli.model.builds_reference
    with pytest.raises(GraspConfigError, match="validate, test and predict load none"), cli.model.reference():
        pass
    loads.paths.clear()
    cli = run_cli(["fit", *common, "--trainer.max_steps=1", "--trainer.limit_val_batches=0"], tmp_path / "fit")
    assert loads.paths == [str(tiny_model_path)] * 2 and cli.model.reference_model is not None


def test_validate_prints_the_table_and_writes_reports(tiny_model_path, in_repo, tmp_path, capsys):
    cli = run_cli(["validate", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *FAST, *SHORT,
                   f"--model.policy.name_or_path={tiny_model_path}"], tmp_path)
    out = capsys.readouterr().out
    for cat in ("T1", "T6", "G1", "G6", "J1", "J4"):
        assert re.search(rf"^\| {cat} \|", out, re.M), cat
    bench = f"{cli.trainer.log_dir}/bench/latest"
    results = json.load(open(f"{bench}/results.json"))
    assert results["metrics"]["n/overall"] == 32 and len(results["items"]) == 32
    assert open(f"{bench}/table.md").read().count("\n") > 20
    assert "bench/category_accuracy" in event_tags(cli.trainer.log_dir)["images"]
