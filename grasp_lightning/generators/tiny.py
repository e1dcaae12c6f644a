"""An offline tiny Qwen3-VL: random weights, a locally trained tokenizer, a real processor.

No pretrained weights can be downloaded on CI machines, so the demo and the tests use a model
built here from a ``Qwen3VLConfig``, with a byte-level BPE tokenizer trained on GRASP-style text,
a ``Qwen3VLVideoProcessor`` with a small patch size and a Qwen-style chat template. It is written
with ``save_pretrained`` and loaded back by :func:`grasp_lightning.policy.load_policy` through
``AutoModelForImageTextToText.from_pretrained`` / ``AutoProcessor.from_pretrained`` — the same
path as a real checkpoint (Qwen3-VL as transformers 5.x implements it).

Command line: ``python -m grasp_lightning.generators.tiny OUT_DIR [--seed N]``; with ``--like
Qwen3-VL-2B-Instruct`` (or another checkpoint name) it writes a stand-in of that real checkpoint
instead (:mod:`grasp_lightning.generators.standin`: real widths, vocabulary, templates; a few layers).
"""

from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path
from typing import Sequence

import torch

from grasp_lightning.data.formats import lettered
from grasp_lightning.data.prompts import CHAT_TOKENS, INSTRUCTION, VISION_TOKENS

log = logging.getLogger(__name__)

#: Special tokens of the Qwen chat format, in the order they are appended to the BPE vocabulary.
SPECIAL_TOKENS: tuple[str, ...] = (*CHAT_TOKENS, *VISION_TOKENS)

#: A Qwen-style chat template (our own): system / user / assistant turns between
#: ``<|im_start|>`` and ``<|im_end|>``; a video content part renders as
#: ``<|vision_start|><|video_pad|><|vision_end|>`` that the processor expands per frame.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus(seed: int) -> list[str]:
    """GRASP-style text used to train the tokenizer (questions, options, tagged reasoning)."""
    rng = random.Random(seed)
    people = [f"Person {i}" for i in range(8)] + [f"P{i}" for i in range(8)]
    verbs = ["looks at", "points at", "gives an object to", "shows an object to", "reaches toward",
             "follows the gaze of", "makes eye contact with", "gestures toward", "turns to"]
    questions = [
        "Who is {a} looking at between {t0}s and {t1}s?", "Whose gaze does {a} follow?",
        "Which gesture does {a} make toward {b}?", "Do {a} and {b} share mutual gaze?",
        "How many times does {a} point at {b}?", "Who responds to the gesture of {a}?",
        "What happens after {a} {v} {b}?", "Which person does {a} attend to first?",
    ]
    lines = [
        "Answer the multiple-choice question with only the option letter inside <answer> tags.",
        INSTRUCTION,
        "pointing giving showing reaching mutual gaze joint attention gaze following attention "
        "capture sudden gaze shift No one None of them seconds red green blue yellow square",
    ]
    for _ in range(600):
        a, b = rng.sample(people, 2)
        v = rng.choice(verbs)
        t0 = rng.randint(0, 20) / 2
        q = rng.choice(questions).format(a=a, b=b, v=v, t0=t0, t1=t0 + rng.randint(1, 6) / 2)
        opts = "\n".join(lettered(rng.sample(people, 4)))
        ans = rng.choice("ABCD")
        lines.append(f"{q}\n{opts}")
        lines.append(
            f"<think> <gaze>{a} {v} {b}.</gaze> <gesture>{b} {rng.choice(verbs)} {a}.</gesture> "
            f"So the answer is {ans}. </think><answer>{ans}</answer>"
        )
    lines += [f"<{t / 10:.1f} seconds>" for t in range(0, 400, 5)]
    return lines


