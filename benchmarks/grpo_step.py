"""Seconds per GRPO step: TRL 1.16 ``GRPOTrainer`` against ours (group-shared and naive), same work.

Equal work: the same tiny model, the same prompts (system prompt + one image + a GRASP RL question
from the bundled sample), the same number of prompts per step, K, completion budget, sampling
settings (temperature 1, top-p 1, no top-k, EOS stop only), KL beta, loss type and AdamW; the vision
tower is frozen in both frameworks. Both frameworks run the image processor inside the step (TRL in
``_generate_and_score_completions``, ours in the in-process DataLoader), and run back to back in one
process with the same thread count.

Models (``--models``, comma-separated; default ``qwen3_vl,qwen3_5``): each entry is either a model
family of :data:`grasp_lightning.synthetic.tiny.TINY_BUILDERS`, built into a temp dir at
``--hidden``/``--layers`` (4 query heads, a 64-wide 2-block vision tower, patch 8) — ``qwen3_vl`` a
Qwen3-VL (all layers full attention), ``qwen3_5`` a width-reduced Qwen3.5 stand-in (hybrid: every
4th layer gated full attention, the others Gated DeltaNet linear attention with the tiny builder's
2 key heads and 4 value heads of 8 dims whatever ``--hidden``) — or the path of a checkpoint
directory (e.g. a stand-in from ``python -m grasp_lightning build-model OUT --like ...``), whose
files are linked into the temp dir. Every model runs the same variants with the same settings, and
the JSON holds one entry per model under ``models``, with its parameter count and layer types.

Variants: (a) ``trl_image``; (b) ``ours_image`` (``share_prompt=True``); (c) ``ours_naive_image``
(``share_prompt=False``: K rows per prompt, like TRL); (d) ``ours_video`` (2 fps clips, shared).

Per step: wall seconds from one step's end to the next (data wait included), the process's CPU
seconds over the same span (steadier than wall time on a shared machine), time inside the
models' forward calls, and *prompt tokens forwarded*, counted by the same forward hook for every
variant: in each call that carries the prompts' vision tokens, rows × the columns up to the end
of the assistant header. Reported per model: median and spread (min, quartiles, max) over the steps
after warm-up, ``ratio_vs_trl`` = median (b) / median (a) in wall time (``ratio_vs_trl_cpu`` in CPU
time), ``speedup_vs_naive`` = median (c) / median (b) (``speedup_vs_naive_cpu``) and
``prompt_tokens_naive_over_shared``. With one rollout per optimizer step a prompt is forwarded three
times (generation prefill, reference and policy scoring): naive rows forward ``3 K Lp`` prompt tokens
per group, the shared prompt ``3 Lp - 1`` (the prefill leaves the last prompt token to ``generate``).

    python benchmarks/grpo_step.py                       # K=8, 2 prompts, 32 new tokens, 256x256 images
    python benchmarks/grpo_step.py --k 4 --steps 3 --warmup 1 --models qwen3_5

Optimizer-step comparison (``--accumulate A``, GRPO rollout batches, issue 17): ``A`` micro-batches of
``--prompts`` prompts per optimizer step, image prompts. (e) ``ours_per_micro``: a generation call per
micro-batch (``rollout_batch_prompts = B``, the old behaviour); (f) ``ours_rollout_batch``: one call for
the whole window; (g) ``trl_rollout_batch``: TRL with ``gradient_accumulation_steps = A`` and
``steps_per_generation = A`` (``generation_batch_size = A·B·K``: one generation per optimizer step, its
best equivalent). Seconds per *optimizer step* (sum of its micro-batches for ours, TRL's step);
``optimizer_step_speedup`` = (e) / (f), ``ratio_vs_trl`` = (f) / (g) in this mode, per model.

    python benchmarks/grpo_step.py --accumulate 4 --prompts 1 --k 8

The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"


# ---------------------------------------------------------------------------------------- model and prompts
def build_model(spec: str, out: Path, *, hidden: int, layers: int, image_side: int, frame_side: int,
                max_frames: int) -> Path:
    """The model directory of one ``--models`` entry, written to ``out``.

    Args:
        spec: a family of :data:`~grasp_lightning.synthetic.tiny.TINY_BUILDERS` (built at ``hidden``
            width, ``layers`` decoder layers, 4 query heads, a 64-wide 2-block vision tower), or a
            checkpoint directory (weights linked, the other files copied).
        out: directory to write; must not exist.
        hidden, layers: text model width and depth of a built family.
        image_side: the image processor keeps at most ``image_side``² pixels (a visual token per
            16×16 px at patch 8, merge 2), so the prompt dominates the step.
        frame_side, max_frames: the video processor keeps ``frame_side``² pixels for each of up to
            ``max_frames`` frames.

    Raises:
        SystemExit: ``spec`` is neither a family nor a directory holding ``config.json``, or the family's
            builder refuses the sizes.
    """
    from transformers import AutoProcessor

    from grasp_lightning.synthetic.tiny import TINY_BUILDERS

    if spec in TINY_BUILDERS:
        try:
            TINY_BUILDERS[spec](out, text_hidden_size=hidden, text_layers=layers, text_heads=4, vision_hidden_size=64,
                                vision_depth=2)
        except ValueError as err:  # sizes the family cannot take (e.g. qwen3_5 with fewer than 4 layers)
            raise SystemExit(f"--models {spec}: {err}") from err
    elif (Path(spec) / "config.json").is_file():
        out.mkdir(parents=True)
        for f in Path(spec).iterdir():
            if f.suffix in (".safetensors", ".bin"):
                (out / f.name).symlink_to(f.resolve())
            elif f.is_file():
                shutil.copy(f, out / f.name)
    else:
        raise SystemExit(f"--models: {spec!r} is neither a model family ({', '.join(TINY_BUILDERS)}) nor a "
                         "checkpoint directory with a config.json")
    processor = AutoProcessor.from_pretrained(out)
    processor.image_processor.size = {"shortest_edge": processor.image_processor.size["shortest_edge"],
                                      "longest_edge": image_side * image_side}
    processor.video_processor.size = {"shortest_edge": processor.video_processor.size["shortest_edge"],
                                      "longest_edge": frame_side * frame_side * max_frames}
    processor.save_pretrained(out)
    return out


def build_models(specs: str, tmp: Path, **sizes) -> dict[str, Path]:
    """Name → model directory for each comma-separated ``--models`` entry (:func:`build_model`; ``sizes``
    are its keyword arguments). A family is named as given, a checkpoint by its directory name."""
    models = {}
    for spec in specs.split(","):
        name = Path(spec).name
        if name in models:
            raise SystemExit(f"--models: {name!r} given twice")
        models[name] = build_model(spec, tmp / f"model-{len(models)}", **sizes)
    return models


def describe_model(model_dir: Path) -> dict:
    """What a report says of a model: ``model_type``, text ``hidden``/``layers``, ``layer_types`` and the
    stored parameter count (tied embeddings once)."""
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    parameters = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            parameters += sum(math.prod(st.get_slice(name).get_shape()) for name in st.keys())
    return {"model_type": config["model_type"], "hidden": text["hidden_size"], "layers": text["num_hidden_layers"],
            "layer_types": text.get("layer_types") or ["full_attention"] * text["num_hidden_layers"],
            "parameters": parameters}


def read_items(n: int):
    """The first ``n`` RL rows of the bundled sample (questions, answers, events), cycled if short."""
    from grasp_lightning.data.formats import read_rl

    items = read_rl(SAMPLE / "train" / "data_rl.jsonl").items
    return [items[i % len(items)] for i in range(n)]


def make_image(seed: int, side: int):
    """A deterministic ``side``×``side`` RGB noise image (PIL)."""
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8))


def image_messages(item, image=None) -> list[dict]:
    """System + user (one image, then the GRASP question) — the same text as our video prompts."""
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, user_text

    part = {"type": "image", "image": image} if image is not None else {"type": "image"}
    return [{"role": "system", "content": [{"type": "text", "text": DEFAULT_SYSTEM_PROMPT}]},
            {"role": "user", "content": [part, {"type": "text", "text": user_text(item)}]}]


class ImagePrompts(torch.utils.data.Dataset):
    """Step ``i`` → a :class:`~grasp_lightning.data.collate.Batch` of prompts ``i*B .. i*B+B-1`` with images,
    processed on the fly (left-padded; ``pixel_values``/``image_grid_thw``)."""

    def __init__(self, processor, items, images, batch: int) -> None:
        self.processor, self.items, self.images, self.batch = processor, items, images, batch

    def __len__(self) -> int:
        return len(self.items) // self.batch

    def __getitem__(self, i: int):
        from grasp_lightning.data.collate import Batch

        idx = list(range(i * self.batch, (i + 1) * self.batch))
        texts = [self.processor.apply_chat_template(image_messages(self.items[j]), add_generation_prompt=True,
                                                    tokenize=False) for j in idx]
        enc = self.processor(text=texts, images=[self.images[j] for j in idx], padding=True, padding_side="left",
                             return_tensors="pt")
        inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values",
                                      "image_grid_thw")}
        return Batch(inputs=inputs, items=[self.items[j] for j in idx], indices=idx,
                     valid=torch.ones(len(idx), dtype=torch.bool), prompt_lengths=enc["attention_mask"].sum(1),
                     padding_side="left")


class VideoPrompts(torch.utils.data.Dataset):
    """Step ``i`` → a Batch of ``B`` prompts with synthetic ``seconds``-long clips at 2 fps, encoded by our
    pipeline (:func:`grasp_lightning.data.prompts.encode_example`, collated left-padded)."""

    def __init__(self, processor, items, batch: int, seconds: float, side: int) -> None:
        self.processor, self.items, self.batch, self.seconds, self.side = processor, items, batch, seconds, side

    def __len__(self) -> int:
        return len(self.items) // self.batch

    def __getitem__(self, i: int):
        from grasp_lightning.data.collate import Sample, collate_samples
        from grasp_lightning.data.prompts import encode_example

        samples = []
        n = max(2, int(round(self.seconds * 2)))
        for j in range(i * self.batch, (i + 1) * self.batch):
            frames = np.random.default_rng(j).integers(0, 256, (n, self.side, self.side, 3), dtype=np.uint8)
            meta = {"total_num_frames": n * 15, "fps": 30.0, "frames_indices": [15 * t for t in range(n)],
                    "duration": n / 2, "width": self.side, "height": self.side, "video_backend": "decord"}
            example = encode_example(self.processor, self.items[j], frames, meta, target=None)
            samples.append(Sample(index=j, item=self.items[j], example=example))
        return collate_samples(samples, self.processor.tokenizer.pad_token_id, padding_side="left")


# ---------------------------------------------------------------------------------------- measurement
class ForwardMeter:
    """Forward hooks on top-level models: seconds inside forward calls and prompt tokens forwarded.

    Prompt tokens of a call: if ``input_ids`` holds vision placeholder tokens, rows × the columns up
    to the end of the assistant header that follows the last vision token (left padding included);
    otherwise 0 (decode steps, completion-only passes).
    """

    def __init__(self, tokenizer, models) -> None:
        vocab = tokenizer.get_vocab()
        self.vision = torch.tensor([vocab["<|image_pad|>"], vocab["<|video_pad|>"]])
        self.im_start = vocab["<|im_start|>"]
        self.header = len(tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
        self.seconds, self.prompt_tokens, self.calls, self._depth, self._t0 = 0.0, 0, 0, 0, 0.0
        self.handles = []
        for model in {id(m): m for m in models if m is not None}.values():
            self.handles.append(model.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(model.register_forward_hook(self._post))

    def _pre(self, module, args, kwargs) -> None:
        if self._depth == 0:
            self._t0 = time.perf_counter()
            ids = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(ids, torch.Tensor) and ids.dim() == 2:
                self.calls += 1
                row = ids[0]
                hits = torch.isin(row, self.vision).nonzero()
                if len(hits):
                    after = (row[hits[-1, 0]:] == self.im_start).nonzero()
                    end = int(hits[-1, 0]) + int(after[0, 0]) + self.header if len(after) else row.numel()
                    self.prompt_tokens += ids.shape[0] * min(end, row.numel())
        self._depth += 1

    def _post(self, module, args, output) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0

    def take(self) -> dict:
        """This step's totals, then reset."""
        out = {"model_s": self.seconds, "prompt_tokens": self.prompt_tokens, "calls": self.calls}
        self.seconds, self.prompt_tokens, self.calls = 0.0, 0, 0
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def summarise(records: list[dict], warmup: int) -> dict:
    """Median and spread of each per-step figure after ``warmup`` steps."""
    rows = records[warmup:]
    if not rows:
        raise ValueError(f"no steps left after {warmup} warm-up steps")
    out = {"steps": len(rows)}
    for key in rows[0]:
        vals = sorted(float(r[key]) for r in rows)
        out[key] = statistics.median(vals)
        if key == "step_s":
            q = np.quantile(vals, [0.25, 0.75])
            out["spread_s"] = {"min": vals[0], "q1": float(q[0]), "q3": float(q[1]), "max": vals[-1]}
    return out


