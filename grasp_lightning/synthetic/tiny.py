"""Offline tiny Qwen3-VL and Qwen3.5 models: random weights, a locally trained tokenizer, a real processor.

No pretrained weights can be downloaded on CI machines, so the demo and the tests use models
built here: a ``Qwen3VLConfig`` (:func:`build_tiny_qwen3vl`) or a hybrid ``Qwen3_5Config``
(:func:`build_tiny_qwen3_5`: Gated DeltaNet linear-attention layers and full-attention layers, as
``layer_types`` writes them), each with a byte-level BPE tokenizer trained on GRASP-style text, a
``Qwen3VLVideoProcessor`` with a small patch size and a Qwen-style chat template. They are written
with ``save_pretrained`` and loaded back by :func:`grasp_lightning.policy.load_policy` through
``AutoModelForImageTextToText.from_pretrained`` / ``AutoProcessor.from_pretrained`` — the same
path as a real checkpoint (Qwen3-VL and Qwen3.5 as transformers 5.x implements them).

Command line: ``python -m grasp_lightning.synthetic.tiny OUT_DIR [--family qwen3_5] [--seed N]``;
with ``--like Qwen3-VL-2B-Instruct`` (or ``Qwen3.5-9B``, or another checkpoint name) it writes a
stand-in of that real checkpoint instead (:mod:`grasp_lightning.synthetic.standin`: real widths,
vocabulary, templates; a few layers).
"""

from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path
from typing import Sequence

import torch

from grasp_lightning.data.formats import lettered
from grasp_lightning.data.prompts import CHAT_TOKENS, INSTRUCTION, VISION_TOKENS, vision_token_config

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


def build_tokenizer(vocab_size: int = 1024, seed: int = 0, corpus: Sequence[str] = (), *, family: str = "qwen3_vl"):
    """Train a byte-level BPE on GRASP-style text and wrap it as the family's tokenizer class.

    Args:
        vocab_size: size of the BPE vocabulary before the special tokens are appended.
        seed: seed of the training corpus; the same seed gives the same tokenizer.
        corpus: more training lines (e.g. a dataset's own prompts, so its words become single tokens).
        family: ``qwen3_vl`` (``Qwen2Tokenizer``, as Qwen3-VL checkpoints) or ``qwen3_5``
            (``Qwen3_5Tokenizer``: Qwen3.5's own class, NFC normalisation and its split pattern).

    Returns:
        The tokenizer with the Qwen vision special tokens, ``<|im_end|>`` as EOS and
        ``<|endoftext|>`` as padding.

    Raises:
        ValueError: unknown ``family``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    classes = {"qwen3_vl": Qwen2Tokenizer, "qwen3_5": Qwen3_5Tokenizer}
    if family not in classes:
        raise ValueError(f"family must be one of {sorted(classes)}, got {family!r}")

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
    tokenizer = classes[family](
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
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

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
        **vision_token_config(ids),
        tie_word_embeddings=True,
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)
    _tiny_processor(tokenizer, patch_size, max_video_pixels).save_pretrained(out)
    log.info("tiny Qwen3-VL (%d parameters) written to %s", sum(p.numel() for p in model.parameters()), out)
    return out


def _tiny_processor(tokenizer, patch_size: int, max_video_pixels: int):
    """The tiny models' ``Qwen3VLProcessor`` (Qwen3.5 reuses it): patch ``patch_size``, 2 fps."""
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

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
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
                            chat_template=CHAT_TEMPLATE)


