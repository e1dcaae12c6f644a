"""Loading the policy, its processor and the frozen reference model.

Everything goes through ``AutoModelForImageTextToText`` and ``AutoProcessor`` so a Hugging Face id
(Qwen3-VL 2B/4B/8B, Qwen3.5-9B), a local checkpoint directory and the offline tiny model of
:mod:`grasp_lightning.synthetic.tiny` all load by the same code. Remote code is never executed unless the
config sets ``trust_remote_code: true``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.quantization import bnb_config, check_quantize, keep_training_layout

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


@dataclass
class PolicyConfig:
    """How to load the policy (the model being trained).

    Attributes:
        name_or_path: Hugging Face model id or local directory (``save_pretrained`` output).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's dtype).
        attn_implementation: ``sdpa``, ``eager`` or ``flash_attention_2``; ``None`` lets
            transformers choose.
        gradient_checkpointing: recompute activations in the backward pass (saves memory).
        freeze_vision: freeze the vision tower and its merger; the paper trains the language
            model only (GRASP, Sec. 4.1).
        trust_remote_code: allow code shipped with the checkpoint to run. Off unless asked.
        revision: a git revision of a Hub checkpoint, for reproducibility.
    """

    name_or_path: str = "Qwen/Qwen3-VL-8B-Instruct"
    dtype: str = "bfloat16"
    attn_implementation: str | None = "sdpa"
    gradient_checkpointing: bool = False
    freeze_vision: bool = True
    trust_remote_code: bool = False
    revision: str | None = None


@dataclass
class ReferenceConfig:
    """Where the frozen reference model of the KL term comes from.

    Attributes:
        name_or_path: a separate checkpoint; ``None`` uses the policy's starting weights
            (a run that starts from an SFT checkpoint therefore uses that SFT policy, so the KL is
            zero at step 0). With LoRA and ``None`` the reference is the policy with its adapters
            disabled, and no second copy is held in memory.
        dtype: dtype of the reference copy (defaults to the policy's).
    """

    name_or_path: str | None = None
    dtype: str | None = None


@dataclass
class LoraConfig:
    """LoRA through peft. Defaults follow common Qwen practice: every attention and MLP projection of
    the language model, in both of Qwen3.5's attention kinds (full attention ``q/k/v/o_proj``; Gated
    DeltaNet linear attention ``in_proj_qkv``, ``in_proj_z`` and ``out_proj``, leaving the
    per-head gate projections ``in_proj_a``/``in_proj_b`` dense); the vision tower stays frozen.

    Attributes:
        enabled: turn the run into a LoRA run.
        r: adapter rank.
        alpha: scaling numerator (``lora_alpha``); the update is scaled by ``alpha / r``.
        dropout: dropout on the adapter input.
        target_modules: module-name regex or list of names the adapters wrap.
        quantize: ``nf4`` (or ``fp4``) loads the base's language-model Linears in 4 bit through
            bitsandbytes (QLoRA, :mod:`grasp_lightning.quantization`); the vision tower, ``lm_head``,
            embeddings and norms stay in ``model.policy.dtype``. ``null``: no quantization. Needs
            ``enabled: true``, no DeepSpeed, and ``pip install -e '.[qlora]'``.
        quant_compute_dtype: the dtype each 4-bit weight is dequantized to for its matrix product;
            ``null``: ``model.policy.dtype``.
        double_quant: quantize the 4-bit blocks' absmax values again (8 bit per block of 64, one
            float32 per 256 blocks: 0.127 instead of 0.5 bit per weight).
    """

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | str = field(
        default_factory=lambda: r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|in_proj_qkv|in_proj_z|out_proj|gate_proj|up_proj|down_proj)"
    )
    quantize: str | None = None
    quant_compute_dtype: str | None = None
    double_quant: bool = True

    def __post_init__(self) -> None:
        check_quantize(self)


def resolve_dtype(name: str) -> torch.dtype | str:
    """Map a dtype name from a config to a ``torch.dtype`` (or ``"auto"``).

    Raises:
        GraspConfigError: for an unknown name.
    """
    if name not in _DTYPES:
        raise GraspConfigError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def is_missing_local_path(name_or_path: str) -> bool:
    """Whether ``name_or_path`` can only be a folder on this machine, and there is none.

    A Hugging Face Hub id is ``name`` or ``namespace/name``; a value starting with ``.``, ``/`` or
    ``~``, with two or more ``/`` (``runs/sft/export``) or whose first component is a local folder
    (``runs/export`` with ``runs/`` here) is a path. An existing folder is never missing.
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return False
    first = name_or_path.split("/", 1)[0]
    return (name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path
            or ("/" in name_or_path and Path(first).is_dir()))


