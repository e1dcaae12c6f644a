"""The generic QA format (grasp_lightning/data/qa.py) and mixed image/video batches.

Reader errors name ``file:line`` and are counted in skip mode; images go through the processor's
image path with ``data.video.max_image_pixels``; a batch mixing image rows, video rows and a row with both
gives each row what it gives alone: SFT logits, greedy generation, and the group-shared prefill and
scoring against the naive K repeated rows, on both tiny families. ``check-data`` runs on a generated QA
file (the GRPO fit and validation suite on one are in tests/cli/test_eval_suites.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grasp_lightning.data.datamodule_config import ErrorConfig, LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from grasp_lightning.data.qa import read_qa
from grasp_lightning.engines.decoding import sample_completions
from grasp_lightning.errors import ClipDecodeError, ClipNotFoundError, GraspFormatError
from grasp_lightning.grpo.scoring import (
    completion_logps,
    concat_prompts,
    full_sequences,
    grids_per_row,
    prefill_for_generation,
    repeat_prompts,
    select_prompts,
    shared_completion_logps,
)
from tests.helpers import (
    FAMILIES,
    GRAD_TOLS,
    LOGP_TOLS,
    TINY,
    TINY_MODELS,
    load_model,
    qa_row,
    write_jsonl,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

K = 2


def _datamodule(folder: Path, mode: str, model: Path = TINY, train_file: str = "qa.jsonl",
                max_image_pixels: int = 2048, errors: ErrorConfig | None = None):
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(folder), train_file=train_file, bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096, max_image_pixels=max_image_pixels),
                         prompt=PromptConfig(processor=str(model)), loader=LoaderConfig(data_mode=mode, batch_size=4, num_workers=0),
                         errors=errors or ErrorConfig())
    dm.setup("fit")
    return dm


def _batch(folder: Path, mode: str, model: Path = TINY):
    dm = _datamodule(folder, mode, model)
    return next(iter(dm.train_dataloader())), dm


# ------------------------------------------------------------------ reading
def test_rows_become_items_with_resolved_media_and_participants(qa_dir):
    items = read_qa(qa_dir / "qa.jsonl")
    assert [i.media for i in items] == [("image",), ("video",), ("image",), ("image", "video")]
    first, video = items[0], items[1]
    assert first.image == str((qa_dir / "media/img0.png").resolve()) and first.clip is None
    assert first.options == ("A) Person 0", "B) Person 1", "C) Person 2", "D) No one") and first.answer == "B"
    assert first.question.splitlines()[1:] == list(first.options) and first.format == "mcq"
    assert first.participants == frozenset({0, 1}) and first.events == () and first.category == "gaze"
    assert video.clip.path == str((qa_dir / "media/clip.mp4").resolve()) and video.clip.end_seconds == 1.5
    assert video.origin == f"{qa_dir / 'qa.jsonl'}:2"
    row = read_qa(write_jsonl(qa_dir / "qa.defaults.jsonl", [{"image": "media/img0.png", "question": "Who?",
                                                               "category": "c2"}]))[0]
    assert (row.uid, row.format, row.answer, row.response, row.category) == ("qa:1", "open_ended", "", None, "J2")


BAD_ROWS = [
    (qa_row(image="media/nope.png"), ClipNotFoundError, r"image file media/nope\.png not found"),
    (qa_row(image="", video=None), GraspFormatError, "neither 'video' nor 'image'"),
    (qa_row(image="https://example.com/x.png"), GraspFormatError, r"'image' is a URL \(https://example\.com/x\.png\); nothing is downloaded"),
    (qa_row(options="A, B"), GraspFormatError, "'options' must be a list of strings"),
    (qa_row(answer="E"), GraspFormatError, "MCQ answer 'E' is not among the option letters ABCD"),
    (qa_row(participants=["Person 0"]), GraspFormatError, "'participants' must be a list of person ids"),
    (qa_row(question=""), GraspFormatError, "'question' is empty"),
    (qa_row(start=2.0, end=1.0, video="media/clip.mp4"), GraspFormatError, r"'end' \(1 s\) must be after"),
    ("[1, 2]", GraspFormatError, "expected a JSON object"),
    (qa_row(events=[{"source": "gaze", "persons": [0], "start_seconds": 1.0}]), GraspFormatError,
     "event 0: 'start_seconds' given without 'end_seconds'"),
]


@pytest.mark.parametrize("row, error, message", BAD_ROWS, ids=["missing", "no_media", "url", "options", "answer",
                                                                  "participants", "question", "window", "not_object",
                                                                  "event_span"])
def test_bad_rows_name_file_and_line(qa_dir, tmp_path, row, error, message):
    (tmp_path / "media").symlink_to(qa_dir / "media")
    path = write_jsonl(tmp_path / "qa.jsonl", [qa_row(), row])
    with pytest.raises(error, match=rf"^{tmp_path / 'qa.jsonl'}:2: {message}"):
        read_qa(path)
    skipped = read_qa(path, on_error="skip")
    assert len(skipped) == 1 and [s.where for s in skipped.skipped] == [f"{path}:2"]


def test_events_spans_and_extra_columns_reach_every_grounding_reward(qa_dir, tmp_path):
    """A generic QA row's ``events`` (with time spans) feed the by-modality, released-code and temporal
    rewards, and its unknown columns reach a reward of one's own as ``item.extra``; values by hand."""
    from grasp_lightning.grpo.rewards import compute_rewards

    (tmp_path / "media").symlink_to(qa_dir / "media")
    row = qa_row(image=None, video="media/clip.mp4", participants=[5], difficulty_score=0.7, notes={"rater": 2},
                 events=[{"source": "gaze", "persons": [0, 1], "start_seconds": 0.5, "end_seconds": 1.5},
                         {"source": "pointing", "persons": [2], "start_seconds": 1.0, "end_seconds": 2.0}])
    item = read_qa(write_jsonl(tmp_path / "qa.jsonl", [row])).items[0]
    assert item.extra == {"difficulty_score": 0.7, "notes": {"rater": 2}}
    assert [(e.source, e.persons, e.kind, e.span) for e in item.events] == [
        ("gaze", (0, 1), "gaze", (0.5, 1.5)), ("gesture", (2,), "pointing", (1.0, 2.0))]
    assert item.participants == {0, 1, 2, 5}
    completion = ("<think><gaze>Person 0 looks at Person 1 from 0.5s to 1.5s.</gaze> "
                  "<gesture>Person 2 and Person 3 point.</gesture></think><answer>B</answer>")

    def difficulty_bonus(completion: str, item) -> float:
        return item.extra["difficulty_score"]

    values = compute_rewards([completion], [item], ["social_grounding", "social_grounding_by_modality",
                                                    "social_grounding_released", "temporal_grounding",
                                                    difficulty_bonus])
    # social_grounding: named {0,1,2,3}, participants {0,1,2,5}: P = R = 3/4, (1 + 3/4) * 3/4
    # by modality: gaze named {0,1} = gt {0,1}: 2; gesture named {2,3}, gt {2}: P 1/2, R 1: 1; mean 1.5
    # released: Person 0 is asked about, so gaze {1} vs {1}, gesture {2,3} vs {2}: R = 1, P = (1 + 1/2) / 2;
    #   0.7 * 1 + 0.3 * 0.75
    # temporal: named (0.5, 1.5); IoU 1 with the gaze span, 0.5 / 1.5 with the pointing one; / max(2, 1)
    expected = [1.75 * 0.75, 1.5, 0.7 + 0.3 * 0.75, (1 + 1 / 3) / 2, 0.7]
    assert values.shape == (1, 5)
    assert values[0].tolist() == pytest.approx(expected)


