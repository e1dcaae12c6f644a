"""Export a training checkpoint to a Hugging Face model directory.

``python -m grasp_lightning export --config <the run's config> --ckpt_path <ckpt> --out <dir>
[--merge_lora true] [--dtype bfloat16] [--overwrite false]``

* ``--config``: the run's resolved ``config.yaml`` (in its log directory) or the same ``--config``
  files the run was started with, read by the one config loader
  (:func:`grasp_lightning.commands.config.load_run`); the module's ``policy_cfg`` and ``lora_cfg``
  are used. Put the ``--config`` options first (a saved config holds ``ckpt_path: null``).
* ``--ckpt_path``: a Lightning ``.ckpt`` file or a DeepSpeed checkpoint directory (ZeRO-2/3; its
  shards are consolidated to float32 with Lightning's ``convert_zero_checkpoint_to_fp32_state_dict``).
  A directory without the completion marker of ``grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint`` is
  refused.
* ``--out``: the directory to write: ``save_pretrained`` of the policy and of the processor, plus
  ``export_info.json`` (source checkpoint, step, LoRA handling). ``from_pretrained`` loads it and the
  next stage starts from it (``--model.policy.name_or_path <dir>``, e.g. SGR after SFT).
* LoRA runs (the checkpoint holds the trainable weights only, :mod:`grasp_lightning.checkpointing`):
  the base is loaded from ``model.policy.name_or_path``, the adapters from the checkpoint (each must
  be there), then merged into the base weights by default (``merge_and_unload``); ``--merge_lora false``
  writes the adapter only (``adapter_config.json`` naming the base model), which
  ``AutoModelForImageTextToText.from_pretrained`` also loads when peft is installed. A checkpoint that
  also holds the base (saved before checkpoints were trimmed) exports the same way.
* QLoRA runs (``model.lora.quantize``; the checkpoint holds the adapters only): the base is loaded in
  4 bit as in training, the adapters into it, then every 4-bit weight is dequantized and the
  adapters merged (:func:`grasp_lightning.quantization.dense_state_dict`) into an un-quantized copy
  of the model in ``--dtype`` (the function that was trained and validated, not the original bf16
  weights plus the adapters). ``--merge_lora false`` writes the adapter alone; it then loads onto
  the original (un-quantized) base named in ``adapter_config.json``.

* ``README.md``: the model card (:mod:`grasp_lightning.commands.model_card`): the Hub's metadata block
  (``base_model``, ``license``, ``library_name``, ``pipeline_tag``, ``tags``, ``datasets``), the recipe's
  settings from the configuration, the checkpoint's steps, the run's last ``bench/latest`` table and
  the loading code. ``--license`` sets its licence (default ``cc-by-nc-4.0``: GRASP's data licence),
  ``--base_model`` its ``base_model`` (the Hub id of a base loaded from a local folder).
* ``--push_to_hub REPO``: after the export, upload ``--out`` to the Hub model repository ``REPO``; without
  a token, with ``HF_HUB_OFFLINE`` set or without the network it says why in one line and exits 1
  (the export stays on disk).

The directory is written under a temporary name beside ``--out`` and renamed into place when
complete (:func:`grasp_lightning.checkpointing.publish`), so a crash never leaves a half-written
model under the final name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path

import torch

from grasp_lightning.checkpointing import check_trainable_state, partial_path, publish, require_complete
from grasp_lightning.commands.model_card import GRASP_LICENSE, build_card, push_folder, run_folder
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.policy import LoraConfig, PolicyConfig, load_model, load_policy, load_processor, resolve_dtype
from grasp_lightning.quantization import dense_state_dict

log = logging.getLogger(__name__)

POLICY_PREFIX = "policy."


def load_checkpoint_state(ckpt_path: str | os.PathLike) -> dict:
    """The Lightning checkpoint dict (``state_dict``, ``global_step``, ...) of a ``.ckpt`` file or of a
    DeepSpeed checkpoint directory (consolidated to float32 on the CPU).

    Raises:
        GraspConfigError: missing path, incomplete directory, a file torch cannot read, or no ``state_dict`` in it.
    """
    path = Path(ckpt_path)
    require_complete(path)
    if path.is_dir():
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        with tempfile.TemporaryDirectory(prefix="grasp-export-") as tmp:
            checkpoint = convert_zero_checkpoint_to_fp32_state_dict(path, Path(tmp) / "fp32.ckpt")
    else:
        import pickle

        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:  # not a torch file at all
            raise GraspConfigError(f"{path}: not a Lightning checkpoint (torch.load cannot read it: "
                                   f"{type(e).__name__}); give a last.ckpt or a DeepSpeed checkpoint folder") from e
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise GraspConfigError(f"{path}: not a Lightning checkpoint (no 'state_dict')")
    return checkpoint


def policy_state_dict(checkpoint: dict, where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The policy's weights of a :class:`~grasp_lightning.module.GraspModule` checkpoint (``policy.``
    prefix removed).

    Raises:
        GraspConfigError: the checkpoint holds no ``policy.*`` weights.
    """
    state = {k[len(POLICY_PREFIX):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(POLICY_PREFIX)}
    if not state:
        keys = list(checkpoint["state_dict"])[:5]
        raise GraspConfigError(f"{where}: no '{POLICY_PREFIX}*' weights in its state_dict (first keys: {keys})")
    return state


def trained_model(state: dict[str, torch.Tensor], policy: PolicyConfig, lora: LoraConfig, *, merge_lora: bool,
                  dtype: str | None, where: str) -> torch.nn.Module:
    """The policy built as configured (the base from ``policy.name_or_path``) with the checkpoint's ``state``
    loaded, LoRA merged or kept, cast to ``dtype`` (see :func:`export_checkpoint`; QLoRA: the module docstring).

    Raises:
        GraspConfigError: ``state`` does not match the configured model: a full fine-tune's missing or
            unexpected keys; for LoRA and QLoRA, whose checkpoints hold the trainable weights only, a
            missing adapter or a name the model does not have.
    """
    build_cfg = dataclasses.replace(policy, gradient_checkpointing=False, dtype=dtype or policy.dtype)
    model = load_policy(build_cfg, lora)
    quantized = lora.enabled and lora.quantize is not None
    if lora.enabled:  # the trainable weights only: each adapter must be there; the base is name_or_path's
        check_trainable_state(state, model, f"export: {where}")
    result = model.load_state_dict(state, strict=False)
    if (result.missing_keys and not lora.enabled) or result.unexpected_keys:
        raise GraspConfigError(
            f"export: {where} does not match {policy.name_or_path} with lora.enabled={lora.enabled}: "
            f"missing {result.missing_keys[:5]} ({len(result.missing_keys)}), unexpected "
            f"{result.unexpected_keys[:5]} ({len(result.unexpected_keys)}); is --config the run's config?")
    if quantized and merge_lora:
        dense = dense_state_dict(model)
        model = load_model(policy.name_or_path, dtype=build_cfg.dtype, attn_implementation=policy.attn_implementation,
                           trust_remote_code=policy.trust_remote_code, revision=policy.revision)
        model.load_state_dict(dense, strict=True)
    elif lora.enabled and merge_lora:
        model = model.merge_and_unload()
    elif lora.enabled and Path(policy.name_or_path).is_dir():
        # adapter_config.json names its base model: an absolute path, so the adapter loads from any directory
        for adapter in model.peft_config.values():
            adapter.base_model_name_or_path = str(Path(policy.name_or_path).resolve())
    target = resolve_dtype(dtype or policy.dtype)
    if target != "auto" and quantized and not merge_lora:  # the 4-bit base is not saved: cast the adapters
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(target)
    elif target != "auto":
        model = model.to(target)
    return model


def export_checkpoint(ckpt_path: str | os.PathLike, out: str | os.PathLike, policy: PolicyConfig,
                      lora: LoraConfig | None = None, *, merge_lora: bool = True, dtype: str | None = None,
                      overwrite: bool = False, config: dict | None = None, license: str = GRASP_LICENSE,
                      run: Path | None = None, base_model: str | None = None) -> Path:
    """Write the policy of ``ckpt_path`` (and its processor) as a Hugging Face directory at ``out``.

    Args:
        ckpt_path: Lightning ``.ckpt`` file or DeepSpeed checkpoint directory of a GraspModule run.
        out: destination directory (written atomically).
        policy: the run's ``model.policy`` (base model, dtype, remote-code flag).
        lora: the run's ``model.lora``; when enabled the adapters are merged (``merge_lora``) or
            saved alone.
        merge_lora: merge LoRA adapters into the base weights (``merge_and_unload``).
        dtype: dtype of the saved weights (``float32``, ``bfloat16``, ``float16``); default: the
            policy's configured dtype (``auto`` keeps the loaded dtype).
        overwrite: replace an existing ``out``.
        config: the run's configuration as a dict; when given, ``README.md`` (the model card,
            :func:`grasp_lightning.commands.model_card.build_card`) is written beside the weights.
        license: the card's licence (Hub identifier); GRASP-trained weights: ``cc-by-nc-4.0``.
        run: the run folder whose ``bench/latest`` table the card shows; default: the checkpoint's
            (:func:`grasp_lightning.commands.model_card.run_folder`).
        base_model: the card's ``base_model`` (a Hub id); default: ``policy.name_or_path``, or the base an
            export there names.

    Returns:
        ``out`` as a ``Path``.

    Raises:
        GraspConfigError: ``out`` exists and ``overwrite`` is false; the checkpoint is incomplete or
            its weights do not match the configured model (missing/unexpected keys).
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise GraspConfigError(f"export: {out} exists; pass --overwrite true to replace it")
    lora = lora or LoraConfig()
    checkpoint = load_checkpoint_state(ckpt_path)
    state = policy_state_dict(checkpoint, str(ckpt_path))
    model = trained_model(state, policy, lora, merge_lora=merge_lora, dtype=dtype, where=str(ckpt_path))
    model.eval()
    processor = load_processor(policy.name_or_path, trust_remote_code=policy.trust_remote_code,
                               revision=policy.revision)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(out)
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        info = {"source_checkpoint": str(ckpt_path), "global_step": checkpoint.get("global_step"),
                "epoch": checkpoint.get("epoch"), "base_model": policy.name_or_path, "lora": lora.enabled,
                "lora_merged": bool(lora.enabled and merge_lora),
                "quantize": lora.quantize if lora.enabled else None, "dtype": str(dtype or policy.dtype)}
        (tmp / "export_info.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
        if config is not None:
            card = build_card(config, {**info, "out": str(out), "epoch": checkpoint.get("epoch")},
                              run=run or run_folder(ckpt_path), license=license, base_model=base_model)
            card.save(tmp / "README.md")
        publish(tmp, out)
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s -> %s (step %s, lora=%s, merged=%s)", ckpt_path, out, checkpoint.get("global_step"),
             lora.enabled, bool(lora.enabled and merge_lora))
    return out


def add_arguments(parser) -> None:
    """The command's own arguments, beside the run's configuration (``--ckpt_path`` is ``fit``'s)."""
    parser.add_argument("--out", type=str | None, default=None, help="Hugging Face directory to write")
    parser.add_argument("--merge_lora", type=bool, default=True, help="merge LoRA adapters (merge_and_unload)")
    parser.add_argument("--dtype", type=str | None, default=None, help="dtype of the saved weights")
    parser.add_argument("--overwrite", type=bool, default=False, help="replace an existing --out")
    parser.add_argument("--license", type=str, default=GRASP_LICENSE,
                        help="the model card's licence (GRASP-trained weights: cc-by-nc-4.0)")
    parser.add_argument("--base_model", type=str | None, default=None,
                        help="the model card's base_model: the Hub id of a base loaded from a local folder")
    parser.add_argument("--push_to_hub", type=str | None, default=None,
                        help="upload --out to this Hub model repository (needs a token and the network)")


def main(argv: list[str]) -> Path:
    """``python -m grasp_lightning export ...`` (arguments after ``export``; see the module docstring).

    The run's configuration is instantiated by the one config loader (so several ``--config`` files
    compose exactly as for ``fit``); the policy's weights are not loaded until the export.
    """
    from grasp_lightning.commands.config import load_run

    run = load_run(argv, arguments=add_arguments, prog="python -m grasp_lightning export")
    cfg = run.config
    if not cfg.get("ckpt_path") or not cfg.get("out"):
        raise GraspConfigError("export needs --ckpt_path <checkpoint> and --out <directory> (after --config)")
    out = export_checkpoint(cfg.ckpt_path, cfg.out, run.module.policy_cfg, run.module.lora_cfg,
                            merge_lora=cfg.merge_lora, dtype=cfg.dtype, overwrite=cfg.overwrite,
                            config=plain_config(cfg), license=cfg.license, base_model=cfg.base_model)
    if cfg.push_to_hub:
        log.info("uploaded %s: %s", out, push_folder(out, cfg.push_to_hub))
    return out


def plain_config(cfg) -> dict:
    """A parsed configuration (jsonargparse ``Namespace``) as plain dicts and lists (the model card's recipe)."""
    return json.loads(json.dumps(cfg.as_dict(), default=str))