def missing_model_message(name_or_path: str, key: str = "model.policy.name_or_path") -> str:
    """What to do when ``key`` names a model folder that is not on this machine (loading fails with it,
    ``plan-memory`` notes it): run the stage that writes it, or name a model that exists."""
    return (f"{key}: model {name_or_path!r} is not on this machine (no such folder; not a Hugging Face Hub id "
            "either). configs/sgr.yaml starts from the SFT stage's export, runs/sft/export: run the SFT stage and "
            "export it first (python -m grasp_lightning fit --config configs/sft.yaml, then python -m grasp_lightning "
            "export --config runs/sft/version_0/config.yaml --ckpt_path runs/sft/version_0/checkpoints/last.ckpt "
            f"--out runs/sft/export; or both with python -m grasp_lightning pipeline), or set {key} to a model you have")


def check_model_path(name_or_path: str, key: str = "model.policy.name_or_path") -> None:
    """Stop with one clear error when ``name_or_path`` is a model folder that does not exist
    (:func:`is_missing_local_path`); transformers would read it as a Hub id and fail 40 lines later with
    "Repo id must be in the form 'repo_name' or 'namespace/repo_name'".

    Raises:
        GraspConfigError: naming ``key``, the path and what to do (:func:`missing_model_message`).
    """
    if is_missing_local_path(str(name_or_path)):
        raise GraspConfigError(missing_model_message(str(name_or_path), key))


def load_processor(name_or_path: str, *, trust_remote_code: bool = False, revision: str | None = None,
                   key: str = "model.policy.name_or_path"):
    """Load the processor (tokenizer + video processor + chat template) with ``AutoProcessor``.

    The tokenizer's ``padding_side`` is left as saved; batch builders set it per use (right for
    training, left for generation).

    Raises:
        GraspConfigError: ``name_or_path`` is a folder that does not exist (the message names ``key``).
    """
    from transformers import AutoProcessor

    check_model_path(name_or_path, key)
    return AutoProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, revision=revision)


def load_model(name_or_path: str, *, dtype: str, attn_implementation: str | None = None,
               trust_remote_code: bool = False, revision: str | None = None,
               quantization_config=None, key: str = "model.policy.name_or_path") -> nn.Module:
    """Load an image/video-text-to-text model with ``AutoModelForImageTextToText.from_pretrained``
    (``quantization_config``: a ``BitsAndBytesConfig`` for a 4-bit base, :func:`~grasp_lightning.quantization.bnb_config`,
    whose 4-bit Linears keep their training layout: :func:`~grasp_lightning.quantization.keep_training_layout`).

    Raises:
        GraspConfigError: ``name_or_path`` is a folder that does not exist (the message names ``key``).
    """
    from transformers import AutoModelForImageTextToText

    check_model_path(name_or_path, key)
    kwargs = {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code, "revision": revision}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if quantization_config is None:
        return AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, quantization_config=quantization_config, **kwargs)
    keep_training_layout(model)  # a rollout or validation forward must not repack the 4-bit weights (CPU)
    return model


def vision_modules(model: nn.Module) -> list[nn.Module]:
    """The vision tower (and merger) of a Qwen-VL-style model: ``model.model.visual`` or ``model.visual``."""
    inner = getattr(model, "model", model)
    found = [m for m in (getattr(inner, "visual", None), getattr(model, "visual", None)) if m is not None]
    return list({id(m): m for m in found}.values())


def keep_float32_masters(model: nn.Module) -> int:
    """Cast every trainable bfloat16/float16 parameter of ``model`` to float32, in place.

    The optimizer then updates float32 *master* weights, while ``trainer.precision: bf16-mixed``
    (``torch.autocast``) still runs the matrix products in bfloat16. Pure-bfloat16 AdamW loses every
    update below half a bf16 ulp (8 significant bits: a step of ``lr = 2e-6`` on a weight of
    magnitude 0.02 is 1e-4 of it, below the 2**-9 rounding threshold), so only a few per cent of the
    weights would change in a step. A bf16 checkpoint upcast to float32 is exact and autocast casts
    the matrix-product weights back exactly; the operations autocast leaves in float32 (norms, the
    residual stream) then run in float32 instead of bf16, so logits differ from the bf16 model's at
    bf16 rounding level (at most 0.004 in log-probability on the tiny model). A bf16 reference model
    therefore gives a small non-zero KL at step 0.

    Frozen parameters (the vision tower, LoRA's base weights) keep their dtype; peft already creates
    LoRA adapters in float32 (``get_peft_model(autocast_adapter_dtype=True)``, its default). Tied
    weights are one parameter and stay tied.

    Cost: 4 bytes per trainable parameter for the weights and 4 for their gradients (instead of
    2 + 2), AdamW's two states are float32 either way for float32 parameters (8 bytes), and under
    autocast a bf16 copy of each weight is cached during the forward (2 bytes, freed after it).

    Returns:
        The number of parameter elements cast.

    Source: mixed-precision training with float32 master weights (Micikevicius et al., 2018);
    Lightning's ``bf16-mixed`` precision, which autocasts and leaves the weights' dtype alone.
    """
    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.to(torch.float32)
            cast += param.numel()
    return cast