def test_skip_mode_counts_bad_lines_and_unreadable_images(qa_dir, tmp_path):
    (tmp_path / "media").symlink_to(qa_dir / "media")
    (tmp_path / "garbage.jpg").write_bytes(b"not a jpeg at all")
    rows = [qa_row(), qa_row(image="media/none.png"), qa_row(id="bad_img", image="garbage.jpg"),
            qa_row(image=None), *[qa_row(id=f"ok{i}") for i in range(3)]]
    write_jsonl(tmp_path / "qa.jsonl", rows)
    dm = _datamodule(tmp_path, "sft", errors=ErrorConfig(on_bad_item="skip", max_skip_fraction=0.5))
    assert len(dm.train_items) == 5 and [s.where.rsplit(":", 1)[1] for s in dm.skipped] == ["2", "4"]
    assert [s.uid for s in dm.skipped] == ["qa_0001", "qa_0001"]  # a row's own id travels with its skip
    dataset = dm.dataset(dm.train_items, None, with_target=True)
    sample = dataset[1]
    assert sample.example is None and sample.skip.uid == "bad_img"
    assert sample.skip.where == f"{tmp_path / 'qa.jsonl'}:3 ({tmp_path / 'garbage.jpg'})"
    assert sample.skip.reason.startswith("unreadable image") and "<_io." not in sample.skip.reason, sample.skip.reason
    dataset.skip_bad = False
    with pytest.raises(ClipDecodeError, match=r"qa\.jsonl:3 .*unreadable image"):
        dataset[1]