def build_tokenizer(vocab_size: int = 1024, seed: int = 0, corpus: Sequence[str] = ()):
    """Train a byte-level BPE on GRASP-style text and wrap it as a ``Qwen2Tokenizer``.

    Args:
        vocab_size: size of the BPE vocabulary before the special tokens are appended.
        seed: seed of the training corpus; the same seed gives the same tokenizer.
        corpus: more training lines (e.g. a dataset's own prompts, so its words become single tokens).

    Returns:
        ``transformers.Qwen2Tokenizer`` with the Qwen vision special tokens, ``<|im_end|>`` as EOS
        and ``<|endoftext|>`` as padding.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_corpus(seed) + list(corpus), trainer=trainer)
    state = bpe.model.__getstate__()
    import json

    model_json = json.loads(state)
    vocab: dict[str, int] = model_json["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]
    for tok in SPECIAL_TOKENS:
        vocab.setdefault(tok, len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen3vl(
    out_dir: str | Path,
    *,
    seed: int = 0,
    text_hidden_size: int = 64,
    text_layers: int = 2,
    text_heads: int = 4,
    vision_hidden_size: int = 32,
    vision_depth: int = 2,
    patch_size: int = 8,
    vocab_size: int = 1024,
    max_video_pixels: int = 64 * 64 * 16,
    corpus: Sequence[str] = (),
) -> Path:
    """Build a random-initialised tiny Qwen3-VL with its processor and save it to ``out_dir``.

    Args:
        out_dir: directory to write (``config.json``, ``model.safetensors``, tokenizer and
            processor files); created if missing.
        seed: seeds the tokenizer corpus and ``torch.manual_seed`` for the weights.
        text_hidden_size: width of the language model; the head dim is ``hidden / heads``.
        text_layers: decoder layers of the language model.
        text_heads: attention heads (and key/value heads) of the language model.
        vision_hidden_size: width of the vision tower.
        vision_depth: blocks of the vision tower.
        patch_size: spatial patch size in pixels (temporal patch 2, merge 2 as in Qwen3-VL).
        vocab_size: BPE vocabulary size before special tokens.
        max_video_pixels: the video processor's pixel budget summed over all frames of a clip.
        corpus: more tokenizer training lines (:func:`build_tokenizer`).

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        ValueError: if ``text_hidden_size`` is not divisible by ``4 * text_heads`` (the M-RoPE
            sections must sum to half the head dim).
    """
    from transformers import (
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    head_dim = text_hidden_size // text_heads
    if text_hidden_size % text_heads or head_dim % 2:
        raise ValueError(f"text_hidden_size {text_hidden_size} must be a multiple of 2 * text_heads {text_heads}")
    half = head_dim // 2
    mrope = [half - 2 * (half // 3), half // 3, half // 3]  # sums to head_dim / 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=vocab_size, seed=seed, corpus=corpus)
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=text_hidden_size,
            intermediate_size=text_hidden_size * 2,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=text_heads,
            head_dim=head_dim,
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": mrope, "mrope_interleaved": True},
            pad_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
        ),
        vision_config=dict(
            depth=vision_depth,
            hidden_size=vision_hidden_size,
            intermediate_size=vision_hidden_size * 2,
            num_heads=max(1, vision_hidden_size // 16),
            patch_size=patch_size,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=text_hidden_size,
            num_position_embeddings=256,
            deepstack_visual_indexes=[vision_depth - 1],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    video_processor = Qwen3VLVideoProcessor(
        patch_size=patch_size,
        temporal_patch_size=2,
        merge_size=2,
        size={"shortest_edge": (2 * patch_size) ** 2 * 2, "longest_edge": max_video_pixels},
        fps=2,
    )
    image_processor = Qwen2VLImageProcessor(
        patch_size=patch_size, temporal_patch_size=2, merge_size=2,
        size={"shortest_edge": (2 * patch_size) ** 2, "longest_edge": 64 * 64},
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    log.info("tiny Qwen3-VL (%d parameters) written to %s", sum(p.numel() for p in model.parameters()), out)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line entry: ``python -m grasp_lightning.generators.tiny OUT_DIR [--like NAME --text-layers N --vision-layers N]``."""
    parser = argparse.ArgumentParser(prog="python -m grasp_lightning build-model", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--like", default=None,
                        help="build a stand-in of this checkpoint, e.g. Qwen3-VL-2B-Instruct or Qwen3-VL-8B-Thinking")
    parser.add_argument("--text-layers", type=int, default=None,
                        help="language-model layers (default: 2; the tiny model's too)")
    parser.add_argument("--vision-layers", type=int, default=None,
                        help="vision-tower blocks (default: 2; the tiny model's too)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="stand-in weight dtype")
    parser.add_argument("--overwrite", action="store_true", help="write into an OUT_DIR that already holds files")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    for flag, value in (("--text-layers", args.text_layers), ("--vision-layers", args.vision_layers)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    out = Path(args.out_dir)
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        parser.error(f"{out} already holds files (a checkpoint?); pass --overwrite to write the model into it")
    text_layers, vision_layers = args.text_layers or 2, args.vision_layers or 2
    if args.like is None:
        build_tiny_qwen3vl(out, seed=args.seed, text_layers=text_layers, vision_depth=vision_layers)
        return
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.generators.standin import build_standin, parse_like, standin_config

    try:  # a bad name or layer count is a usage error, reported before anything is built or written
        parse_like(args.like)
        standin_config(args.like, text_layers=text_layers, vision_layers=vision_layers)
        build_standin(out, args.like, text_layers=text_layers, vision_layers=vision_layers, dtype=args.dtype,
                      seed=args.seed)
    except GraspConfigError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
