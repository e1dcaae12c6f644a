"""The real-shape tier on Qwen3.5-9B: prompt, labels, check-data and one SGR step on a 9B-width stand-in.

The stand-in is written by the command line (``python -m grasp_lightning build-model OUT --like Qwen3.5-9B
--text-layers 4``): 3 Gated DeltaNet linear-attention layers + 1 gated full-attention layer, 2 vision
blocks, the real Qwen3.5 vocabulary (248,077 tokens, 248,320 logits), bf16; 2.97 B parameters (5.9 GB), of
which the 248,320 x 4,096 embedding and the untied LM head are 2.03 B. The prompt, label and check-data
checks are those of ``tests/real_shapes/test_qwen3_vl.py`` (Qwen3-VL), run on it. This is a module of its own so
that its stand-in is removed when the module ends, before or after the Qwen3-VL module's checkpoints, and
never on disk beside them.

Its SGR step is LoRA (``configs/lora.yaml``) on the frozen bf16 base, the reference being the policy with
its adapters disabled (no second copy): a full fine-tune with AdamW (~16 bytes a parameter, 47 GB) does
not fit in this machine's 24 GiB, and neither do float32 weights beside the other jobs (11.9 GB). The step
runs without back-propagation: on this CPU (AVX2, no bf16 units) the bf16 matrix product of a linear
layer's input gradient (``grad @ W``, both row-major) runs at 0.1-0.3 GFLOP/s against 5-9 GFLOP/s for the
forward (measured: 106 s against 2.8 s for (128 x 12288) @ (12288 x 4096)), and one backward of the
4-layer stand-in over 48 tokens did not finish in 7 minutes. So the test takes one SGR training step of
the recipe (rollout through the group-shared prefill, rewards, advantages, reference and policy
log-probs on the shared path, the clipped loss with the KL) under ``torch.no_grad``; that the shared
path's gradients equal the naive ones is tested on the tiny Qwen3.5 (``tests/unit/grpo/test_scoring.py``).

Run alone: ``python -m pytest -q tests/real_shapes/test_qwen3_5.py``.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import (
    PROCESS_GIB,
    TIMES,
    check_data_counts_prompt_tokens,
    check_rendered_prompt_and_labels,
    run_measured,
    scratch,
    standin_args,
    write_dataset,
)

pytestmark = [pytest.mark.real_shapes, pytest.mark.slow]


@pytest.fixture(scope="module")
def standin35(tmp_path_factory):
    """The Qwen3.5-9B stand-in (4 text layers: 3 linear + 1 full attention; 2 vision blocks; bf16; 5.6 GiB on
    disk), written by ``python -m grasp_lightning build-model OUT --like Qwen3.5-9B --text-layers 4`` (the
    dispatcher, in process); removed when the module ends."""
    from grasp_lightning.__main__ import main

    root = scratch(tmp_path_factory, "standin35", 6.5)
    out = root / "Qwen3.5-9B"
    start = time.perf_counter()
    assert main(["build-model", str(out), "--like", "Qwen3.5-9B", "--text-layers", "4"]) == 0
    TIMES["build Qwen3.5-9B stand-in (command line)"] = time.perf_counter() - start
    info = json.loads((out / "STANDIN.json").read_text())
    assert (info["like"], info["text_layers"], info["vision_layers"], info["dtype"]) == ("Qwen3.5-9B", 4, 2, "bfloat16")
    assert info["parameters"] == 2_974_209_632
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["text_config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    gc.collect()
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("grasp") / "GRASP")


def test_rendered_prompt_is_the_published_one_and_labels_start_right_after_it(standin35):
    check_rendered_prompt_and_labels("qwen3_5", standin35)


def test_check_data_counts_prompt_tokens_with_the_real_tokenizer(standin35, data_root, tmp_path):
    check_data_counts_prompt_tokens("qwen3_5", standin35, data_root, tmp_path)


#: The Qwen3.5 SGR step's group size and completion budget (small: each prompt forward of the 2.97 B
#: stand-in in bf16 takes tens of seconds on 2 cores).
K35, BUDGET35 = 2, 4


def test_qwen3_5_sgr_step_on_the_shared_path_with_lora_on_both_attention_kinds(standin35, data_root, caplog,
                                                                              monkeypatch):
    """One SGR training step of the recipe (``configs/sgr.yaml`` + ``configs/lora.yaml``: K = 2 here, KL beta
    0.05) on the Qwen3.5-9B stand-in, without back-propagation (module docstring): the default LoRA targets
    put adapters on every decoder layer of both kinds (Gated DeltaNet ``in_proj_qkv``/``in_proj_z``/``out_proj``,
    full attention ``q/k/v/o_proj``, and the MLP), none on the DeltaNet gates or the vision tower; the group
    is sampled through the shared prefill and scored on the shared path (no fall-back warning), the
    reference is the policy with its adapters disabled (zero-initialised adapters: KL 0, ratio 1), and the
    prompt forwards are those of the shared path."""
    import torch

    import grasp_lightning.tasks.grpo
    from grasp_lightning.commands.config import load_run

    rollouts = []
    real_rollout = grasp_lightning.tasks.grpo.GRPOTask.rollout

    def rollout(self, ctx, batch):
        rollouts.append(real_rollout(self, ctx, batch))
        return rollouts[-1]

    monkeypatch.setattr(grasp_lightning.tasks.grpo.GRPOTask, "rollout", rollout)
    run = load_run(["--config", "configs/sgr.yaml", "--config", "configs/lora.yaml", "--config", "configs/demo.yaml",
                    *standin_args(standin35, data_root, dtype="bfloat16"), "--data.loader.batch_size=1",
                    f"--model.rollout.num_generations={K35}", f"--model.rollout.max_new_tokens={BUDGET35}",
                    "--data.source.bench=null"])
    module, dm = run.module, run.datamodule
    start = time.perf_counter()
    module.configure_model()
    TIMES["Qwen3.5 load policy + LoRA (bf16)"] = time.perf_counter() - start

    policy = module.policy
    kinds = policy.get_base_model().config.text_config.layer_types
    assert kinds == ["linear_attention"] * 3 + ["full_attention"]
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in policy.named_parameters() if ".lora_A." in n}
    mlp = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    per_kind = {"linear_attention": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"),
                "full_attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")}
    expected = {f"layers.{i}.{name}" for i, kind in enumerate(kinds) for name in per_kind[kind] + mlp}
    assert {n.split("language_model.", 1)[1] for n in adapted} == expected
    assert all("language_model.layers." in n for n in adapted)  # not the vision tower, not the LM head
    assert all(p.dtype == torch.bfloat16 for n, p in policy.named_parameters() if not p.requires_grad)
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == \
        {n for n, _ in policy.named_parameters() if ".lora_" in n}

    dm.connect(data_mode=module.task.data_mode)  # as GraspModule.setup does before fit (window 1, one iteration)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING), torch.no_grad():
        sampled = module.task.prepare(module, batch)  # the window's sampling figures (the module adds them)
        out = module.task.training_step(module, batch)
    TIMES[f"Qwen3.5 SGR step without backward (K={K35}, {BUDGET35} new tokens)"] = time.perf_counter() - start
    assert not [r for r in caplog.records if "falling back to repeated prompt rows" in r.getMessage()]
    assert len(rollouts) == 1
    ro = rollouts[0]
    assert ro.shared and out.metrics["rollout/shared_prompt"] == 1.0
    assert ro.completions.ids.shape[0] == K35 and ro.completions.mask.sum(1).min() >= 1
    assert int(ro.completions.ids.max()) < 248_320 and ro.ref_logp is not None and ro.old_logp is None
    assert torch.isfinite(out.loss) and float(out.metrics["kl"]) == 0.0 and float(out.metrics["ratio/mean"]) == 1.0
    b, lp = batch.inputs["input_ids"].shape
    # generation (the prompt but its last token once, then one token per row) and reference scoring at sampling,
    # the policy's scoring at the step
    forwarded = float(sampled["tokens/prompt_forwarded"]) + float(out.metrics["tokens/prompt_forwarded"])
    assert forwarded == b * (lp - 1) + K35 * b + 2 * b * lp
    rollouts.clear()
    del run, module, policy, out, ro
    gc.collect()


def test_validate_of_sgr_loads_one_model_within_the_plan(standin35, data_root, tmp_path):
    """The size tier at the 9B widths (``tests/real_shapes/test_sizes.py`` at 2B): ``validate`` with
    ``configs/sgr.yaml`` (KL beta 0.05: a reference copy at ``fit``) loads the policy alone, and its peak
    resident set (``VmHWM`` of the child process) stays below one bf16 copy of the stand-in's parameters
    (``plan-memory``'s count x 2 B) plus what a CPU process adds (:data:`tests.helpers.PROCESS_GIB`). The load
    count is what shows a reference here: the bf16 weights stay memory-mapped from the safetensors file and only
    the pages a forward touches become resident, so an unused second copy would add almost nothing to the
    peak on this CPU (on a GPU it is 5.9 GB more). For the same reason there is no lower bound (the
    248,320-row embedding's unused rows never become resident)."""
    from grasp_lightning.commands.plan_memory import plan_from_config

    configs = ["configs/sgr.yaml", "configs/demo.yaml"]
    args = [*standin_args(standin35, data_root, dtype="bfloat16"), "--data.loader.batch_size=1",
            "--data.source.val_limit=1", "--model.evaluation.max_new_tokens=4", "--trainer.enable_model_summary=false"]
    run = run_measured(["validate", *(a for c in configs for a in ("--config", c)), *args,
                        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"],
                       tmp_path / "validate")
    TIMES["Qwen3.5 validate configs/sgr.yaml (1 item, 4 new tokens)"] = run["seconds"]
    plan = plan_from_config(configs, args=args, video_seconds=2.0, text_tokens=128)
    one_copy = 2 * plan.params_total  # bf16, as validate loads it (the plan's weights are fit's float32 masters)
    print(f"[size tier] Qwen3.5 validate SGR: peak RSS {run['peak_rss'] / 2**30:.2f} GiB, one bf16 copy "
          f"{one_copy / 2**30:.2f} GiB, {run['seconds']:.0f} s")
    assert plan.params_total == 2_974_209_632 and plan.reference_model > 0
    assert run["loads"] == [str(standin35)]
    assert run["peak_rss"] < one_copy + PROCESS_GIB * 2**30, (run["peak_rss"] / 2**30, one_copy / 2**30)
