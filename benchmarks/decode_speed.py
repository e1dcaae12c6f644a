"""Decode tokens/s of the HF engine: eager ``generate`` against the static cache and compiled decode step.

    python benchmarks/decode_speed.py [--backends aot_eager,inductor] [--k 4] [--new-tokens 32]

On the bundled tiny models of both families (Qwen3-VL, Qwen3.5), two RL prompts of the sample data
with their 8-frame clips, group-shared prefill, greedy decoding with no stop, float32:
:func:`grasp_lightning.engines.decoding.sample_completions` eager and with ``compile_decode`` per backend.
Each path runs once to warm up (the compile happens there; its seconds are reported as
``first_call_s``), then ``--repeats`` timed calls; tokens/s = generated tokens / the best timed call.
Also checks the compiled tokens equal the eager ones. Prints one JSON line.

A CPU figure says what the compiled step costs or saves on a CPU, nothing about a GPU: on a CPU the
decode step of a tiny model is launch- and Python-bound in both paths, inductor emits C++ (it needs a
C compiler) and there are no CUDA graphs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig

REPO = Path(__file__).resolve().parents[1]


ASSETS = REPO / "grasp_lightning" / "assets"
#: the two tiny model families shipped with the package
TINY_MODELS = {"qwen3_vl": ASSETS / "tiny-qwen3vl", "qwen3_5": ASSETS / "tiny-qwen3_5"}


def _datamodule(path: Path):
    """The sample data's RL rows (8 frames of 64 x 64 px), batch 2, for the tiny model at ``path``."""
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(ASSETS / "sample"), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=str(path)),
                         loader=LoaderConfig(data_mode="rl", batch_size=2, num_workers=0))
    dm.setup("fit")
    return dm


def load_model(path: Path, noise: float = 0.5):
    """The tiny model at ``path`` with seeded Gaussian noise on every weight (diverse greedy tokens), eval mode."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    """Time eager and compiled decoding per family and backend; print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="aot_eager,inductor")
    parser.add_argument("--k", type=int, default=4, help="completions per prompt (K)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from grasp_lightning.engines.decoding import sample_completions

    report: dict = {"device": "cpu", "threads": torch.get_num_threads(), "k": args.k, "new_tokens": args.new_tokens,
                    "torch": torch.__version__, "families": {}}
    for family, path in TINY_MODELS.items():
        dm = _datamodule(path)
        batch = next(iter(dm.train_dataloader()))
        inputs, tok = batch.inputs, dm.processor.tokenizer
        model = load_model(path)
        common = dict(num_return_sequences=args.k, max_new_tokens=args.new_tokens, do_sample=False, stop_strings=(),
                      share_prompt=True)
        rows: dict = {}
        reference = None
        for name in ["eager", *args.backends.split(",")]:
            torch._dynamo.reset()
            extra = {} if name == "eager" else dict(compile_decode=True, compile_backend=name)
            t0 = time.perf_counter()
            out = sample_completions(model, tok, inputs, **common, **extra)
            first = time.perf_counter() - t0
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                out = sample_completions(model, tok, inputs, **common, **extra)
                times.append(time.perf_counter() - t0)
            tokens = int(out.mask.sum())
            reference = out.ids if reference is None else reference
            rows[name] = {"first_call_s": round(first, 2), "best_s": round(min(times), 3),
                          "tokens_per_s": round(tokens / min(times), 1), "tokens": tokens,
                          "same_tokens_as_eager": bool(torch.equal(out.ids, reference))}
        report["families"][family] = rows
    print(json.dumps(report))


if __name__ == "__main__":
    main()
