"""The real-shape tier: the commands a user runs, on stand-ins of real Qwen3-VL checkpoints.

A stand-in (:mod:`grasp_lightning.synthetic.standin`) has the real 2B widths, the real Qwen3 vocabulary
(151,669 tokens, 151,936 logits), the published generation config (``eos [151645, 151643]``,
``pad 151643``), the published processor settings and our Instruct/Thinking templates; random weights,
2 text + 2 vision layers (516 M parameters), written in bf16 as published. It is built once per module
and loaded by every run through ``from_pretrained``, like a download.

The runs compute in float32 (``--model.policy.dtype=float32 --trainer.precision=32-true``): on a CPU
without bf16 units (AVX2) PyTorch's bf16 matrix product behind a linear layer's input gradient is about
100 times slower than float32 (measured: 53 s against 0.49 s for (180 x 8192) @ (8192 x 2048)), which
would make one training step of the 2B-width model take minutes. Prompts are kept short (no system
prompt, 4 frames of at most 8,192 pixels), so a step is a few seconds.

Why GRPO gets non-zero advantages honestly: a random model never writes ``<answer>A</answer>``, so the
stand-in is first SFT-trained (LoRA, ``configs/lora.yaml``) on rows that share one prompt per clip and
answer it with ``A`` and with ``B`` (every step sees all four rows; the learning rate decays to 0 on a
cosine): it learns the format exactly and the letter as a coin flip (not an exact one), so every GRPO
group of K = 8, sampled with the recipe's settings (``configs/sgr.yaml``: temperature 1.0, top-p 1.0),
holds correct and wrong answers. Seeds are fixed (``seed_everything``), so the runs are deterministic.
The SGR run starts from the ``export`` of that SFT run.

**Qwen3.5-9B**: ``tests/real_shapes/test_qwen3_5.py`` runs the same prompt, label and check-data
checks and one SGR step on a 9B-width stand-in. It is a module of its own so that its 5.9 GB stand-in
and this module's checkpoints are never on disk together (every module-scoped directory is removed
when its module ends; ``setup.cfg`` removes a passed test's ``tmp_path``).

Run alone: ``python -m pytest -q -m real_shapes`` (Qwen3.5 only: ``tests/real_shapes/test_qwen3_5.py``).
"""

from __future__ import annotations

import gc
import json
import math
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import (
    TIMES,
    check_data_counts_prompt_tokens,
    check_rendered_prompt_and_labels,
    first_batch,
    labelled_part,
    run_cli,
    scalars,
    scratch,
    standin_args,
    write_dataset,
)

pytestmark = [pytest.mark.real_shapes, pytest.mark.slow]

VOCAB_LOGITS = 151_936
SFT_STEPS = 14  # LoRA steps at lr 2e-3 until the format is reproduced (batch 2: loss 0.04-0.06 from step 14 on)
K = 8


def _timed(name: str, args: list[str], tmp_path: Path):
    """Run the CLI; record its wall time and, for ``fit``, the seconds between logged steps."""
    start = time.perf_counter()
    cli = run_cli(args, tmp_path)
    TIMES[name] = time.perf_counter() - start
    if args[0] == "fit":
        walls = _loss_wall_times(cli.trainer.log_dir)
        if len(walls) > 1:
            n = len(walls) - 1
            TIMES[f"{name}: s per step after the first ({n})"] = (walls[-1] - walls[0]) / n
    return cli


def _loss_wall_times(log_dir: str) -> list[float]:
    """Wall-clock times (s) at which each ``train/loss`` value was written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.wall_time for e in acc.Scalars("train/loss")] if "train/loss" in acc.Tags()["scalars"] else []


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The Qwen3-VL-2B-Instruct stand-in (0.97 GiB on disk), removed when the module ends."""
    from grasp_lightning.synthetic.standin import build_standin

    start = time.perf_counter()
    root = scratch(tmp_path_factory, "standin", 1.5)
    out = build_standin(root / "Qwen3-VL-2B-Instruct", "Qwen3-VL-2B-Instruct")
    TIMES["build 2B-Instruct stand-in"] = time.perf_counter() - start
    yield out
    shutil.rmtree(root, ignore_errors=True)


