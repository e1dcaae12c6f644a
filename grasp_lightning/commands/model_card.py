"""The model card ``export`` writes beside the weights (``README.md``), and ``--push_to_hub``.

The card is written with ``huggingface_hub``'s :class:`~huggingface_hub.ModelCard` and
:class:`~huggingface_hub.ModelCardData`: a YAML metadata block the Hub reads (``base_model``, ``license``,
``library_name``, ``pipeline_tag``, ``tags``, ``datasets``), then the recipe and its settings (from the
run's configuration, as ``export`` was given it), the optimizer steps of the checkpoint, the run's last
evaluation table (``<run folder>/bench/latest/``, written by :mod:`grasp_lightning.callbacks.eval_reports`) when
there is one, and the code that loads the folder.

Licences: GRASP's data (``interlive/GRASP``) is CC BY-NC 4.0, so weights trained on it are marked
``cc-by-nc-4.0`` (``--license`` changes it for weights trained on other data); the base model keeps its
own licence (Qwen3-VL: Apache-2.0), which the card names beside it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from grasp_lightning.errors import GraspError

log = logging.getLogger(__name__)

#: The GRASP dataset on the Hugging Face Hub (``datasets`` of the card's metadata).
GRASP_DATASET = "interlive/GRASP"
#: The licence of GRASP's data, and so the default of weights trained on it.
GRASP_LICENSE = "cc-by-nc-4.0"
#: The Hub's task of Qwen3-VL / Qwen3.5 checkpoints (``AutoModelForImageTextToText``); video is a list of frames.
PIPELINE_TAG = "image-text-to-text"


class HubPushError(GraspError):
    """``--push_to_hub`` cannot upload: no token, offline mode, or the Hub is unreachable."""


def base_model_of(name_or_path: str) -> str:
    """The model a run started from, following exports: a folder written by ``export`` (its
    ``export_info.json``) names its own ``base_model``, e.g. SGR started from the SFT export names the
    SFT run's base. A Hub id or any other folder is returned as given."""
    seen = set()
    while name_or_path not in seen:
        seen.add(name_or_path)
        info = Path(name_or_path) / "export_info.json"
        if not info.is_file():
            break
        try:
            name_or_path = str(json.loads(info.read_text(encoding="utf-8"))["base_model"])
        except (ValueError, KeyError, TypeError):
            break
    return name_or_path


def run_folder(ckpt_path: str | os.PathLike) -> Path | None:
    """The run folder of a checkpoint: the first of its parents (up to three levels; a DeepSpeed
    checkpoint is a folder itself) holding the run's ``config.yaml``; ``None`` when none does."""
    path = Path(ckpt_path).resolve()
    for parent in list(path.parents)[:3]:
        if (parent / "config.yaml").is_file():
            return parent
    return None


def last_evaluation(folder: Path | None) -> tuple[int | None, str] | None:
    """The run's last evaluation: ``(step, tables)`` from ``<folder>/bench/latest/`` (``results.json``'s
    ``meta.step``, then ``table.md`` and each ``table_<suite>.md``, GRASP-Bench first); ``None`` when the
    run has none."""
    latest = folder / "bench" / "latest" if folder is not None else None
    if latest is None or not latest.is_dir():
        return None
    tables = sorted(latest.glob("table*.md"), key=lambda p: (p.name != "table.md", p.name))
    if not tables:
        return None
    step = None
    results = latest / "results.json"
    if results.is_file():
        try:
            step = json.loads(results.read_text(encoding="utf-8")).get("meta", {}).get("step")
        except ValueError:
            step = None
    return step, "\n\n".join(p.read_text(encoding="utf-8").strip() for p in tables)


