"""The released GRASP recipe (configs/released/*.yaml, docs/released-recipe.md): every setting of the
paper-vs-released table read back through the config loader ``fit`` uses, the stop rule and the kept
suppression as sampling applies them, the released resolution rule on a sample clip, and both
overlays trained on the demo data."""

from __future__ import annotations

import math

import pytest
import torch

from grasp_lightning.commands.config import config_args, load_run
from grasp_lightning.data.records import DIFFICULTIES
from tests.helpers import REPO, SAMPLE, TINY, run_cli

DOC = REPO / "docs" / "released-recipe.md"

# Each setting of the table: (config key in the table, what the loaded run says, released value, source).
SFT_RELEASED = {
    "model.optim.weight_decay": (lambda r: r.module.optim_cfg.weight_decay, 1e-3),  # train_sft.sh:30
    "data.loader.curriculum": (lambda r: r.datamodule.loader.curriculum, True),  # train_utils.py:297
    "data.prompt.system_prompt": (lambda r: r.datamodule.prompt.system_prompt, ""),  # qwen3vl.py:137-145
    "data.video.frame_max_tokens": (lambda r: r.datamodule.video.frame_max_tokens, 256),  # sft/arguments.py:31
    "data.video.sampling": (lambda r: r.datamodule.video.sampling, "even"),  # input_processing.py:108, 126-151
    "data.prompt.rows_as_written": (lambda r: r.datamodule.prompt.rows_as_written, True),  # qwen3vl.py:137-145
    "data.loader.seed": (lambda r: r.datamodule.loader.seed, 42),  # train_utils.py:288-291, the Trainer's seed 42
    # the same in the paper's recipe and the released script
    "model.optim.lr": (lambda r: r.module.optim_cfg.lr, 2e-6),  # train_sft.sh:29
    "model.optim.warmup_steps": (lambda r: r.module.optim_cfg.warmup_steps, 200),  # train_sft.sh:32
    "trainer.max_epochs": (lambda r: r.trainer.max_epochs, 2),  # train_sft.sh:26
    "data.video.fps": (lambda r: r.datamodule.video.fps, 2.0),  # train_sft.sh:34
    "data.video.max_frames": (lambda r: r.datamodule.video.max_frames, 512),  # sft/arguments.py:25
}
SGR_RELEASED = {
    "model.optim.weight_decay": (lambda r: r.module.optim_cfg.weight_decay, 1e-3),  # train_sgr.sh:31
    "model.task.init_args.advantage.kind": (lambda r: r.task.advantage.kind, "released"),  # trainer.py:298-309, 325-328
    "model.task.init_args.advantage.clip": (lambda r: r.task.advantage.clip, 5.0),  # arguments.py:65
    # overlong buffer in tokens at the recipe's budget: 256 (arguments.py:70-71) of 1,024 (:56)
    "model.task.init_args.reward.overlong_buffer_fraction": (
        lambda r: r.task.overlong_buffer_tokens(r.module.rollout_cfg.max_new_tokens), 256),
    "model.task.init_args.reward.overlong_mode": (lambda r: r.task.reward.overlong_mode, "released"),  # trainer.py:311-319
    "model.task.init_args.reward.overlong_penalty": (lambda r: r.task.reward.overlong_penalty, 1.0),  # arguments.py:76-77
    "model.task.init_args.reward.terms": (lambda r: list(zip(r.task.reward.terms, r.task.reward_weights)),  # :57-64
                                     [("accuracy_released", 1.0), ("format_released", 0.1),
                                      ("grounding_presence_released", 0.05), ("social_grounding_released", 0.2)]),
    "model.task.init_args.loss.kl_clamp": (lambda r: r.task.loss.kl_clamp, 10.0),  # trainer.py:196

    "model.rollout.max_new_tokens": (lambda r: r.module.rollout_cfg.max_new_tokens, 1024),  # arguments.py:56
    "model.rollout.stop_at_answer": (lambda r: r.module.rollout_cfg.stop_at_answer, False),  # trainer.py:108-119
    "data.loader.curriculum": (lambda r: r.datamodule.loader.curriculum, False),  # reasoning/arguments.py:84-87
    "data.prompt.system_prompt": (lambda r: r.datamodule.prompt.system_prompt, ""),  # qwen3vl.py:263-271
    "data.video.frame_max_tokens": (lambda r: r.datamodule.video.frame_max_tokens, 256),  # arguments.py:29-31
    "data.video.sampling": (lambda r: r.datamodule.video.sampling, "even"),  # input_processing.py:108, 126-151
    "data.prompt.rows_as_written": (lambda r: r.datamodule.prompt.rows_as_written, True),  # qwen3vl.py:263-271
    "data.loader.seed": (lambda r: r.datamodule.loader.seed, 42),  # train_utils.py:288-291, the Trainer's seed 42
    # the same in the paper's recipe and the released script
    "model.task.init_args.loss.beta": (lambda r: r.task.loss.beta, 0.05),  # arguments.py:66-69
    "model.rollout.num_generations": (lambda r: r.module.rollout_cfg.num_generations, 8),  # arguments.py:52-55
    "model.rollout.temperature": (lambda r: r.module.rollout_cfg.temperature, 1.0),  # arguments.py:80-83
    "model.rollout.top_p": (lambda r: r.module.rollout_cfg.top_p, 1.0),  # trainer.py:113
    "model.optim.lr": (lambda r: r.module.optim_cfg.lr, 3e-6),  # train_sgr.sh:30
    "model.optim.warmup_steps": (lambda r: r.module.optim_cfg.warmup_steps, 256),  # train_sgr.sh:33
}
# What our recipes (the paper's text) set instead, for the settings that differ.
SFT_OURS = {"model.optim.weight_decay": 0.0, "data.loader.curriculum": False, "data.video.frame_max_tokens": None,
            "data.video.sampling": "rate", "data.prompt.rows_as_written": False, "data.loader.seed": 0}
