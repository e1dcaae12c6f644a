"""The models the planner knows: published Qwen3-VL and Qwen3.5 shapes, parameters counted on the meta device, LoRA.

A plan needs the exact parameter count of the policy, of its vision tower and of the Linears LoRA
wraps. :func:`architecture_config` builds a ``transformers`` config locally (a model directory's
``config.json``, or the published shapes in ``assets/qwen3vl-architectures.json`` and
``assets/qwen3_5-architectures.json``), and :func:`count_parameters` builds the model on the meta
device and counts (no weights, no network).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.policy import vision_modules

ASSETS = Path(__file__).resolve().parent.parent / "assets"
#: The published shapes by family: Qwen3-VL (``Qwen3VLConfig``) and Qwen3.5 (``Qwen3_5Config``).
ARCHITECTURE_FILES = {"qwen3_vl": ASSETS / "qwen3vl-architectures.json",
                      "qwen3_5": ASSETS / "qwen3_5-architectures.json"}
#: The GRASP paper's model; used when a config names a checkpoint that is not on this machine.
DEFAULT_ARCHITECTURE = "Qwen3-VL-8B-Instruct"
#: Checkpoint variants that share the bundled Qwen3-VL Instruct shapes.
QWEN3VL_VARIANTS = ("Instruct", "Thinking")

_TEXT_COMMON = {"head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                "vocab_size": 151936, "pad_token_id": 151643,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                                    "mrope_interleaved": True}}
_VISION_COMMON = {"patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                  "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh"}
_TOKEN_IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
              "vision_end_token_id": 151653}
#: Qwen3.5's common values (``_about`` of ``assets/qwen3_5-architectures.json``).
_TEXT_COMMON_35 = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                   "vocab_size": 248320, "pad_token_id": 248044, "eos_token_id": 248046}
_TOKEN_IDS_35 = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
                 "vision_end_token_id": 248054}
#: Keys of a Qwen3.5 text entry that ``transformers`` reads from ``rope_parameters``.
_ROPE_KEYS_35 = ("rope_theta", "mrope_section", "partial_rotary_factor")


def format_count(n: int) -> str:
    """A parameter count as 8.767B, 17.4M or 190.5K."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.{3 if unit == 'B' else 1}f}{unit}"
    return str(n)


def _bundled() -> dict[str, tuple[str, dict]]:
    """``name -> (family, shapes)`` of every bundled architecture (the files are read each call)."""
    found: dict[str, tuple[str, dict]] = {}
    for family, path in ARCHITECTURE_FILES.items():
        data = json.loads(path.read_text())
        found.update({name: (family, arch) for name, arch in data.items() if not name.startswith("_")})
    return found


def bundled_architectures() -> dict[str, dict]:
    """The published shapes shipped in ``assets/*-architectures.json``, by name (``Qwen3-VL-8B-Instruct``,
    ``Qwen3.5-9B``, ...)."""
    return {name: arch for name, (_, arch) in _bundled().items()}


def known_model_names() -> list[str]:
    """Every model name the planner knows without a local checkpoint: each Qwen3-VL size as Instruct and
    Thinking (one shape), and each Qwen3.5 name; a Hub id (``Qwen/...``) of any of them works too."""
    names = []
    for name, (family, _) in _bundled().items():
        if family == "qwen3_vl" and name.endswith("-Instruct"):
            names += [name.removesuffix("Instruct") + variant for variant in QWEN3VL_VARIANTS]
        else:
            names.append(name)
    return sorted(names)


def bundled_name(name: str) -> str | None:
    """The bundled architecture a name or Hub id stands for, by its basename, or ``None``.

    Qwen3-VL: ``Qwen/Qwen3-VL-8B-Instruct``, ``Qwen3-VL-8B-Thinking`` or ``8B`` (Thinking variants
    share the Instruct shapes). Qwen3.5: the name itself, any case (``Qwen/Qwen3.5-9B``).
    """
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    bundled = _bundled()
    match = re.fullmatch(r"(?:qwen3-vl-)?(\d+)b(?:-(?:instruct|thinking))?", base)
    if match:
        key = f"Qwen3-VL-{match.group(1)}B-Instruct"
        return key if key in bundled else None
    return next((key for key, (family, _) in bundled.items() if family != "qwen3_vl" and key.lower() == base), None)


def _qwen3vl_config(arch: dict):
    from transformers import Qwen3VLConfig

    config = Qwen3VLConfig(text_config={**_TEXT_COMMON, **arch["text"]},
                           vision_config={**_VISION_COMMON, **arch["vision"]},
                           tie_word_embeddings=arch["tie_word_embeddings"], **_TOKEN_IDS)
    config.eos_token_id, config.pad_token_id = 151645, 151643
    return config


