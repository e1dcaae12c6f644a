"""QLoRA (``model.lora.quantize``, configs/qlora.yaml) with real bitsandbytes on the CPU.

bitsandbytes 0.50 runs NF4 on the CPU (its ``libbitsandbytes_cpu`` backend): transformers' 4-bit
loading, ``Linear4bit`` forward and backward through peft's adapters, and ``dequantize_4bit``. So the
QLoRA SFT and GRPO steps below are the user's commands on the tiny Qwen3-VL; what needs a GPU is only
the speed and the measured peak (``benchmarks/gpu_check.py --qlora``).
"""

from __future__ import annotations

from pathlib import Path

import bitsandbytes  # noqa: F401 (setup.cfg [test]: a missing install fails here, it is not skipped)
import pytest
import torch
import yaml

from grasp_lightning.checkpointing import check_trainable_state
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.policy import LoraConfig, PolicyConfig, load_policy
from grasp_lightning.quantization import SKIP_MODULES, bnb_config, check_strategy, is_4bit
from tests.helpers import FAST, REPO, TINY, TINY35, WeightRecorder, find_callback, one_sgr_step_args, run_cli, scalars

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

#: The QLoRA SFT demo: two samples, float32 compute (so the export's dense logits match exactly).
SFT_ARGS = ["fit", "--config", "configs/sft.yaml", "--config", "configs/qlora.yaml", "--config", "configs/demo.yaml",
            *FAST, "--data.source.train_limit=2", "--data.loader.batch_size=2", "--trainer.max_epochs=-1", "--data.source.bench=null",
            "--model.lora.quant_compute_dtype=float32", "--model.optim.warmup_steps=0"]
QLORA = LoraConfig(enabled=True, r=4, alpha=8, quantize="nf4", quant_compute_dtype="float32")


def test_settings_are_validated() -> None:
    with pytest.raises(GraspConfigError, match="needs model.lora.enabled: true"):
        LoraConfig(quantize="nf4")
    with pytest.raises(GraspConfigError, match=r"choose one of \['nf4', 'fp4'\]"):
        LoraConfig(enabled=True, quantize="int4")
    with pytest.raises(GraspConfigError, match="quant_compute_dtype"):
        LoraConfig(enabled=True, quantize="nf4", quant_compute_dtype="fp8")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    with pytest.raises(GraspConfigError, match="does not run under DeepSpeed"):
        check_strategy(QLORA, DeepSpeedStrategy(stage=2))
    check_strategy(LoraConfig(enabled=True), DeepSpeedStrategy(stage=2))  # plain LoRA is fine
    config = bnb_config(LoraConfig(enabled=True, quantize="nf4"), "bfloat16")
    assert (config.load_in_4bit, config.bnb_4bit_quant_type, config.bnb_4bit_compute_dtype,
            config.bnb_4bit_use_double_quant) == (True, "nf4", torch.bfloat16, True)
    assert config.llm_int8_skip_modules == list(SKIP_MODULES)
    assert bnb_config(replace_lora(double_quant=False), "float16").bnb_4bit_compute_dtype == torch.float16


def replace_lora(**kw) -> LoraConfig:
    import dataclasses

    return dataclasses.replace(LoraConfig(enabled=True, quantize="nf4"), **kw)


def test_qlora_yaml_is_lora_yaml_plus_the_4bit_keys() -> None:
    lora = yaml.safe_load((REPO / "configs" / "lora.yaml").read_text())
    qlora = yaml.safe_load((REPO / "configs" / "qlora.yaml").read_text())
    keys = {k: qlora["model"]["lora"].pop(k) for k in ("quantize", "quant_compute_dtype", "double_quant")}
    assert keys == {"quantize": "nf4", "quant_compute_dtype": "bfloat16", "double_quant": True}
    assert qlora == lora