# ---------------------------------------------------------------------------------------- runners
class WindowData:
    """A minimal DataModule for the benchmark: micro-batches of ``dataset`` grouped into accumulation windows
    (``connect`` as :class:`~grasp_lightning.datamodule.GraspDataModule`)."""

    def __init__(self, dataset) -> None:
        import lightning as L

        class _DM(L.LightningDataModule):
            def __init__(self):
                super().__init__()
                self.window, self.repeat = 1, 1

            def connect(self, window=1, repeat=1, draws=False, data_mode=None):
                self.window, self.repeat = window, repeat

            def train_dataloader(self):
                from grasp_lightning.data.windows import WindowLoader

                groups = [[dataset[i * self.window + j] for j in range(self.window)]
                          for i in range(len(dataset) // self.window)]
                return WindowLoader(groups, self.window, self.repeat)

        self.module = _DM()


def run_ours(model_dir: Path, dataset, *, k: int, max_new_tokens: int, beta: float, share: bool, steps: int,
             seed: int = 0, accumulate: int = 1, rollout_batch_prompts: int | None = None) -> list[dict]:
    """Our GraspModule + GRPOTask under a Lightning Trainer; one record per micro-batch."""
    import lightning as L

    from grasp_lightning.callbacks.timing import StepTiming
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.module import GraspModule, OptimConfig
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.tasks.grpo import BatchingConfig, ComputeConfig, GRPOTask, LossConfig, RewardConfig

    class Meter(L.Callback):
        def __init__(self):
            self.meter, self.records, self.last = None, [], None

        def on_train_start(self, trainer, pl_module):
            self.meter = ForwardMeter(pl_module.tokenizer, [pl_module.policy, pl_module.reference_model])
            self.last = (time.perf_counter(), time.process_time())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now = (time.perf_counter(), time.process_time())
            self.records.append({"step_s": now[0] - self.last[0], "cpu_s": now[1] - self.last[1], **self.meter.take()})
            self.last = now

    torch.manual_seed(seed)
    timing, meter = StepTiming(), Meter()
    task = GRPOTask(reward=RewardConfig(terms=["accuracy", "format"]), loss=LossConfig(beta=beta, type="grpo"),
                    compute=ComputeConfig(share_prompt=share),
                    batching=BatchingConfig(rollout_batch_prompts=rollout_batch_prompts))
    module = GraspModule(task, policy=PolicyConfig(name_or_path=str(model_dir), dtype="float32",
                                                   attn_implementation="sdpa", freeze_vision=True),
                         rollout=RolloutConfig(num_generations=k, max_new_tokens=max_new_tokens, temperature=1.0,
                                               top_p=1.0, stop_at_answer=False),
                         optim=OptimConfig(lr=1e-5, scheduler="constant"))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, precision="32-true", callbacks=[timing, meter],
                        accumulate_grad_batches=accumulate)
    trainer.fit(module, datamodule=WindowData(dataset).module)
    meter.meter.close()
    records = []
    for m, t in zip(meter.records, timing.history):
        records.append({**m, "rollout_s": t["time/rollout_s"], "scoring_s": t["time/scoring_s"],
                        "update_s": t["time/update_s"], "data_wait_s": t["time/data_wait_s"],
                        "overhead_fraction": t["time/overhead_fraction"],
                        "task_prompt_tokens": t.get("throughput/prompt_tokens_per_step", 0.0)})
    return records


def run_trl(model_dir: Path, items, images, *, k: int, batch: int, max_new_tokens: int, beta: float, steps: int,
            seed: int = 0, accumulate: int = 1) -> list[dict]:
    """TRL 1.16 ``GRPOTrainer`` on CPU (``use_cpu=True, bf16=False``) on the same image prompts."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    def reward_format(completions, **kwargs):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [float("<answer>" in t) for t in texts]

    class Meter(TrainerCallback):
        def __init__(self):
            self.meter, self.records, self.last = None, [], None

        def on_train_begin(self, args, state, control, **kw):
            self.last = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kw):
            now = (time.perf_counter(), time.process_time())
            self.records.append({"step_s": now[0] - self.last[0], "cpu_s": now[1] - self.last[1], **self.meter.take()})
            self.last = now

    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    rows = [{"prompt": image_messages(it), "image": im} for it, im in zip(items, images)]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=batch * k,
                          num_generations=k, max_completion_length=max_new_tokens, max_steps=steps, learning_rate=1e-5,
                          lr_scheduler_type="constant", beta=beta, loss_type="grpo", temperature=1.0, top_p=1.0,
                          top_k=0, logging_steps=1, report_to="none", save_strategy="no", shuffle_dataset=False,
                          dataloader_num_workers=0, gradient_accumulation_steps=accumulate,
                          steps_per_generation=accumulate, disable_tqdm=True, seed=seed)
        meter = Meter()
        trainer = GRPOTrainer(model=model, reward_funcs=[reward_format], args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=processor, callbacks=[meter])
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # keep stdout for our summary lines
        meter.meter = ForwardMeter(processor.tokenizer, [trainer.model, trainer.ref_model])
        trainer.train()
        meter.meter.close()
    return meter.records


# ---------------------------------------------------------------------------------------- main
def quiet() -> None:
    """Silence per-step library logging so the JSON stays the last line."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric",
                 "transformers", "trl", "grasp_lightning", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen3_vl,qwen3_5",
                   help="comma-separated model families (qwen3_vl, qwen3_5: built at --hidden/--layers) or checkpoint "
                   "directories; each runs every variant with the same settings")
    p.add_argument("--k", type=int, default=8, help="completions per prompt (group size)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (both frameworks run a reference)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per variant")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the statistics")
    p.add_argument("--image-side", type=int, default=256, help="image side in pixels (16 px per visual token)")
    p.add_argument("--video-seconds", type=float, default=8.0, help="clip length for (d), sampled at 2 fps")
    p.add_argument("--frame-side", type=int, default=64, help="video frame side in pixels")
    p.add_argument("--hidden", type=int, default=256, help="text model width of a built family")
    p.add_argument("--layers", type=int, default=4, help="text model layers of a built family (qwen3_5: 3 linear + "
                   "1 full attention per 4)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable on a shared machine)")
    p.add_argument("--variants", default=None, help="default: trl_image,ours_image,ours_naive_image,ours_video; "
                   "with --accumulate > 1: ours_per_micro,ours_rollout_batch,trl_rollout_batch")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step (> 1: step comparison)")
    return p.parse_args(argv)