#: Per family: what its generation prompt opens after ``<|im_start|>assistant\n``, and the labelled text its
#: template makes of an SFT response (``<think>...</think><answer>X</answer>``).
FAMILIES = {
    "qwen3_vl": ("", lambda response: response + "<|im_end|>\n"),
    "qwen3_5": ("<think>\n",
                lambda response: response.split("</think>")[0].split("<think>")[-1].strip() + "\n</think>\n\n"
                + response.split("</think>")[-1].lstrip("\n") + "<|im_end|>\n"),
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("grasp") / "GRASP")  # a few KB; clips are links


@pytest.fixture(scope="module")
def sft_export(standin, data_root, tmp_path_factory):
    """SFT (LoRA) on the stand-in until it writes the target format, then ``export`` (adapters merged)."""
    from grasp_lightning.commands.export import main as export_main

    tmp = scratch(tmp_path_factory, "sft", 2.5)  # checkpoint the adapters (a few MB), export 1.9 GiB
    cli = _timed(f"SFT LoRA fit, {SFT_STEPS} steps", [
        "fit", "--config", "configs/sft.yaml", "--config", "configs/lora.yaml", "--config", "configs/demo.yaml",
        *standin_args(standin, data_root), "--data.loader.batch_size=4", f"--trainer.max_steps={SFT_STEPS}",  # A and B each step
        "--model.lora.dropout=0.0", "--model.optim.lr=2e-3", "--model.optim.scheduler=cosine",  # decays to 0
        "--model.optim.warmup_steps=0", "--data.source.bench=null"], tmp)
    policy = cli.model.policy
    info = {"log_dir": Path(cli.trainer.log_dir), "losses": [v for _, v in scalars(cli.trainer.log_dir)["train/loss"]],
            "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
            "lora_names": sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in policy.named_parameters()
                                  if p.requires_grad})}
    ckpt = info["log_dir"] / "checkpoints" / "last.ckpt"
    del cli, policy  # the SFT model goes before the export loads its own copy
    gc.collect()
    out = tmp / "export"
    start = time.perf_counter()
    export_main(["--config", str(info["log_dir"] / "config.yaml"), "--ckpt_path", str(ckpt), "--out", str(out)])
    TIMES["export (LoRA merged)"] = time.perf_counter() - start
    ckpt.unlink()  # only the export is used from here on
    info["export"] = out
    gc.collect()
    yield info
    shutil.rmtree(tmp, ignore_errors=True)


def test_rendered_prompt_is_the_published_one_and_labels_start_right_after_it(standin):
    check_rendered_prompt_and_labels("qwen3_vl", standin)


@pytest.mark.parametrize("seconds", [10, 60, 300])
def test_memory_planner_token_counts_agree_with_the_processor(standin, seconds):
    """``grasp_lightning.planning.tokens.video_tokens`` against the stand-in's processor for the recipe's video
    settings (2 fps, at most 512 frames of 448 x 448) on 30 fps source clips: within 2 %."""
    import numpy as np

    from grasp_lightning.data.video import sample_indices
    from grasp_lightning.planning import tokens
    from grasp_lightning.policy import load_processor

    processor = load_processor(str(standin))
    source_fps, total = 30.0, round(seconds * 30.0)
    indices = [int(i) for i in sample_indices(total, source_fps, fps=2.0, max_frames=512)]
    frames = np.zeros((len(indices), 448, 448, 3), dtype=np.uint8)
    metadata = {"total_num_frames": total, "fps": source_fps, "frames_indices": indices, "duration": total / source_fps,
                "width": 448, "height": 448, "video_backend": "decord"}
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Q"}]}],
                                         add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                    cap_pixels_per_frame=True, return_tensors="pt")
    added = enc["input_ids"].shape[1] - len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    visual = int((enc["input_ids"] == 151656).sum())
    planned = tokens.video_tokens(seconds, 2.0, 512, 448 * 448, frame_size=(448, 448), source_fps=source_fps,
                                  settings=tokens.processor_video_settings(str(standin)))
    print(f"planner vs processor, {seconds} s: visual {planned.visual_tokens} / {visual}, "
          f"clip total {planned.total} / {added}")
    assert abs(planned.visual_tokens - visual) <= 0.02 * visual, (planned, visual)
    assert abs(planned.total - added) <= 0.02 * added, (planned, added)