@pytest.mark.parametrize("path", [TINY, TINY35], ids=["qwen3_vl", "qwen3_5"])
def test_the_language_model_loads_in_4bit_and_only_adapters_train(path: Path) -> None:
    """Every language-model Linear is a bitsandbytes Linear4bit (the ones the planner counts), the vision
    tower and lm_head are not; only the adapters train and get gradients."""
    from grasp_lightning.planning.architectures import architecture_config, count_parameters
    from grasp_lightning.planning.quantized import quantized_linears

    model = load_policy(PolicyConfig(name_or_path=str(path), dtype="float32"), QLORA, float32_masters=True)
    base = model.get_base_model()
    four = {name.removesuffix(".base_layer") for name, m in base.named_modules() if is_4bit(m)}
    assert four == {name for name, _, _ in quantized_linears(count_parameters(architecture_config(str(path))))}
    assert four and all(".language_model." in f".{name}" for name in four)
    assert not is_4bit(base.lm_head) and not any(is_4bit(m) for m in base.model.visual.modules())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    ids = torch.arange(3, 35).reshape(2, 16)
    model(input_ids=ids, labels=ids).loss.backward()
    with_grad = [n for n, p in model.named_parameters() if p.grad is not None]
    assert with_grad and all(".lora_" in n for n in with_grad)


@pytest.mark.parametrize("path", [TINY, TINY35], ids=["qwen3_vl", "qwen3_5"])
def test_an_eval_forward_leaves_the_training_gradients_and_the_dense_weights_as_they_were(path: Path) -> None:
    """A rollout or validation forward (eval mode, no gradients) must not switch a 4-bit layer to
    bitsandbytes' AVX512-BF16 CPU inference layout: there a later training forward gives no gradient
    through the base weight, so the adapters below it get a wrong gradient (quantization.keep_training_layout).
    On a CPU without AVX512-BF16 bitsandbytes never repacks, and the equalities hold either way."""
    from grasp_lightning.quantization import dense_weight

    model = load_policy(PolicyConfig(name_or_path=str(path), dtype="float32"),
                        replace_lora(quant_compute_dtype="float32", dropout=0.0), float32_masters=True)
    four = [m for m in model.modules() if is_4bit(m)]
    assert four and not any(m.support_avx512bf16_for_cpu for m in four)
    ids = torch.arange(3, 35).reshape(2, 16)

    def gradients() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    before, dense = gradients(), [dense_weight(m).clone() for m in four]
    lowest = min((n for n in before if ".layers.0." in n and ".lora_B." in n), default=None)
    assert lowest is not None and before[lowest].abs().sum() > 0  # layer 0 learns through the layers above
    model.eval()
    with torch.no_grad():
        eval_logits = model(input_ids=ids).logits
    model.train()
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in four)
    after = gradients()
    assert set(after) == set(before)
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0)
    for m, w in zip(four, dense, strict=True):
        assert torch.equal(dense_weight(m), w)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, eval_logits, rtol=0, atol=0)


def test_a_checkpoint_without_an_adapter_is_refused() -> None:
    model = load_policy(PolicyConfig(name_or_path=str(TINY), dtype="float32"), QLORA)
    state = {n: p for n, p in model.named_parameters() if p.requires_grad}
    check_trainable_state(state, model, "ckpt")
    state.pop(next(iter(state)))
    with pytest.raises(GraspConfigError, match="ckpt: 1 trainable parameter"):
        check_trainable_state(state, model, "ckpt")