def test_image_pixel_cap_and_unknown_names_are_refused(qa_dir):
    from grasp_lightning.errors import GraspConfigError

    small = _datamodule(qa_dir, "rl", max_image_pixels=1024)
    large = _datamodule(qa_dir, "rl", max_image_pixels=4096)
    grid = lambda dm: dm.dataset(dm.train_items[:1], None, False)[0].example.image_grid_thw  # noqa: E731
    patch = small.processor.image_processor.patch_size
    assert int(grid(small).prod()) * patch**2 <= 1024 < int(grid(large).prod()) * patch**2 <= 4096
    with pytest.raises(GraspConfigError, match="max_image_pixels must be an integer >= 1"):
        _datamodule(qa_dir, "rl", max_image_pixels=0)
    with pytest.raises(GraspConfigError, match="or qa.jsonl"):
        _datamodule(qa_dir, "rl", train_file="mine.jsonl")


# ------------------------------------------------------------------ mixed batches
def test_mixed_batch_assigns_grids_per_row_and_selects_repeats_and_concatenates(qa_dir):
    batch, _ = _batch(qa_dir, "rl")
    inputs = batch.inputs
    media = [i.media for i in batch.items]
    assert grids_per_row(inputs, "image_grid_thw") == [int("image" in m) for m in media]
    assert grids_per_row(inputs, "video_grid_thw") == [int("video" in m) for m in media]
    video_rows = [b for b, m in enumerate(media) if m == ("video",)]
    only_video = select_prompts(inputs, video_rows)
    assert "image_grid_thw" not in only_video and only_video["video_grid_thw"].shape[0] == 1
    rep = repeat_prompts(inputs, K)
    assert grids_per_row(rep, "image_grid_thw") == [g for g in grids_per_row(inputs, "image_grid_thw") for _ in range(K)]
    image_rows = [b for b, m in enumerate(media) if m == ("image",)]
    both = concat_prompts([select_prompts(inputs, image_rows), only_video], pad_token_id=0)
    assert grids_per_row(both, "image_grid_thw") == [1, 1, 0] and grids_per_row(both, "video_grid_thw") == [0, 0, 1]
    from grasp_lightning.errors import GraspConfigError

    with pytest.raises(GraspConfigError, match=r"image_grid_thw has 1 rows for 3 prompts with its placeholders"):
        repeat_prompts(dict(inputs, image_grid_thw=inputs["image_grid_thw"][:1]), K)
    back = select_prompts(both, [2])
    assert torch.equal(back["pixel_values_videos"], only_video["pixel_values_videos"])
    assert torch.equal(back["input_ids"], only_video["input_ids"])


def _row_inputs(inputs: dict, b: int, side: str) -> dict:
    """Row ``b`` alone (its padding removed), as collating it alone gives."""
    if side == "left":
        return select_prompts(inputs, [b])
    one = select_prompts({k: v for k, v in inputs.items() if k != "labels"}, [b])
    keep = int(inputs["attention_mask"][b].sum())
    one = {k: (v[:, :keep] if v.dim() == 2 and k in ("input_ids", "attention_mask", "mm_token_type_ids") else v)
           for k, v in one.items()}
    one["labels"] = inputs["labels"][b: b + 1, :keep]
    return one