def _check_lora_targets(model: nn.Module, targets, *, freeze_vision: bool) -> None:
    """Refuse adapters that miss the language model, or that train a vision tower meant to stay frozen.

    peft only refuses targets that match nothing at all; a pattern matching only vision blocks (e.g.
    ``qkv``) would silently train the vision tower and leave the language model untouched.

    Raises:
        GraspConfigError: no adapter in the language model, or adapters in the vision tower while
            ``freeze_vision`` is set (naming the first few).
    """
    adapted = sorted({name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A" in name})
    if not any("language_model" in name for name in adapted):
        raise GraspConfigError(f"model.lora.target_modules {targets!r} put no adapter in the language model "
                               f"(adapted: {adapted[:3] or 'nothing'}{' ...' if len(adapted) > 3 else ''})")
    vision = [name for name in adapted if ".visual." in f".{name}."]
    if freeze_vision and vision:
        raise GraspConfigError(f"model.lora.target_modules {targets!r} put adapters in the vision tower "
                               f"({vision[:3]}{' ...' if len(vision) > 3 else ''}) while model.policy.freeze_vision "
                               "is true; narrow the pattern (the default covers the language model only) or set "
                               "freeze_vision: false")


def load_policy(cfg: PolicyConfig, lora: LoraConfig | None = None, *, float32_masters: bool = False) -> nn.Module:
    """Load the policy for training: dtype, attention, vision freezing, gradient checkpointing, LoRA.

    Args:
        cfg: how to load it.
        lora: LoRA settings (``None`` or ``enabled: false``: a full fine-tune); with ``quantize`` the
            base loads in 4 bit (QLoRA: :mod:`grasp_lightning.quantization`, which says what of peft's
            ``prepare_model_for_kbit_training`` is kept).
        float32_masters: keep the trainable parameters in float32 (:func:`keep_float32_masters`);
            :meth:`grasp_lightning.module.GraspModule.configure_model` asks for it whenever the
            optimizer runs outside DeepSpeed (which keeps its own float32 master copy under bf16).

    Returns the model in train mode (``from_pretrained`` returns eval mode).

    Raises:
        GraspConfigError: ``freeze_vision`` asked on a model without a vision tower; LoRA targets that
            put no adapter in the language model, or adapters in a vision tower meant to stay frozen;
            ``lora.quantize`` without bitsandbytes installed.
    """
    quantized = lora is not None and lora.enabled and lora.quantize is not None
    model = load_model(cfg.name_or_path, dtype=cfg.dtype, attn_implementation=cfg.attn_implementation,
                       trust_remote_code=cfg.trust_remote_code, revision=cfg.revision,
                       quantization_config=bnb_config(lora, cfg.dtype) if quantized else None)
    if cfg.freeze_vision:
        towers = vision_modules(model)
        if not towers:
            raise GraspConfigError(f"freeze_vision: {cfg.name_or_path} has no `visual` module to freeze")
        for tower in towers:
            tower.requires_grad_(False)
    if lora is not None and lora.enabled:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        peft_cfg = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                  target_modules=lora.target_modules, bias="none")
        model = get_peft_model(model, peft_cfg)
        _check_lora_targets(model, lora.target_modules, freeze_vision=cfg.freeze_vision)
    if float32_masters:
        cast = keep_float32_masters(model)
        if cast:
            log.info("policy: %d trainable parameters kept in float32 (master weights; compute dtype set by "
                     "trainer.precision)", cast)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    model.train()
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    log.info("policy %s: %d parameters, %d trainable", cfg.name_or_path, n_all, n_train)
    return model


def load_reference(policy_cfg: PolicyConfig, ref_cfg: ReferenceConfig) -> nn.Module:
    """Load a frozen reference model: eval mode, ``requires_grad=False`` everywhere.

    The reference is never handed to an optimizer (it is not a parameter of the policy) and
    holds no optimizer state.
    """
    model = load_model(ref_cfg.name_or_path or policy_cfg.name_or_path,
                       dtype=ref_cfg.dtype or policy_cfg.dtype,
                       attn_implementation=policy_cfg.attn_implementation,
                       trust_remote_code=policy_cfg.trust_remote_code, revision=policy_cfg.revision,
                       key="model.reference.name_or_path" if ref_cfg.name_or_path else "model.policy.name_or_path")
    model.requires_grad_(False)
    model.eval()
    return model