SGR_OURS = {"model.optim.weight_decay": 0.0, "model.task.init_args.advantage.kind": "group",
            "model.task.init_args.advantage.clip": None, "model.task.init_args.reward.overlong_buffer_fraction": None,
            "model.rollout.stop_at_answer": True, "data.video.frame_max_tokens": None,
            "model.task.init_args.reward.terms": [("accuracy", 1.0), ("format", 0.1), ("grounding_presence", 0.05),
                                                  ("social_grounding", 0.2)],
            "model.task.init_args.loss.kl_clamp": None, "data.video.sampling": "rate",
            "data.prompt.rows_as_written": False, "data.loader.seed": 0}


@pytest.mark.parametrize("recipe, table, ours", [("sft", SFT_RELEASED, SFT_OURS), ("sgr", SGR_RELEASED, SGR_OURS)])
def test_the_released_overlays_load_with_every_released_value(in_repo, recipe, table, ours) -> None:
    released = load_run(config_args([f"configs/{recipe}.yaml", f"configs/released/{recipe}.yaml"]))
    paper = load_run(config_args([f"configs/{recipe}.yaml"]))
    doc = DOC.read_text(encoding="utf-8")
    for key, (read, value) in table.items():
        got = read(released)
        assert got == (pytest.approx(value) if isinstance(value, float) else value), (key, got)
        if key in ours:  # a row of the table: named in the page, and really different in our recipe
            assert f"`{key}`" in doc, f"{key} is not in docs/released-recipe.md"
            assert read(paper) != got, key
            if key != "model.task.init_args.reward.overlong_buffer_fraction":
                assert read(paper) == ours[key], key
    assert paper.datamodule.prompt.system_prompt != ""  # ours: a system turn on every prompt
    assert "`data.prompt.system_prompt`" in doc and "`social_grounding_released`" in doc
    if recipe == "sgr":
        assert paper.task.overlong_buffer_tokens(1024) is None and paper.task.reward.terms[3] == "social_grounding"