def _flat(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """``value`` as ``(dotted key, leaf)`` pairs, ``None`` leaves left out."""
    if isinstance(value, dict):
        return [pair for key, sub in value.items() for pair in _flat(f"{prefix}.{key}" if prefix else key, sub)]
    return [] if value is None else [(prefix, value)]


def _short(value: Any) -> str:
    """A setting as the card shows it: lists joined in full, other values longer than 80 characters cut."""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def recipe_settings(config: dict) -> tuple[str, list[tuple[str, Any]]]:
    """The task's class path and the settings the card lists (dotted config keys, ``None`` left out):
    the task's own (loss, rewards, advantage, batching), the rollout's K and budget, LoRA, the optimizer,
    the data and the trainer's sizes.

    Args:
        config: the run's configuration as a dict (the run's ``config.yaml``).
    """
    model = config.get("model") or {}
    task = model.get("task") or {}
    task_class = task.get("class_path", "?") if isinstance(task, dict) else str(task)
    rows = _flat("model.task", task.get("init_args") if isinstance(task, dict) else None)
    if "GRPO" in task_class or model.get("rollout", {}).get("num_generations") and "SFT" not in task_class:
        rollout = model.get("rollout") or {}
        rows += [(f"model.rollout.{k}", rollout[k]) for k in ("num_generations", "max_new_tokens", "temperature",
                                                              "top_p", "engine") if rollout.get(k) is not None]
    lora = model.get("lora") or {}
    rows += [("model.lora.enabled", bool(lora.get("enabled")))]
    if lora.get("enabled"):
        rows += [(f"model.lora.{k}", lora[k]) for k in ("r", "alpha", "dropout", "target_modules", "quantize")
                 if lora.get(k) is not None]
    policy = model.get("policy") or {}
    rows += [(f"model.policy.{k}", policy[k]) for k in ("dtype", "freeze_vision") if policy.get(k) is not None]
    rows += _flat("model.optim", model.get("optim"))
    data = config.get("data") or {}
    source = data.get("source") or {}
    rows += [(f"data.source.{k}", source[k]) for k in ("root", "train_file", "bench") if source.get(k) is not None]
    rows += _flat("data.video", data.get("video"))
    loader = data.get("loader") or {}
    rows += [(f"data.loader.{k}", loader[k]) for k in ("batch_size", "curriculum") if loader.get(k) is not None]
    trainer = config.get("trainer") or {}
    rows += [(f"trainer.{k}", trainer[k]) for k in ("max_steps", "max_epochs", "accumulate_grad_batches", "devices",
                                                   "num_nodes", "precision") if trainer.get(k) is not None]
    return task_class, rows


def build_card(config: dict, info: dict, *, run: Path | None, license: str = GRASP_LICENSE,
               datasets: list[str] | None = None, base_model: str | None = None):
    """The :class:`~huggingface_hub.ModelCard` of an export.

    Args:
        config: the run's configuration as a dict (see :func:`recipe_settings`).
        info: the export's ``export_info.json`` (``global_step``, ``base_model``, ``lora``, ``lora_merged``, ...).
        run: the run folder (its ``bench/latest/`` evaluation), or ``None``.
        license: the weights' licence (Hub identifier); GRASP-trained weights: ``cc-by-nc-4.0``.
        datasets: the Hub datasets it was trained on; default ``[interlive/GRASP]``.
        base_model: the card's ``base_model``; default: ``info["base_model"]`` through :func:`base_model_of`.
    """
    from huggingface_hub import ModelCard, ModelCardData

    task_class, rows = recipe_settings(config)
    task_name = task_class.rsplit(".", 1)[-1]
    adapter = bool(info.get("lora")) and not info.get("lora_merged")
    base = base_model or base_model_of(str(info.get("base_model")))
    kind = "grpo" if "GRPO" in task_name else "sft" if "SFT" in task_name else task_name.lower()
    tags = ["grasp", "grasp-lightning", "video", "social-reasoning", kind] + (["lora"] if info.get("lora") else [])
    data = ModelCardData(base_model=base, license=license, library_name="peft" if adapter else "transformers",
                         pipeline_tag=PIPELINE_TAG, tags=tags, datasets=datasets or [GRASP_DATASET])
    if Path(str(base)).exists() or str(base).startswith((".", "/")) or str(base).count("/") != 1:
        log.warning("the model card's base_model %r is not a Hugging Face Hub id (owner/name): the Hub will not "
                    "link it; give export --base_model OWNER/NAME", base)
    step = info.get("global_step")
    lines = [
        f"# {Path(str(base)).name}, trained with grasp_lightning ({task_name})",
        "",
        f"A {task_name} run of grasp_lightning on `{base}`, exported from "
        f"`{info.get('source_checkpoint')}` after **{step} optimizer steps** (`global_step` {step}, epoch "
        f"{info.get('epoch')}).",
        "",
        "## Licence",
        "",
        f"These weights are released under `{license}`: GRASP's data (`{GRASP_DATASET}`) is CC BY-NC 4.0 "
        f"(non-commercial use). The base model (`{base}`) keeps its own licence, which applies too "
        "(Qwen3-VL and Qwen3.5: Apache-2.0).",
        "",
        "## Recipe",
        "",
        f"- Task: `{task_class}`",
        f"- Training steps: {step}",
        f"- Weights: {'LoRA adapter only (load onto the base)' if adapter else 'LoRA merged into the base' if info.get('lora') else 'full fine-tune'}"
        f", dtype `{info.get('dtype')}`",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| `{key}` | `{_short(value)}` |" for key, value in rows],
        "",
    ]
    evaluation = last_evaluation(run)
    if evaluation is not None:
        eval_step, tables = evaluation
        lines += ["## Evaluation", "", f"The run's last evaluation (step {eval_step}, `bench/latest/` of the run "
                  "folder; greedy decoding):", "", tables, ""]
    loader = "PeftModel.from_pretrained(base, path)" if adapter else "AutoModelForImageTextToText.from_pretrained(path)"
    lines += ["## Loading", "", "```python", "from transformers import AutoModelForImageTextToText, AutoProcessor",
              ""]
    if adapter:
        lines += ["from peft import PeftModel", "", 'path = "."  # this folder, or its Hub id',
                  f'base = AutoModelForImageTextToText.from_pretrained("{base}", dtype="auto")',
                  f"model = {loader}", "processor = AutoProcessor.from_pretrained(path)"]
    else:
        lines += ['path = "."  # this folder, or its Hub id',
                  'model = AutoModelForImageTextToText.from_pretrained(path, dtype="auto")',
                  "processor = AutoProcessor.from_pretrained(path)"]
    lines += ["```", "", "With grasp_lightning: `python -m grasp_lightning validate --config configs/sgr.yaml "
              "--model.policy.name_or_path PATH` (GRASP-Bench), or `predict` on your own questions.", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def push_folder(folder: str | os.PathLike, repo_id: str, *, endpoint: str | None = None) -> str:
    """Upload ``folder`` to the Hub model repository ``repo_id`` (created private when missing).

    Returns:
        The URL of the commit.

    Raises:
        HubPushError: one line saying why not: ``HF_HUB_OFFLINE`` set, no token (``HF_TOKEN`` /
            ``hf auth login``), or the Hub unreachable (the connection's error).
    """
    import huggingface_hub
    from huggingface_hub import HfApi, constants

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in constants.ENV_VARS_TRUE_VALUES
    if offline or huggingface_hub.is_offline_mode():
        raise HubPushError(f"--push_to_hub {repo_id}: not uploaded: HF_HUB_OFFLINE is set (offline mode); "
                           f"unset it and run again, or upload {folder} later with `hf upload {repo_id} {folder}`")
    token = os.environ.get("HF_TOKEN") or huggingface_hub.get_token()
    if not token:
        raise HubPushError(f"--push_to_hub {repo_id}: not uploaded: no Hugging Face token (set HF_TOKEN or run "
                           "`hf auth login`)")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, repo_type="model", private=True, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                                   commit_message="Upload grasp_lightning export")
    except (OSError, huggingface_hub.errors.HfHubHTTPError) as e:  # httpx/requests connection errors are OSErrors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HubPushError(f"--push_to_hub {repo_id}: not uploaded: the Hub ({api.endpoint}) answered or "
                           f"could not be reached: {type(e).__name__}: {reason}") from e
    except Exception as e:  # httpx.ConnectError is not an OSError
        if not type(e).__module__.startswith(("httpx", "httpcore", "requests", "urllib3")):
            raise
        raise HubPushError(f"--push_to_hub {repo_id}: not uploaded: network unreachable ({api.endpoint}): "
                           f"{type(e).__name__}: {e}") from e
    return str(getattr(commit, "commit_url", commit))