def test_sft_full_fine_tune_two_steps_sees_the_real_vocabulary(standin, data_root, tmp_path):
    """``fit`` of ``configs/sft.yaml`` on the stand-in (every weight trained): a random model's first loss
    is the log of its 151,936 logits, and a second step on the same batch lowers it."""
    cli = _timed("SFT full fit, 2 steps", [
        "fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", *standin_args(standin, data_root),
        "--data.source.train_limit=2", "--data.loader.batch_size=2", "--trainer.max_steps=2", "--model.optim.lr=1e-4",
        "--model.optim.warmup_steps=0", "--data.source.bench=null"], tmp_path)
    loss = [v for _, v in scalars(cli.trainer.log_dir)["train/loss"]]
    trainable = sum(p.numel() for p in cli.model.policy.parameters() if p.requires_grad)
    steps = cli.trainer.global_step
    del cli
    gc.collect()
    assert len(loss) == 2 and steps == 2
    assert abs(loss[0] - math.log(VOCAB_LOGITS)) < 0.5, loss
    assert loss[1] < loss[0], loss
    assert trainable == 411_838_976  # the language model and its tied embedding; the vision tower (104.7 M) frozen


def test_sft_lora_reproduces_its_target_and_exports(sft_export):
    """The LoRA SFT run behind the SGR test: adapters on every attention and MLP projection of the two
    language-model layers (r 16: 16 x (in + out) each), loss from ln(151,936) down to the entropy of the
    coin-flip letter, and an export that loads like a checkpoint."""
    from transformers import AutoModelForImageTextToText

    losses = sft_export["losses"]
    assert len(losses) == SFT_STEPS
    assert abs(losses[0] - math.log(VOCAB_LOGITS)) < 0.5, losses
    assert min(losses[-3:]) < 0.1, losses  # ~20 target tokens; the letter alone costs ln 2 / 20 = 0.035
    per_layer = 16 * ((2048 + 2048) * 2 + (2048 + 1024) * 2 + (2048 + 6144) * 3)  # q, o; k, v; gate, up, down
    assert sft_export["trainable"] == 2 * per_layer == 1_245_184
    assert sft_export["lora_names"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    export = sft_export["export"]
    assert json.loads((export / "export_info.json").read_text())["global_step"] == SFT_STEPS
    model = AutoModelForImageTextToText.from_pretrained(str(export))
    assert model.config.text_config.vocab_size == VOCAB_LOGITS and model.generation_config.eos_token_id == [151645, 151643]
    assert not any("lora" in n for n, _ in model.named_parameters())
    del model
    gc.collect()


class _Recorder:
    """Wraps ``grasp_lightning.engines.hf.sample_completions`` (the HF engine's) to keep every call's :class:`Completions`, budget and stop strings."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        self.calls.append((out, kwargs.get("max_new_tokens"), tuple(kwargs.get("stop_strings") or ())))
        return out


def test_sgr_from_the_export_has_correct_answers_in_every_group(sft_export, data_root, tmp_path, monkeypatch):
    """GRPO-SGR ``fit`` 2 steps (LoRA, K = 8, the recipe's sampling: temperature 1.0, top-p 1.0) from the
    SFT export: every group holds a correct, well-formed answer and a wrong one, so the reward std and the
    advantages are non-zero; each completion's mask covers exactly the sampled tokens (it ends at the
    token that completes ``</answer>`` or at the first sampled end id, never on the ``<|endoftext|>``
    padding that is also an end id)."""
    import grasp_lightning.engines.hf
    import grasp_lightning.tasks.grpo

    recorder = _Recorder(grasp_lightning.engines.hf.sample_completions)
    monkeypatch.setattr(grasp_lightning.engines.hf, "sample_completions", recorder)
    rollouts = []  # (reward names, Rollout) of every group sampled by the task
    real_rollout = grasp_lightning.tasks.grpo.GRPOTask.rollout

    def rollout(self, module, batch):
        ro = real_rollout(self, module, batch)
        rollouts.append((list(self.reward.terms), ro))
        return ro

    monkeypatch.setattr(grasp_lightning.tasks.grpo.GRPOTask, "rollout", rollout)
    budget = 24
    cli = _timed("SGR LoRA fit from the export, 2 steps (K=8)", [
        "fit", "--config", "configs/sgr.yaml", "--config", "configs/lora.yaml", "--config", "configs/demo.yaml",
        *standin_args(sft_export["export"], data_root), "--data.loader.batch_size=1", "--trainer.max_steps=2",
        f"--model.rollout.num_generations={K}", f"--model.rollout.max_new_tokens={budget}",
        "--model.optim.lr=1e-4", "--model.optim.warmup_steps=0", "--data.source.bench=null"], tmp_path)
    rollout_cfg = cli.model.rollout_cfg
    assert (rollout_cfg.temperature, rollout_cfg.top_p, rollout_cfg.top_k) == (1.0, 1.0, None)  # configs/sgr.yaml
    log_dir = Path(cli.trainer.log_dir)
    tokenizer = cli.model.tokenizer
    del cli
    gc.collect()
    series = scalars(log_dir)
    assert len(series["train/loss"]) == 2
    assert len(series["train/reward/std"]) == 2 and all(v > 0 for _, v in series["train/reward/std"])
    assert [v for _, v in series["train/zero_variance_groups/fraction"]] == [0.0, 0.0]
    assert len(series["train/advantage/std"]) == 2 and all(v > 0 for _, v in series["train/advantage/std"])
    assert series["train/kl"][0][1] == 0.0  # LoRA: the reference is the export itself (adapters off)

    # every group (one prompt per step, both steps): >= 1 correct and well-formed, >= 1 wrong, and the
    # correct answers' advantages above the wrong ones'
    assert len(rollouts) == 2
    for names, ro in rollouts:
        assert ro.num_groups == 1 and ro.terms.shape == (K, 4) and not bool(ro.zero_variance.any())
        acc, fmt = ro.terms[:, names.index("accuracy")], ro.terms[:, names.index("format")]
        good = (acc == 1.0) & (fmt == 1.0)
        wrong = acc == 0.0
        assert int(good.sum()) >= 1 and int(wrong.sum()) >= 1, ro.completions.texts
        assert float(ro.rewards.std()) > 0 and bool((ro.advantages != 0).any()), ro.advantages
        assert float(ro.advantages[good].min()) > 0 > float(ro.advantages[wrong].max()), ro.advantages
        assert all("<answer>A</answer>" in t for t, g in zip(ro.completions.texts, good.tolist()) if g)
    rows = [json.loads(line) for line in open(log_dir / "rollouts.jsonl")]  # RolloutSamples: the first step
    assert len(rows) == K and {r["target"] for r in rows} == {"A"}
    assert [r["completion"] for r in rows] == rollouts[0][1].completions.texts
    assert [r["advantage"] for r in rows] == pytest.approx(rollouts[0][1].advantages.tolist())

    # each completion's mask = the tokens that were sampled
    eos = {151645, 151643}
    assert len(recorder.calls) == 2
    for (completions, max_new, stops), (_, ro) in zip(recorder.calls, rollouts):
        assert completions is ro.completions and max_new == budget and stops == ("</answer>",)
        assert completions.ids.shape[0] == K
        for ids, mask in zip(completions.ids.tolist(), completions.mask.tolist()):
            n = sum(mask)
            assert n >= 1 and mask == [True] * n + [False] * (len(mask) - n)
            before, upto = tokenizer.decode(ids[: n - 1]), tokenizer.decode(ids[:n])
            assert "</answer>" not in before and not eos & set(ids[: n - 1]), (ids, n)  # nothing counted after an end
            by_stop = "</answer>" in upto  # the last counted token completes the stop string
            assert by_stop or ids[n - 1] in eos or n == budget, (ids, n)
            if by_stop:
                assert ids[n - 1] not in eos, ("a pad counted after the stop string", ids, n)
    lengths = [float(c.mask.sum(1).float().mean()) for c, _, _ in recorder.calls]
    assert [v for _, v in series["train/completion_length/mean"]] == pytest.approx(lengths)
    assert any(sum(m) < budget for c, _, _ in recorder.calls for m in c.mask.tolist())  # some rows stopped early


def test_validate_the_export_scores_its_greedy_answers(sft_export, data_root, tmp_path):
    """``validate`` of the SFT export on 4 GRASP-Bench items (greedy, our protocol, the training
    instruction): every completion opens in the export's learnt format (a random model never writes it),
    at least two name a person, at least one answer parses, and the report's accuracy and unparseable
    rate are those of its items.

    The bench questions are not the two training prompts, so a 14-step LoRA on two prompts need not
    close every ``<answer>`` block there: the rate is checked, not required to be 0."""
    import re

    from grasp_lightning.parsing import extract_answer

    cli = _timed("validate the export, 4 bench items", [
        "validate", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml",
        *standin_args(sft_export["export"], data_root), "--data.source.val_limit=4", "--model.evaluation.max_new_tokens=24",
        "--data.prompt.instruction=Give the letter in <answer> tags."],
        tmp_path)
    bench = Path(cli.trainer.log_dir) / "bench" / "latest"
    del cli
    gc.collect()
    results = json.loads((bench / "results.json").read_text())
    items, metrics = results["items"], results["metrics"]
    assert metrics["n/overall"] == 4 and len(items) == 4
    # the learnt opening on every item (a random model over 151,936 tokens never writes it); a named person on two or more
    assert all(it["completion"].startswith("<think><gaze>") for it in items), items
    assert sum(bool(re.match(r"<think><gaze>Person \d+", it["completion"])) for it in items) >= 2, items
    predicted = [extract_answer(it["completion"]) for it in items]
    assert [it["predicted"] for it in items] == predicted
    assert any(p is not None for p in predicted), items
    assert [it["correct"] for it in items] == [p == it["target"] for p, it in zip(predicted, items)]
    assert metrics["unparseable_rate"] == pytest.approx(sum(p is None for p in predicted) / 4)
    assert metrics["acc/overall"] == pytest.approx(sum(it["correct"] for it in items) / 4)


def test_check_data_counts_prompt_tokens_with_the_real_tokenizer(standin, data_root, tmp_path):
    check_data_counts_prompt_tokens("qwen3_vl", standin, data_root, tmp_path)


def test_thinking_standin_sft_and_validate(data_root, tmp_path):
    """A Qwen3-VL-2B-Thinking stand-in: the generation prompt opens ``<think>\\n``, SFT labels start
    right after it and hold the target in the published Thinking layout; ``fit`` and ``validate`` run."""
    from grasp_lightning.synthetic.standin import build_standin

    start = time.perf_counter()
    model = build_standin(tmp_path / "Qwen3-VL-2B-Thinking", "Qwen3-VL-2B-Thinking")
    TIMES["build 2B-Thinking stand-in"] = time.perf_counter() - start
    processor, batch = first_batch(data_root, model, system_prompt="")
    first, prompt, target = labelled_part(processor, batch, 0)
    assert prompt.endswith("Give the letter in <answer> tags.<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert first == int(batch.prompt_lengths[0])
    assert target == "<gaze>Person 1</gaze>\n</think>\n\n<answer>A</answer><|im_end|>\n"
    cli = _timed("Thinking SFT LoRA fit, 2 steps", [
        "fit", "--config", "configs/sft.yaml", "--config", "configs/lora.yaml", "--config", "configs/demo.yaml",
        *standin_args(model, data_root), "--data.loader.batch_size=2", "--trainer.max_steps=2", "--data.source.bench=null"],
        tmp_path / "fit")
    loss = [v for _, v in scalars(cli.trainer.log_dir)["train/loss"]]
    del cli
    gc.collect()
    assert len(loss) == 2 and abs(loss[0] - math.log(VOCAB_LOGITS)) < 0.5, loss
    cli = _timed("Thinking validate, 2 bench items", [
        "validate", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *standin_args(model, data_root),
        "--data.source.val_limit=2", "--model.evaluation.max_new_tokens=8"], tmp_path / "val")
    results = json.loads((Path(cli.trainer.log_dir) / "bench" / "latest" / "results.json").read_text())
    del cli
    gc.collect()
    assert results["metrics"]["n/overall"] == 2 and len(results["items"]) == 2