def test_the_released_stop_rule_samples_to_eos_and_keeps_the_suppression(in_repo) -> None:
    """The loaded released rollout settings, as the HF engine hands them to ``generate``: no stop string
    (EOS or the budget, reasoning/trainer.py:108-119), top_k 0 (:114), and the vision placeholders still
    suppressed (kept on purpose: a sampled <|video_pad|> breaks the next forward)."""
    from transformers import AutoTokenizer

    from grasp_lightning.engines.hf import HFEngine

    cfg = load_run(config_args(["configs/sgr.yaml", "configs/released/sgr.yaml"])).module.rollout_cfg
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    seen: dict = {}

    class Spy:
        generation_config = type("G", (), {"eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")})()

        def generate(self, **kwargs):
            seen.update(kwargs)
            ids = kwargs["input_ids"].repeat_interleave(kwargs["num_return_sequences"], 0)
            return torch.cat([ids, torch.full((ids.shape[0], 1), self.generation_config.eos_token_id)], 1)

    prompt = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    out = HFEngine().sample(Spy(), tokenizer, prompt, cfg)
    assert len(out.texts) == 8
    assert seen["max_new_tokens"] == 1024 and "stop_strings" not in seen and seen["top_k"] == 0
    vision = sorted(tokenizer.convert_tokens_to_ids(t) for t in
                    ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"))
    assert sorted(seen["suppress_tokens"]) == vision


def test_the_released_resolution_rule_sizes_training_frames(processor) -> None:
    """``data.video.frame_max_tokens: 256`` on the 360 x 640 sample clip with the tiny model's 16-pixel tokens
    (patch 8 x merge 2): rows 22, cols 40; h = 12, w = floor(12 * 640 / 360) = 21 gives 252 <= 256 tokens
    (w = 22 would be 264; h = 13 needs w >= 23, 299 tokens) -> frames 192 x 336, grid 24 x 42 patches."""
    from dataclasses import replace

    from grasp_lightning.data.datamodule_config import ErrorConfig, PromptConfig, VideoConfig
    from grasp_lightning.data.formats import read_sft
    from grasp_lightning.data.qa import store_for
    from grasp_lightning.datamodule import GraspDataset

    item = next(i for i in read_sft(SAMPLE / "train" / "data_sft.jsonl") if i.clip.src_resolution == (360, 640))
    store = store_for([item], SAMPLE / "train" / "videos")
    prompt = PromptConfig(system_prompt="", max_prompt_tokens=None, max_target_tokens=None)
    video = VideoConfig(fps=2.0, max_frames=8, max_pixels=4096, frame_max_tokens=256)
    released = GraspDataset([item], store, processor, video, prompt, ErrorConfig(), with_target=True).encode(item)
    t, h, w = released.video_grid_thw[0].tolist()
    assert (h, w) == (24, 42) and h * w // 4 == 252
    # the paper recipe's rule on the same clip: max_pixels (4096 here) caps the decoded frame instead
    ours = GraspDataset([item], store, processor, replace(video, frame_max_tokens=None), prompt, ErrorConfig(),
                        with_target=True).encode(item)
    assert math.prod(ours.video_grid_thw[0].tolist()[1:]) * 4096 < h * w * 4096 and ours.video_grid_thw[0, 0] == t


def _fit(tmp_path, recipe: str, monkeypatch, task_class, steps: int):
    """``fit --config configs/<recipe>.yaml --config configs/released/<recipe>.yaml --config configs/demo.yaml``
    for ``steps`` steps without validation; returns the CLI and the items of every training micro-batch."""
    seen: list[list] = []
    step = task_class.training_step

    def recording(self, ctx, batch):
        seen.append(list(batch.items))
        return step(self, ctx, batch)

    monkeypatch.setattr(task_class, "training_step", recording)
    cli = run_cli(["fit", "--config", f"configs/{recipe}.yaml", "--config", f"configs/released/{recipe}.yaml",
                   "--config", "configs/demo.yaml", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
                   f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0"], tmp_path)
    return cli, seen


def test_released_sgr_trains_on_the_demo(in_repo, tmp_path, monkeypatch) -> None:
    from grasp_lightning.tasks.grpo import GRPOTask

    cli, seen = _fit(tmp_path, "sgr", monkeypatch, GRPOTask, steps=3)
    assert cli.trainer.global_step == 3 and len(seen) == 3
    task, rollout = cli.model.task, cli.model.rollout_cfg
    assert task.reward.terms[3] == "social_grounding_released" and not rollout.stop_at_answer
    assert task.overlong_buffer_tokens(rollout.max_new_tokens) == rollout.max_new_tokens // 4  # 72 of demo's 288


def test_released_sft_trains_on_the_demo_in_curriculum_order(in_repo, tmp_path, monkeypatch) -> None:
    from grasp_lightning.tasks.sft import SFTTask

    cli, seen = _fit(tmp_path, "sft", monkeypatch, SFTTask, steps=12)  # the whole epoch: 24 rows, 2 per step
    assert cli.trainer.global_step == 12 and len(seen) == 12
    order = [DIFFICULTIES.index(item.difficulty) for items in seen for item in items]
    assert order == sorted(order) and len(order) == 24 and set(order) == {0, 1, 2}  # easy, medium, hard
    assert cli.model.optim_cfg.weight_decay == pytest.approx(1e-3) and cli.datamodule.prompt.system_prompt == ""
