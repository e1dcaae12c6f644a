"""One rank of the two-rank vLLM weight-sync check (``tests/vllm/test_vllm_engine.py``), launched as ``torchrun``
would (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``), gloo on the CPU.

Each rank holds the same policy (as under DDP or ZeRO-2 after every step), starts its own vLLM server,
and for policy versions 1 and 2 perturbs the policy identically, samples greedily through its engine
(which syncs the weights first) and compares the tokens with ``generate`` on the policy; a barrier
closes each version, as the step's gradient all-reduce does in training. The rank writes
``<out>/rank<r>.json``: its weight writes, the files its server loaded (inode, bytes), and whether
every greedy sample matched.

Usage: ``python -m tests.vllm.vllm_two_ranks MODEL_DIR OUT_DIR SYNC_DIR`` (``GRASP_VLLM_PYTHON`` set).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from tests.helpers import SAMPLE, K, load_tiny_policy, perturb_weights, vllm_cfg


def main(model: str, out: str, sync_dir: str) -> None:
    """Run the check on this rank (see the module docstring)."""
    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.engines.decoding import RolloutConfig, sample_completions
    from grasp_lightning.engines.vllm import VLLMEngine

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=model),
                         loader=LoaderConfig(data_mode="rl", num_workers=0, batch_size=1, seed=0))
    dm.setup("fit")
    prompt = {k: v for k, v in next(iter(dm.train_dataloader())).inputs.items() if k != "labels"}
    tokenizer = dm.processor.tokenizer
    policy = load_tiny_policy(model)
    engine = VLLMEngine(vllm_cfg(os.environ["GRASP_VLLM_PYTHON"], weight_sync_dir=sync_dir,
                                 log_file=str(Path(out) / "server.log")), model_path=model, rank=rank)
    cfg = RolloutConfig(num_generations=K, max_new_tokens=12, stop_at_answer=False)
    matches = []
    try:
        for version in (1, 2):
            perturb_weights(policy, version)  # the same seed on both ranks: identical weights, as after a ZeRO-2 step
            got = engine.sample(policy, tokenizer, prompt, cfg, greedy=True, policy_version=version)
            want = sample_completions(policy, tokenizer, prompt, num_return_sequences=1, max_new_tokens=12,
                                      do_sample=False, stop_strings=())
            width, pad = max(got.ids.shape[1], want.ids.shape[1]), tokenizer.pad_token_id
            padded = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in (got.ids[:1], want.ids)]
            matches.append(bool(torch.equal(*padded)))
            dist.barrier()  # the step's all-reduce: no rank reaches the next version before all loaded this one
        result = {"rank": rank, "writes": engine.weight_writes, "bytes_written": engine.weight_bytes_written,
                  "loaded": engine.loaded_files, "matches": matches, "syncs": engine.weight_syncs,
                  "folder": str(engine.sync.path)}
    finally:
        engine.close()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