def test_sft_on_a_mixed_batch_gives_each_row_its_own_logits_and_loss(qa_dir):
    from grasp_lightning.tasks.sft import response_cross_entropy

    batch, _ = _batch(qa_dir, "sft")
    model = load_model("qwen3_vl", noise=0.1).eval()
    inputs = batch.inputs
    with torch.no_grad():
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        losses = []
        for b in range(len(batch)):
            one = _row_inputs(inputs, b, "right")
            alone = model(**{k: v for k, v in one.items() if k != "labels"}).logits
            n = alone.shape[1]
            torch.testing.assert_close(logits[b, :n], alone[0], rtol=1e-4, atol=1e-4)
            losses.append(response_cross_entropy(alone, one["labels"]))
    loss, tokens = response_cross_entropy(logits, inputs["labels"])
    per_row = torch.stack([row_loss for row_loss, _ in losses])
    weights = torch.stack([torch.as_tensor(t, dtype=per_row.dtype) for _, t in losses])
    assert int(tokens) == int(weights.sum())
    torch.testing.assert_close(loss, (per_row * weights).sum() / weights.sum(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_on_a_mixed_batch_equals_each_row_alone(qa_dir, family):
    batch, dm = _batch(qa_dir, "rl", TINY_MODELS[family])
    tok = dm.processor.tokenizer
    model = load_model(family)
    greedy = dict(max_new_tokens=8, do_sample=False, stop_strings=())
    together = sample_completions(model, tok, batch.inputs, **greedy)
    for b in range(len(batch)):
        alone = sample_completions(model, tok, select_prompts(batch.inputs, [b]), **greedy)
        assert together.texts[b] == alone.texts[0], (b, batch.items[b].media)
    assert len(set(together.texts)) > 1
    shared = sample_completions(model, tok, batch.inputs, num_return_sequences=K, share_prompt=True, **greedy)
    plain = sample_completions(model, tok, repeat_prompts(batch.inputs, K), **greedy)
    assert shared.texts == plain.texts == [t for t in together.texts for _ in range(K)]
    outs = []  # sampling: transformers' own expansion of a mixed batch (num_return_sequences) and the shared prefill
    for share in (False, True):
        torch.manual_seed(5)
        outs.append(sample_completions(model, tok, batch.inputs, num_return_sequences=K, max_new_tokens=8,
                                       temperature=0.9, stop_strings=(), share_prompt=share))
    assert outs[0].texts == outs[1].texts and torch.equal(outs[0].ids, outs[1].ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prefill_and_scoring_on_a_mixed_batch_equal_the_naive_rows(qa_dir, family):
    batch, dm = _batch(qa_dir, "rl", TINY_MODELS[family])
    inputs, tok = batch.inputs, dm.processor.tokenizer
    model = load_model(family)
    greedy = dict(max_new_tokens=6, pad_token_id=tok.pad_token_id, do_sample=False, temperature=None, top_p=None,
                  top_k=None)
    plain = model.generate(**repeat_prompts(inputs, K), **greedy)
    text, cache = prefill_for_generation(model, inputs, K)
    assert torch.equal(model.generate(**text, cache=cache, **greedy), plain)

    model = load_model(family, train=True, noise=0.1)
    n, lc = len(batch) * K, 7
    ids = torch.randint(0, 500, (n, lc), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(lc)[None] < torch.tensor([lc, 3, 5, 1, lc, 4, 2, 6])[:n, None]
    ids = ids.masked_fill(~mask, tok.pad_token_id)
    naive, _ = completion_logps(model, full_sequences(inputs, ids, mask, K), ids, 1.0)
    naive_grads = torch.autograd.grad((naive * mask).sum(), [p for p in model.parameters() if p.requires_grad],
                                      allow_unused=True)
    shared, _ = shared_completion_logps(model, inputs, ids, mask, K, 1.0)
    shared_grads = torch.autograd.grad((shared * mask).sum(), [p for p in model.parameters() if p.requires_grad],
                                       allow_unused=True)
    torch.testing.assert_close(shared[mask], naive[mask], **LOGP_TOLS[family])
    for got, want in zip(shared_grads, naive_grads):
        if want is not None:
            assert float((got - want).abs().max()) <= GRAD_TOLS[family] * float(want.abs().max()) + 1e-9


def test_vllm_engine_requests_carry_each_rows_image_and_clip_and_refuse_a_row_without_media(qa_dir, tmp_path):
    """A mixed batch (image, video, image, image + video) becomes one server entry per row: the image's pad run
    folded to one ``<|image_pad|>``, its embeddings (main + DeepStack, as ``get_image_features`` gives them) and
    grid; the video's as before. A text-only row is refused by name. (The server's answers: tests/vllm/test_vllm_engine.py.)"""
    from transformers import Qwen3VLForConditionalGeneration

    from grasp_lightning.engines.vllm import EngineError, VLLMEngine
    from grasp_lightning.engines.vllm_config import VLLMConfig
    from grasp_lightning.grpo.scoring import select_prompts, vl_core

    batch, dm = _batch(qa_dir, "rl")
    tok = dm.processor.tokenizer
    policy = Qwen3VLForConditionalGeneration.from_pretrained(str(TINY), dtype=torch.float32).eval()
    python = tmp_path / "python"
    python.write_text("")
    engine = VLLMEngine(VLLMConfig(python=str(python), weight_sync_dir=str(tmp_path / "sync")), model_path="m")
    entries, rows = engine.requests(policy, tok, batch.inputs)  # never started: requests need no server
    media = [i.media for i in batch.items]
    assert [("image" in e, "video" in e) for e in entries] == [("image" in m, "video" in m) for m in media]
    feats = vl_core(policy).get_image_features(batch.inputs["pixel_values"], batch.inputs["image_grid_thw"],
                                               return_dict=True)
    grids = batch.inputs["image_grid_thw"].tolist()
    image_rows = [b for b, e in enumerate(entries) if "image" in e]
    for k, b in enumerate(image_rows):  # the k-th image grid is the k-th image row's (the model's own pairing)
        e = entries[b]
        assert e["text"].count("<|image_pad|>") == 1 and e["image"]["grid_thw"] == grids[k]
        want = torch.cat([feats.pooler_output[k]] + [level[k] for level in feats.deepstack_features], dim=-1)
        assert torch.equal(_mapped(e["image"]["embeds"]), want)
    for b, e in enumerate(entries):
        assert e["text"].count("<|video_pad|>") == int("video" in e) and len(rows[b]) == int(batch.inputs["attention_mask"][b].sum())
        assert "<|image_pad|><|image_pad|>" not in e["text"]
    text_only = dict(select_prompts(batch.inputs, [1]))  # the video row, its clip taken away
    for key in ("pixel_values_videos", "video_grid_thw"):
        text_only.pop(key)
    text_only["mm_token_type_ids"] = torch.zeros_like(text_only["input_ids"])
    with pytest.raises(EngineError, match=r"prompt row 0 of this batch carries 0 clip\(s\) and 0 image\(s\).*engine: hf"):
        engine.requests(policy, tok, text_only)
    engine.close()


def _mapped(meta: dict) -> torch.Tensor:
    """A tensor the engine wrote for its server, read back as the server maps it."""
    import math

    raw = torch.from_file(meta["file"], shared=False, size=Path(meta["file"]).stat().st_size, dtype=torch.uint8)
    dtype = getattr(torch, meta["dtype"])
    n = math.prod(meta["shape"]) * torch.empty((), dtype=dtype).element_size()
    return raw[meta["offset"]:meta["offset"] + n].view(dtype).reshape(meta["shape"]).clone()


# ------------------------------------------------------------------ found by a new user's session
def test_repeated_ids_and_rl_rows_without_answers_are_named_or_counted(qa_dir, tmp_path):
    from grasp_lightning.data.qa import LocalFiles, store_for
    from grasp_lightning.errors import GraspDataError

    rows = [json.loads(line) for line in (qa_dir / "qa.jsonl").read_text().splitlines()]
    (tmp_path / "media").symlink_to(qa_dir / "media")
    twice = write_jsonl(tmp_path / "qa.twice.jsonl", [rows[0], rows[1], {**rows[2], "id": rows[0]["id"]}])
    with pytest.raises(GraspFormatError, match=rf"qa.twice.jsonl:3: id '{rows[0]['id']}' is already the id of "
                                               rf".*qa.twice.jsonl:1"):
        read_qa(twice)
    result = read_qa(twice, on_error="skip")
    assert [item.uid for item in result] == [rows[0]["id"], rows[1]["id"]] and len(result.skipped) == 1
    write_jsonl(tmp_path / "qa.noans.jsonl", [rows[0], {**rows[1], "answer": None, "options": None}, rows[2], rows[3]])
    with pytest.raises(GraspDataError, match=r"qa.noans.jsonl:2: GRPO needs an `answer`.*\(1 of 4 rows"):
        _datamodule(tmp_path, "rl", train_file="qa.noans.jsonl").train_dataloader()
    dm = _datamodule(tmp_path, "rl", train_file="qa.noans.jsonl",
                     errors=ErrorConfig(on_bad_item="skip", max_skip_fraction=0.5))
    dm.train_dataloader()
    assert len(dm.train_items) == 3 and [s.where.rsplit(":", 1)[1] for s in dm.skipped] == ["2"]
    assert len(_datamodule(tmp_path, "sft", train_file="qa.noans.jsonl").train_items) == 4  # SFT needs no answer
    assert isinstance(store_for([], tmp_path / "no_videos"), LocalFiles)  # nothing left to answer: nothing to open


@pytest.mark.parametrize("height, width", [(1, 150), (3, 50), (150, 1)])
def test_thin_images_are_read_channels_last(height, width, processor):
    import numpy as np

    from grasp_lightning.data.prompts import encode_example
    from grasp_lightning.data.records import GraspItem

    image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    item = GraspItem(uid="thin", origin="t:1", clip=None, image="thin.png", question="Who?")
    grid = encode_example(processor, item, None, {}, target=None, image=image).image_grid_thw[0].tolist()
    assert (grid[1] < grid[2]) == (height < width), grid  # the long side stays the long side