def per_optimizer_step(records: list[dict], accumulate: int) -> list[dict]:
    """Micro-batch records summed into optimizer steps of ``accumulate`` micro-batches."""
    steps = []
    for i in range(0, len(records) - accumulate + 1, accumulate):
        group = records[i: i + accumulate]
        steps.append({key: sum(float(r[key]) for r in group) for key in group[0] if key != "overhead_fraction"})
    return steps


def optimizer_steps(name: str, model_dir: Path, args, items, images) -> dict:
    """One model's optimizer-step comparison (``--accumulate`` > 1): see the module docstring, (e)–(g)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    a, b = args.accumulate, args.prompts
    common = dict(k=args.k, max_new_tokens=args.max_new_tokens, beta=args.beta, steps=args.steps + args.warmup,
                  accumulate=a)
    results: dict = {"model": describe_model(model_dir)}
    for variant in (args.variants or "ours_per_micro,ours_rollout_batch,trl_rollout_batch").split(","):
        t0 = time.perf_counter()
        if variant == "trl_rollout_batch":
            recs = run_trl(model_dir, items, images, batch=b, **common)
        elif variant in ("ours_per_micro", "ours_rollout_batch"):
            micro = run_ours(model_dir, ImagePrompts(processor, items, images, b), share=True,
                             rollout_batch_prompts=b if variant == "ours_per_micro" else None, **common)
            recs = per_optimizer_step(micro, a)
        else:
            raise SystemExit(f"unknown variant {variant!r}")
        results[variant] = r = summarise(recs, args.warmup)
        if "rollout_s" in r:
            r["rollout_share"] = r["rollout_s"] / r["step_s"]
            r["update_share"] = r["update_s"] / r["step_s"]
        print(f"{name} {variant}: median {r['step_s']:.3f} s/optimizer step ({time.perf_counter() - t0:.0f} s total)",
              flush=True)
    if "ours_per_micro" in results and "ours_rollout_batch" in results:
        results["optimizer_step_speedup"] = results["ours_per_micro"]["step_s"] / results["ours_rollout_batch"]["step_s"]
        results["optimizer_step_speedup_cpu"] = (results["ours_per_micro"]["cpu_s"]
                                                 / results["ours_rollout_batch"]["cpu_s"])
    if "trl_rollout_batch" in results and "ours_rollout_batch" in results:
        results["ratio_vs_trl"] = results["ours_rollout_batch"]["step_s"] / results["trl_rollout_batch"]["step_s"]
        results["ratio_vs_trl_cpu"] = results["ours_rollout_batch"]["cpu_s"] / results["trl_rollout_batch"]["cpu_s"]
    return results


def grpo_steps(name: str, model_dir: Path, args, items, images) -> dict:
    """One model's per-step comparison: variants (a)–(d), their ratios and prompt-token counts."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    common = dict(k=args.k, max_new_tokens=args.max_new_tokens, beta=args.beta, steps=args.steps + args.warmup)
    probe = ImagePrompts(processor, items, images, args.prompts)[0]
    results: dict = {"model": describe_model(model_dir), "image_prompt_tokens": int(probe.inputs["input_ids"].shape[1]),
                     "image_visual_tokens": int((probe.inputs["mm_token_type_ids"][0] != 0).sum())}
    for variant in (args.variants or "trl_image,ours_image,ours_naive_image,ours_video").split(","):
        t0 = time.perf_counter()
        if variant == "trl_image":
            recs = run_trl(model_dir, items, images, batch=args.prompts, **common)
        elif variant in ("ours_image", "ours_naive_image"):
            recs = run_ours(model_dir, ImagePrompts(processor, items, images, args.prompts),
                            share=variant == "ours_image", **common)
        elif variant == "ours_video":
            recs = run_ours(model_dir, VideoPrompts(processor, items, args.prompts, args.video_seconds,
                                                    args.frame_side), share=True, **common)
        else:
            raise SystemExit(f"unknown variant {variant!r}")
        results[variant] = r = summarise(recs, args.warmup)
        r["prompt_tokens_per_group"] = r["prompt_tokens"] / args.prompts
        print(f"{name} {variant}: median {r['step_s']:.3f} s/step ({time.perf_counter() - t0:.0f} s total)", flush=True)
    shared, naive, trl = (results.get(v) for v in ("ours_image", "ours_naive_image", "trl_image"))
    if trl and shared:
        results["ratio_vs_trl"] = shared["step_s"] / trl["step_s"]
        results["ratio_vs_trl_cpu"] = shared["cpu_s"] / trl["cpu_s"]
    if trl and naive:
        results["ratio_naive_vs_trl"] = naive["step_s"] / trl["step_s"]
    if shared and naive:
        results["speedup_vs_naive"] = naive["step_s"] / shared["step_s"]
        results["speedup_vs_naive_cpu"] = naive["cpu_s"] / shared["cpu_s"]
        results["prompt_tokens_naive_over_shared"] = naive["prompt_tokens_per_group"] / shared["prompt_tokens_per_group"]
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    quiet()
    torch.set_num_threads(args.threads)
    total = args.steps + args.warmup
    n = args.prompts * total * args.accumulate
    items = read_items(n)
    images = [make_image(i, args.image_side) for i in range(n)]
    report = {"benchmark": "grpo_step", "k": args.k, "max_new_tokens": args.max_new_tokens, "beta": args.beta,
              "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
              "sizes": {"hidden": args.hidden, "layers": args.layers, "image_side": args.image_side}}
    if args.accumulate > 1:
        report.update(mode="optimizer_step", accumulate=args.accumulate, prompts_per_micro_batch=args.prompts)
        compare, max_frames = optimizer_steps, 4
    else:
        report.update(prompts_per_step=args.prompts, video_seconds=args.video_seconds)
        compare, max_frames = grpo_steps, int(args.video_seconds * 2)
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(args.models, Path(tmp), hidden=args.hidden, layers=args.layers,
                              image_side=args.image_side, frame_side=args.frame_side, max_frames=max_frames)
        report["models"] = {name: compare(name, model_dir, args, items, images) for name, model_dir in models.items()}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
