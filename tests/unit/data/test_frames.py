"""One visual-token count for the memory planner and the data path (``grasp_lightning/data/frames.py``).

For every recipe and overlay of configs/ (the paper's rule, ``data.video.max_pixels``, and the released rule,
``data.video.frame_max_tokens``), both model families (the tiny Qwen3-VL and Qwen3.5 of grasp_lightning/assets)
and the real stand-ins' processors (Qwen3-VL and Qwen3.5 published settings, real tokenizers), a 5.5 s clip is
encoded by the run's own ``GraspDataModule.dataset`` and planned by the run's own ``RunSpec``: the planner's
visual tokens are the ``<|video_pad|>`` tokens of the rendered prompt, and with the real tokenizers the whole
prompt's length too.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from grasp_lightning.commands.config import config_args, load_run
from grasp_lightning.data.frames import clip_frames, default_frame_size, resolve_resolution
from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.planning.estimate import plan_memory
from grasp_lightning.planning.spec import spec_from_run
from grasp_lightning.planning.tokens import QWEN3VL_VIDEO_PROCESSOR, video_tokens
from tests.helpers import REPO, make_mp4

ASSETS = REPO / "grasp_lightning" / "assets"
#: Each recipe, alone and with each overlay that applies to it (the released ones on their own recipe).
RUNS = {
    "sft": ["sft.yaml"], "sgr": ["sgr.yaml"], "sft+lora": ["sft.yaml", "lora.yaml"], "sgr+lora": ["sgr.yaml", "lora.yaml"],
    "sgr+qlora": ["sgr.yaml", "qlora.yaml"], "sft+demo": ["sft.yaml", "demo.yaml"], "sgr+demo": ["sgr.yaml", "demo.yaml"],
    "released-sft": ["sft.yaml", "released/sft.yaml"], "released-sgr": ["sgr.yaml", "released/sgr.yaml"],
    "released-sgr+demo": ["sgr.yaml", "released/sgr.yaml", "demo.yaml"],
}
#: 5.5 s at 30 fps: 11 frames at 2 fps (an odd count, padded to 6 groups), 8 under configs/demo.yaml.
SECONDS, SOURCE_FPS = 5.5, 30
#: 16:9 sources over the recipes' 200,704-pixel cap (360 x 640: 11 x 20 = 220 released tokens of 32 pixels;
#: 720 x 1280: 12 x 21 = 252) and a square one under it.
SIZES = ((360, 640), (720, 1280), (256, 256))


@lru_cache(maxsize=None)
def _run(name: str):
    return load_run(config_args([REPO / "configs" / path for path in RUNS[name]]))


@lru_cache(maxsize=None)
def _processor(name: str):
    """``(processor, the planner's model name)``: a tiny asset's own processor (the planner reads its folder), or a
    stand-in's published processor (the planner knows the bundled architecture and Qwen3-VL's settings)."""
    if name.startswith("tiny"):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(ASSETS / name), str(ASSETS / name)
    from grasp_lightning.synthetic.standin import build_processor

    return build_processor(name), name.split("/")[-1]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[tuple[int, int], Path]:
    folder = tmp_path_factory.mktemp("clips")
    out = {}
    for height, width in SIZES:
        out[(height, width)] = folder / f"{height}x{width}.mp4"
        out[(height, width)].write_bytes(make_mp4(n_frames=round(SECONDS * SOURCE_FPS), fps=SOURCE_FPS, width=width,
                                                  height=height))
    return out


@pytest.mark.parametrize("family", ["tiny-qwen3vl", "tiny-qwen3_5", "Qwen3-VL-2B-Instruct", "Qwen/Qwen3.5-9B"])
@pytest.mark.parametrize("run_name", list(RUNS))
def test_planned_visual_tokens_are_the_processors(run_name: str, family: str, clips) -> None:
    """Before: the planner sized frames by max_pixels alone; under the released rule (frame_max_tokens 256) a
    720 x 1280 clip gave 6 x 190 planned tokens for 6 x 252 in the prompt (tiny models: 6 x 18 for 6 x 252)."""
    from grasp_lightning.data.prompts import render_texts

    run = _run(run_name)
    processor, model = _processor(family)
    datamodule = run.datamodule
    datamodule._processor = processor  # the run's data path with this family's processor
    spec, _ = spec_from_run(run.module, datamodule, run.trainer)
    assert spec.frame_max_tokens == datamodule.video.frame_max_tokens
    pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    real_tokenizer = not family.startswith("tiny")  # the planner's timestamps follow Qwen's digit-split tokenizer
    for size, path in clips.items():
        item = GraspItem(uid="u", origin=f"synthetic:{size}", clip=ClipRef(str(path)),
                         question="Who is Person 0 looking at?\nA) Person 1\nB) Person 2",
                         options=("A) Person 1", "B) Person 2"), answer="A")
        dataset = datamodule.dataset([item], datamodule_store(item), with_target=False)
        encoded = dataset.encode(item)
        actual = int((encoded.input_ids == pad).sum())
        template = len(processor.tokenizer(render_texts(processor, item, None, dataset.prompt.system_prompt,
                                                        dataset.prompt.instruction)[0])["input_ids"])
        planned = plan_memory(replace(spec, model=model, video_seconds=SECONDS, frame_size=size,
                                      source_fps=float(SOURCE_FPS), text_tokens=template))
        assert planned.visual_tokens == actual, (run_name, family, size)
        t, h, w = encoded.video_grid_thw[0].tolist()
        merge = processor.video_processor.merge_size
        assert planned.visual_tokens == t * h * w // merge**2
        if real_tokenizer:
            assert planned.prompt_tokens == encoded.prompt_length, (run_name, family, size)


def datamodule_store(item: GraspItem):
    from grasp_lightning.data.qa import store_for

    return store_for([item], Path("/"))


def test_released_rule_counts_by_hand() -> None:
    """The released rule with Qwen3-VL's 32-pixel tokens: a 720 x 1280 source -> 12 x 21 tokens (384 x 672 pixels);
    60 s at 2 fps -> 120 frames, 60 groups -> 15,120 visual tokens (ours: 60 x 190 = 11,400 for the same clip).
    The default source frame is square at the cap: 512 x 512 (16 x 16 = 256 tokens) -> 15,360."""
    settings = dict(QWEN3VL_VIDEO_PROCESSOR)
    wide = clip_frames(120, 720, 1280, max_pixels=200704, frame_max_tokens=256, settings=settings)
    assert (wide.decoded, wide.passed, wide.size, wide.processor_resizes) == ((720, 1280), (384, 672), (384, 672), False)
    assert (wide.groups, wide.tokens_per_group, wide.visual_tokens) == (60, 252, 15120)
    ours = clip_frames(120, 720, 1280, max_pixels=200704, frame_max_tokens=None, settings=settings)
    # ours: decoded at 336 x 596 (200,704 pixels, even sides), the processor rounds to 320 x 608: 10 x 19 tokens
    assert ours.decoded == (336, 596) and ours.size == (320, 608) and ours.processor_resizes
    assert ours.visual_tokens == 60 * 10 * 19
    assert default_frame_size(200704, 256, settings) == (512, 512) and default_frame_size(200704, None, settings) == (448, 448)
    assert video_tokens(60, 2.0, 512, 200704, frame_max_tokens=256).visual_tokens == 15360
    assert video_tokens(60, 2.0, 512, 200704, frame_max_tokens=256, frame_size=(720, 1280)).visual_tokens == 15120
    assert video_tokens(60, 2.0, 512, 200704).visual_tokens == 11760  # our rule: unchanged
    assert resolve_resolution(720, 1280, spatial_patch=32, max_tokens=256) == (384, 672)


def test_plan_memory_counts_the_released_rule(capsys, in_repo) -> None:
    """docs/scaling.md's ``plan-memory --config configs/sgr.yaml --config configs/released/sgr.yaml``: before, 11,760
    visual tokens (the paper recipe's 448 x 448 frames); after, the released 256 tokens per 2-frame group: 15,360."""
    from grasp_lightning.commands import plan_memory as command

    def tokens_line(*configs: str) -> str:
        assert command.main([arg for name in configs for arg in ("--config", f"configs/{name}")]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Tokens:"))

    assert tokens_line("sgr.yaml", "released/sgr.yaml").startswith(
        "Tokens: 60 s at 2 fps -> 120 frames of 512 x 512 (frame_max_tokens 256) -> 60 groups x 256 = 15360 visual "
        "tokens; prompt 16143;")
    assert tokens_line("sgr.yaml").startswith(
        "Tokens: 60 s at 2 fps -> 120 frames of 448 x 448 (max_pixels 200,704) -> 60 groups x 196 = 11760 visual "
        "tokens; prompt 12543;")