def build_tiny_qwen3_5(
    out_dir: str | Path,
    *,
    seed: int = 0,
    text_hidden_size: int = 64,
    text_layers: int = 4,
    full_attention_interval: int = 4,
    text_heads: int = 4,
    vision_hidden_size: int = 32,
    vision_depth: int = 2,
    patch_size: int = 8,
    vocab_size: int = 1024,
    max_video_pixels: int = 64 * 64 * 16,
    corpus: Sequence[str] = (),
) -> Path:
    """Build a random-initialised tiny hybrid Qwen3.5 with its processor and save it to ``out_dir``.

    The text model keeps Qwen3.5's structure at a small width: every ``full_attention_interval``-th
    decoder layer is gated full attention (2 key/value heads, partial rotary 0.25 with interleaved
    M-RoPE), the others Gated DeltaNet linear attention (2 key heads, 4 value heads of 8 dims, a
    4-tap causal convolution), so ``layer_types`` holds both kinds (default 3 linear + 1 full, the
    published 3:1 pattern). The vision tower is Qwen3.5's (no DeepStack mergers), the tokenizer is
    ``Qwen3_5Tokenizer`` over the tiny BPE, the processor Qwen3.5's ``Qwen3VLProcessor``. The
    linear-attention decay rates ``A = exp(A_log)`` are drawn from [0.001, 0.05] per head instead of
    transformers' initial [0.01, 16]: with rates up to 16 the state decays by up to ``e^-16`` per
    token and forgets the prompt within a few tokens, so the state the shared prefill hands to the
    completions would be the same for every prompt and the tests of it would prove little.

    Args:
        out_dir: directory to write; created if missing.
        seed: seeds the tokenizer corpus and ``torch.manual_seed`` for the weights.
        text_hidden_size: width of the language model; attention head dim ``hidden / heads``.
        text_layers: decoder layers of the language model.
        full_attention_interval: every this-many-th layer is full attention (Qwen3.5: 4).
        text_heads: query heads of the full-attention layers (key/value heads: half of them).
        vision_hidden_size: width of the vision tower.
        vision_depth: blocks of the vision tower.
        patch_size: spatial patch size in pixels (temporal patch 2, merge 2 as in Qwen3.5).
        vocab_size: BPE vocabulary size before special tokens.
        max_video_pixels: the video processor's pixel budget summed over all frames of a clip.
        corpus: more tokenizer training lines (:func:`build_tokenizer`).

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        ValueError: the layer pattern has no linear-attention or no full-attention layer, or the
            head dim cannot carry the rotary sections (``hidden / heads`` a multiple of 16).
    """
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    kinds = {(i + 1) % full_attention_interval == 0 for i in range(text_layers)}
    if kinds != {True, False}:
        raise ValueError(f"{text_layers} layers with full_attention_interval {full_attention_interval} do not hold "
                         "both a linear-attention and a full-attention layer")
    head_dim = text_hidden_size // text_heads
    if text_hidden_size % text_heads or head_dim % 16:
        raise ValueError(f"text_hidden_size {text_hidden_size} / text_heads {text_heads} must be a multiple of 16")
    rotary_half = head_dim // 8  # partial_rotary_factor 0.25: the rotary dims are head_dim / 4, sections sum to half
    mrope = [rotary_half - 2 * (rotary_half // 3), rotary_half // 3, rotary_half // 3]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=vocab_size, seed=seed, corpus=corpus, family="qwen3_5")
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    config = Qwen3_5Config(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=text_hidden_size,
            intermediate_size=text_hidden_size * 2,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=max(1, text_heads // 2),
            head_dim=head_dim,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            full_attention_interval=full_attention_interval,
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope,
                             "mrope_interleaved": True, "partial_rotary_factor": 0.25},
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
        ),
        **vision_token_config(ids),
        tie_word_embeddings=True,
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    with torch.no_grad():  # slow decays, so the recurrent state carries the prompt (see the docstring)
        for layer in model.model.language_model.layers:
            if hasattr(layer, "linear_attn"):
                rates = torch.empty_like(layer.linear_attn.A_log).uniform_(1e-3, 5e-2)
                layer.linear_attn.A_log.copy_(rates.log())
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)
    _tiny_processor(tokenizer, patch_size, max_video_pixels).save_pretrained(out)
    log.info("tiny Qwen3.5 (%d parameters, layers %s) written to %s", sum(p.numel() for p in model.parameters()),
             config.text_config.layer_types, out)
    return out


#: The tiny builders by model family (``--family``).
TINY_BUILDERS = {"qwen3_vl": build_tiny_qwen3vl, "qwen3_5": build_tiny_qwen3_5}


def main(argv: list[str] | None = None) -> None:
    """Command line entry: ``python -m grasp_lightning.synthetic.tiny OUT_DIR [--like NAME --text-layers N --vision-layers N]``."""
    from grasp_lightning.synthetic.standin import checkpoint_names

    parser = argparse.ArgumentParser(prog="python -m grasp_lightning build-model", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", default=None, choices=sorted(TINY_BUILDERS),
                        help="tiny model family (not with --like): qwen3_vl (default), or qwen3_5 (hybrid linear "
                             "attention)")
    parser.add_argument("--like", default=None,
                        help=f"build a stand-in of this checkpoint: {', '.join(checkpoint_names())} "
                             "(a Qwen/ prefix is accepted)")
    parser.add_argument("--text-layers", type=int, default=None,
                        help="language-model layers (default: 2; the tiny Qwen3-VL's too; the tiny Qwen3.5 and a "
                             "Qwen3.5 stand-in: 4, i.e. 3 linear-attention + 1 full-attention layers)")
    parser.add_argument("--vision-layers", type=int, default=None,
                        help="vision-tower blocks (default: 2; the tiny model's too)")
    parser.add_argument("--text-heads", type=int, default=None,
                        help="the tiny Qwen3-VL's attention heads (default 4: head dim 16; 2 gives head dim 32, "
                             "the least vLLM's CPU attention takes)")
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
    if args.text_heads is not None and (args.like is not None or args.family == "qwen3_5" or args.text_heads not in (1, 2, 4)):
        parser.error(f"--text-heads {args.text_heads}: the tiny Qwen3-VL takes 1, 2 or 4 (hidden 64; head dim 64, 32, 16)")
    if args.like is not None and args.family is not None:
        parser.error(f"--family {args.family} builds a tiny model; --like {args.like} a stand-in: give one of them")
    text_layers, vision_layers = args.text_layers or 2, args.vision_layers or 2
    if args.like is None:
        if args.family == "qwen3_5":
            try:
                build_tiny_qwen3_5(out, seed=args.seed, text_layers=args.text_layers or 4, vision_depth=vision_layers)
            except ValueError as err:
                parser.error(f"--text-layers {args.text_layers or 4}: {err} (the tiny Qwen3.5 needs at least 4)")
        else:
            build_tiny_qwen3vl(out, seed=args.seed, text_layers=text_layers, vision_depth=vision_layers,
                               text_heads=args.text_heads or 4)
        return
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.synthetic.standin import build_standin, default_text_layers, standin_config

    try:  # a bad name or layer count is a usage error, reported before anything is built or written
        text_layers = args.text_layers or default_text_layers(args.like)
        standin_config(args.like, text_layers=text_layers, vision_layers=vision_layers)
        build_standin(out, args.like, text_layers=text_layers, vision_layers=vision_layers, dtype=args.dtype,
                      seed=args.seed)
    except GraspConfigError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