def test_qlora_sft_step_checkpoints_adapters_resumes_and_exports(in_repo, tmp_path) -> None:
    """configs/sft.yaml + configs/qlora.yaml on the tiny model: a step moves the adapters only, the checkpoint
    holds them only, a resume continues from it, and export writes a dense model with the trained logits."""
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.__main__ import main as dispatch

    cli = run_cli([*SFT_ARGS, "--trainer.max_steps=2", "--trainer.callbacks+=tests.helpers.WeightRecorder"],
                  tmp_path / "run")
    module, policy = cli.model, cli.model.policy
    assert module.quantized and module.uses_adapter_reference
    assert is_4bit(policy.get_base_model().model.language_model.layers[0].mlp.up_proj.base_layer)
    loss = [v for _, v in scalars(cli.trainer.log_dir)["train/loss"]]
    assert len(loss) == 2 and all(torch.isfinite(torch.tensor(loss)))
    before, after = find_callback(cli, WeightRecorder).before, dict(policy.named_parameters())
    changed = {n for n, w in before.items() if w.dtype.is_floating_point and not torch.equal(w, after[n])}
    assert changed and all(".lora_" in n for n in changed)
    (ckpt,) = Path(cli.trainer.log_dir).rglob("last.ckpt")
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert set(saved) == {f"policy.{n}" for n, p in policy.named_parameters() if p.requires_grad}
    resumed = run_cli([*SFT_ARGS, "--trainer.max_steps=3", f"--ckpt_path={ckpt}"], tmp_path / "resumed")
    assert resumed.trainer.global_step == 3
    log_dir = Path(cli.trainer.log_dir)
    out = tmp_path / "export"
    assert dispatch(["export", "--config", str(log_dir / "config.yaml"), "--ckpt_path", str(ckpt),
                     "--out", str(out)]) == 0
    dense = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32).eval()
    assert not any(is_4bit(m) for m in dense.modules()) and not hasattr(dense.config, "quantization_config")
    ids = torch.arange(3, 35).reshape(2, 16)
    policy.eval()
    with torch.no_grad():
        torch.testing.assert_close(dense(input_ids=ids).logits, policy(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_qlora_grpo_step_uses_the_adapter_disabled_reference(in_repo, tmp_path) -> None:
    """configs/sgr.yaml + configs/qlora.yaml: one GRPO step on a 4-bit base; the reference is the policy with
    its adapters disabled (KL exactly 0 at step 0) and only the adapters move."""
    cli = run_cli([*one_sgr_step_args("sgr", "qlora", "demo"), f"--model.policy.name_or_path={TINY}",
                   "--model.lora.quant_compute_dtype=float32",
                   "--trainer.callbacks+=tests.helpers.WeightRecorder"], tmp_path)
    module, policy = cli.model, cli.model.policy
    assert module.quantized and module.reference_model is None
    series = scalars(cli.trainer.log_dir)
    assert series["train/kl"] == [(0, 0.0)] and torch.isfinite(torch.tensor(series["train/loss"][0][1]))
    before, after = find_callback(cli, WeightRecorder).before, dict(policy.named_parameters())
    changed = {n for n, w in before.items() if w.dtype.is_floating_point and not torch.equal(w, after[n])}
    assert changed and all(".lora_" in n for n in changed)


def test_vllm_weight_sync_serves_dequantized_weights_with_the_adapters_merged() -> None:
    """``engines.vllm.language_model_state`` of a QLoRA policy: the dense checkpoint's names and shapes,
    no packed uint8 or quant-state entries, and each weight the dequantized base plus the adapter."""
    import bitsandbytes.functional as F

    from grasp_lightning.engines.vllm import language_model_state

    model = load_policy(PolicyConfig(name_or_path=str(TINY), dtype="float32"), QLORA)
    for name, param in model.named_parameters():
        if ".lora_B." in name:
            torch.nn.init.normal_(param, std=0.1)
    dense = load_policy(PolicyConfig(name_or_path=str(TINY), dtype="float32"))
    got, want = language_model_state(model, torch.float32), language_model_state(dense, torch.float32)
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in want.items()}
    layer = model.get_base_model().model.language_model.layers[0].mlp.up_proj
    w = layer.base_layer.weight
    expected = F.dequantize_4bit(w.data, w.quant_state) + layer.get_delta_weight("default")
    torch.testing.assert_close(got["model.language_model.layers.0.mlp.up_proj.weight"], expected)
    assert float((expected - want["model.language_model.layers.0.mlp.up_proj.weight"]).abs().max().detach()) > 0


def test_gpu_check_qlora_composes_configs_qlora_yaml_without_deepspeed(tmp_path) -> None:
    """``benchmarks/gpu_check.py --qlora``: the phase's overrides drop ZeRO-2 for ``auto`` and the planner plans
    the composed configs (it would refuse QLoRA under DeepSpeed)."""
    from benchmarks import gpu_check

    sizes = gpu_check.SIZES["smoke-cpu"]
    cfg = gpu_check.phase_overrides("sgr", "smoke-cpu", sizes, TINY, tmp_path, tmp_path / "r.json", qlora=True)
    assert cfg["trainer"]["strategy"] == "auto" and cfg["model"]["lora"] == {"quant_compute_dtype": "float32"}
    plain = gpu_check.phase_overrides("sgr", "gpu", gpu_check.SIZES["gpu"], TINY, tmp_path, tmp_path / "r.json")
    assert plain["trainer"]["strategy"] == {"class_path": "grasp_lightning.strategies.GraspDeepSpeedStrategy"}
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(cfg))
    assert gpu_check.planned_peak_gib("sgr", override, 2.0, 448, qlora=True) is not None  # the tiny model: 0.0 GiB