def _qwen3_5_config(arch: dict):
    """A ``Qwen3_5Config``: the entry's rope keys go to ``rope_parameters`` (M-RoPE, interleaved), and
    ``full_attention_interval`` makes ``layer_types`` (every 4th layer full attention)."""
    from transformers import Qwen3_5Config

    text = {key: value for key, value in arch["text"].items() if key not in _ROPE_KEYS_35}
    rope = {"rope_type": "default", "mrope_interleaved": True,
            **{key: arch["text"][key] for key in _ROPE_KEYS_35 if key in arch["text"]}}
    if "rope_theta" in rope:
        rope["rope_theta"] = float(rope["rope_theta"])
    config = Qwen3_5Config(text_config={**_TEXT_COMMON_35, **text, "rope_parameters": rope},
                           vision_config={**_VISION_COMMON, **arch["vision"]},
                           tie_word_embeddings=arch["tie_word_embeddings"], **_TOKEN_IDS_35)
    config.eos_token_id, config.pad_token_id = _TEXT_COMMON_35["eos_token_id"], _TEXT_COMMON_35["pad_token_id"]
    return config


def architecture_config(name: str):
    """A ``transformers`` config for a model, built locally (no network).

    Args:
        name: a local model directory (its ``config.json`` is read with ``AutoConfig``), or a
            bundled name or Hub id (:func:`known_model_names`: ``Qwen3-VL-2B-Instruct``,
            ``Qwen/Qwen3-VL-8B-Thinking``, ``Qwen/Qwen3.5-9B``).

    Returns:
        a ``Qwen3VLConfig`` or ``Qwen3_5Config`` (``name_or_path`` the bundled name), or the directory's.

    Raises:
        GraspConfigError: neither a directory with ``config.json`` nor a bundled architecture.
    """
    path = Path(name)
    if (path / "config.json").is_file():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path)
    key = bundled_name(name)
    if key is None:
        raise GraspConfigError(f"model {name!r}: no config.json there, and its basename is none of the known "
                               f"models {known_model_names()}")
    family, arch = _bundled()[key]
    config = _qwen3_5_config(arch) if family == "qwen3_5" else _qwen3vl_config(arch)
    config.name_or_path = key
    return config


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a model counted on the meta device (a tied embedding counts once).

    Attributes:
        total: all parameters.
        vision: the vision tower with its mergers (``model.visual``).
        linears: ``(qualified name, in_features, out_features)`` of every ``nn.Linear``, for LoRA.
    """

    total: int
    vision: int
    linears: tuple[tuple[str, int, int], ...]

    @property
    def language(self) -> int:
        """The language model: embeddings, decoder layers, final norm and (untied) LM head."""
        return self.total - self.vision


_COUNTS: dict[str, ParamCounts] = {}


def count_parameters(config) -> ParamCounts:
    """Build ``AutoModelForImageTextToText.from_config(config)`` on the meta device and count (cached)."""
    key = config.to_json_string(use_diff=False)
    if key not in _COUNTS:
        from transformers import AutoModelForImageTextToText

        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        vision = sum(p.numel() for tower in vision_modules(model) for p in tower.parameters())
        linears = tuple((n, m.in_features, m.out_features) for n, m in model.named_modules()
                        if isinstance(m, nn.Linear))
        _COUNTS[key] = ParamCounts(sum(p.numel() for p in model.parameters()), vision, linears)
    return _COUNTS[key]


def lora_targets(counts: ParamCounts, target_modules: list[str] | str) -> list[tuple[str, int, int]]:
    """The Linears peft wraps: a string is a regex matched against the whole module name
    (``re.fullmatch``); a list matches a name equal to an entry or ending in ``.entry``
    (peft ``check_target_module_exists``)."""
    if isinstance(target_modules, str):
        return [lin for lin in counts.linears if re.fullmatch(target_modules, lin[0])]
    return [lin for lin in counts.linears if lin[0] in target_modules
            or any(lin[0].endswith(f".{t}") for t in target_modules)]


def lora_parameters(counts: ParamCounts, r: int, target_modules: list[str] | str) -> int:
    """Adapter parameters of rank ``r``: ``r x (in + out)`` per wrapped Linear (A is r x in, B is out x r)."""
    return sum(r * (fan_in + fan_out) for _, fan_in, fan_out in lora_targets(counts, target_modules))

