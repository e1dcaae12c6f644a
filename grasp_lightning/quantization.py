"""QLoRA: the policy's language-model Linears in 4 bit (bitsandbytes NF4), LoRA adapters trained on top.

``model.lora.quantize: nf4`` loads the base through ``transformers``' ``BitsAndBytesConfig``
(:func:`bnb_config`): every ``nn.Linear`` becomes a ``bitsandbytes.nn.Linear4bit`` except those of
:data:`SKIP_MODULES` (the vision tower and its mergers, and ``lm_head``), which stay in
``model.policy.dtype``, as do the embeddings and norms (not Linears). A 4-bit weight is packed two
values a byte with one absmax per block of 64 (float32, or with ``double_quant`` 8-bit, themselves
quantized per 256 with a float32 absmax); each matrix product dequantizes one layer's weight to
``quant_compute_dtype`` (bitsandbytes ``MatMul4Bit``) and adds the adapter's float32 ``B A x``.

What peft's ``prepare_model_for_kbit_training`` does and what is kept: freezing every base weight
(``get_peft_model`` does it), gradient checkpointing with ``use_reentrant: False`` plus input
gradients (``model.policy.gradient_checkpointing``, as for LoRA). Not kept: its cast of every
non-quantized parameter (embeddings, ``lm_head``, vision tower, norms) to float32, which would
double their memory (2.5 GB more for Qwen3-VL-8B's untied embedding and head) while Qwen's RMSNorm
already computes in float32 and ``bf16-mixed`` autocasts the rest.

Source: Dettmers et al. 2023, "QLoRA" (NF4, double quantization); bitsandbytes 0.50
``functional.quantize_4bit``; transformers' ``Bnb4BitHfQuantizer``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from torch import nn

from grasp_lightning.errors import GraspConfigError

#: ``model.lora.quantize`` values: bitsandbytes' 4-bit data types.
QUANT_TYPES = ("nf4", "fp4")
#: Modules kept un-quantized (transformers' ``llm_int8_skip_modules``, matched from the start of a
#: module's name or as its suffix): the vision tower with its mergers, and the LM head.
SKIP_MODULES = ("model.visual", "visual", "lm_head")
#: Names a quantized Linear adds to its ``weight`` in a state dict (bitsandbytes' ``QuantState.as_dict``).
QUANT_STATE_SUFFIXES = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                        ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4")
_INSTALL = "pip install 'bitsandbytes>=0.50,<0.51' (or pip install -e '.[qlora]')"

#: The loggers that warn when bitsandbytes is imported: its own (a CPU 4-bit kernel that did not load) and
#: the ``kernels`` package's, which it asks for that kernel (a skipped Hub trust check when offline).
#: peft imports bitsandbytes whenever it is installed (``peft/helpers.py``), and transformers imports
#: peft (``transformers.trainer_utils``, reached by ``get_scheduler``), so the warnings reach every run.
BITSANDBYTES_LOGGERS = ("bitsandbytes", "bitsandbytes.backends.cpu.ops", "bitsandbytes.cextension",
                        "kernels", "kernels._internals.hf_hub")
_four_bit_requested = False


class UnlessFourBit(logging.Filter):
    """Drops bitsandbytes' records below ERROR (those of its own loggers, and the ``kernels`` records
    that name it) until a run asks for 4-bit weights (:func:`bnb_config`): without
    ``model.lora.quantize`` they concern nothing the run does."""

    def filter(self, record: logging.LogRecord) -> bool:
        """True (keep the record) once 4-bit weights are requested, for an ERROR or worse, or for a
        record that is not about bitsandbytes."""
        if _four_bit_requested or record.levelno >= logging.ERROR:
            return True
        return not (record.name.startswith("bitsandbytes") or "bitsandbytes" in record.getMessage())


for _name in BITSANDBYTES_LOGGERS:
    if not any(isinstance(f, UnlessFourBit) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(UnlessFourBit())


def check_quantize(lora: Any) -> None:
    """Validate the 4-bit settings of a :class:`~grasp_lightning.policy.LoraConfig`.

    Raises:
        GraspConfigError: an unknown ``quantize`` type or ``quant_compute_dtype``; 4 bit without LoRA
            (a 4-bit base cannot be trained in full: only adapters learn on top of it).
    """
    if lora.quantize is None:
        return
    if lora.quantize not in QUANT_TYPES:
        raise GraspConfigError(f"model.lora.quantize={lora.quantize!r}: choose one of {list(QUANT_TYPES)} or null")
    if not lora.enabled:
        raise GraspConfigError(f"model.lora.quantize={lora.quantize} needs model.lora.enabled: true: a 4-bit base "
                               "cannot be trained in full, only LoRA adapters on top of it (use configs/qlora.yaml)")
    if lora.quant_compute_dtype not in (None, "bfloat16", "float16", "float32"):
        raise GraspConfigError(f"model.lora.quant_compute_dtype={lora.quant_compute_dtype!r}: choose bfloat16, "
                               "float16, float32 or null (the policy's dtype)")


def check_strategy(lora: Any, strategy: Any) -> None:
    """Refuse 4-bit weights under DeepSpeed: ZeRO flattens and casts every parameter of the module it
    wraps, which breaks bitsandbytes' packed ``Params4bit`` (uint8 data plus a ``quant_state``);
    QLoRA runs on one GPU or under DDP.

    Raises:
        GraspConfigError: ``model.lora.quantize`` is set and ``strategy`` is a ``DeepSpeedStrategy``.
    """
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if lora.quantize and isinstance(strategy, DeepSpeedStrategy):
        raise GraspConfigError(f"model.lora.quantize={lora.quantize} does not run under DeepSpeed (ZeRO casts and "
                               "flattens the packed 4-bit weights): use trainer.strategy: auto (one GPU) or ddp, as "
                               "configs/qlora.yaml does")


def bnb_config(lora: Any, policy_dtype: str):
    """The ``transformers.BitsAndBytesConfig`` of ``model.lora``'s 4-bit settings.

    Args:
        lora: a LoRA config with ``quantize`` set (``nf4`` or ``fp4``).
        policy_dtype: ``model.policy.dtype``: the compute dtype when ``quant_compute_dtype`` is null
            (``auto`` computes in bfloat16).

    Raises:
        GraspConfigError: bitsandbytes is not installed (naming the install command).
    """
    from transformers import BitsAndBytesConfig

    global _four_bit_requested
    _four_bit_requested = True  # bitsandbytes' warnings concern this run now
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise GraspConfigError(f"model.lora.quantize={lora.quantize} needs bitsandbytes: {_INSTALL}") from err
    name = lora.quant_compute_dtype or (policy_dtype if policy_dtype != "auto" else "bfloat16")
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=lora.quantize,
                              bnb_4bit_compute_dtype=getattr(torch, name),
                              bnb_4bit_use_double_quant=bool(lora.double_quant),
                              llm_int8_skip_modules=list(SKIP_MODULES))


def is_4bit(module: nn.Module) -> bool:
    """Whether ``module`` is a bitsandbytes 4-bit Linear (``bitsandbytes.nn.Linear4bit``; not peft's LoRA
    wrapper of one, whose ``base_layer`` it is). ``False`` while bitsandbytes is not imported (then no
    module can be one), so plain runs never import it."""
    if "bitsandbytes" not in sys.modules:
        return False
    from bitsandbytes.nn import Linear4bit

    return isinstance(module, Linear4bit)


def keep_training_layout(model: nn.Module) -> int:
    """Turn off bitsandbytes' CPU inference repacking on every 4-bit Linear of ``model``, in place.

    bitsandbytes 0.50 repacks a ``Linear4bit`` weight, on a CPU with AVX512-BF16, at its first forward in
    eval mode without gradients (``Linear4bit.forward``: ``_convert_weight_packed_for_cpu``) and from
    then on serves *every* forward of that layer, training ones included, from the packed layout
    (``matmul_4bit`` calls ``gemv_4bit``, which has no autograd kernel). Measured on an AMD EPYC with
    ``avx512_bf16``: after one eval forward (a rollout, a validation), a training forward gives a lone
    layer's input no gradient at all (``x.grad`` is ``None``; in a model, silently, the adapters below
    every 4-bit layer get only the residual and adapter paths' share of their gradient), a layer with a
    bias raises, the packed kernel computes in bfloat16 whatever ``quant_compute_dtype`` says (0.005 off
    the float32 product on a 64-wide layer), and ``functional.dequantize_4bit`` of a packed weight is
    wrong (0.11 off). Keeping the training layout
    costs CPU inference speed only; on a GPU the flag is never read.

    Returns:
        The number of 4-bit Linears changed (0 without bitsandbytes or 4-bit layers).

    Source: bitsandbytes 0.50.2 ``nn.Linear4bit.forward`` (``support_avx512bf16_for_cpu``) and
    ``autograd._functions.matmul_4bit`` (the ``packing_format_for_cpu`` branch).
    """
    changed = 0
    for module in model.modules():
        if is_4bit(module) and getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
            changed += 1
    return changed


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """A Linear's weight as a dense ``(out, in)`` tensor: a 4-bit weight dequantized to its compute
    dtype (bitsandbytes ``functional.dequantize_4bit``), any other weight as it is (detached).

    Raises:
        GraspConfigError: the 4-bit weight was repacked for bitsandbytes' CPU inference kernel
            (see :func:`keep_training_layout`), whose layout ``dequantize_4bit`` does not read.
    """
    if not is_4bit(linear):
        return linear.weight.detach()
    import bitsandbytes.functional as F

    weight = linear.weight
    if getattr(weight.quant_state, "packing_format_for_cpu", False):
        raise GraspConfigError(f"dense_weight: a {tuple(weight.quant_state.shape)} 4-bit weight is in bitsandbytes' "
                               "CPU inference layout (it ran an eval forward without keep_training_layout); "
                               "dequantizing it would be wrong")
    out = F.dequantize_4bit(weight.data, weight.quant_state)
    return out.to(linear.compute_dtype or torch.bfloat16)


def is_quant_state_key(name: str) -> bool:
    """Whether a state-dict key is a quantized weight's bookkeeping (absmax, quant map, packed state)."""
    return name.endswith(QUANT_STATE_SUFFIXES)


def dense_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The un-quantized model's state dict of a (peft-wrapped) 4-bit model: every 4-bit weight
    dequantized, active LoRA adapters merged in (``W + B A alpha / r``, peft's ``get_delta_weight``),
    names as ``save_pretrained`` writes them (no ``base_layer``, ``lora_`` or quant-state keys).

    What was trained and validated is the 4-bit base plus the adapters, so this, not the original
    bf16 weights plus the adapters, is the function the run learnt (up to bf16 rounding)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    dense: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and hasattr(module, "base_layer"):
            w = dense_weight(module.base_layer)
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    w = w + module.get_delta_weight(adapter).to(w.dtype)
            dense[f"{name}.weight"] = w
        elif is_4bit(module):
            dense[f"{name}.weight"] = dense_weight(module)
    state = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name or is_quant_state_key(name):
            continue
        name = name.replace(".base_layer.", ".")
        state[name] = dense.get(name, tensor).detach()
    return state
