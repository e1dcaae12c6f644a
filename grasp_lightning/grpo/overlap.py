"""GRPO rollouts overlapped with the update (``model.rollout.overlap: 1``): one step off-policy.

While the trainer runs optimizer step ``t`` on window ``t``, the vLLM server samples window ``t+1``
with the weights of step ``t-1`` (the ones step ``t`` starts from): at the first micro-batch of window ``t``
the task collects that window's completions (submitted one step earlier), syncs the server to the current
weights, submits window ``t+1`` (read ahead with :meth:`grasp_lightning.data.windows.Window.peek`, not
consumed), and only then scores window ``t`` (rewards, old-policy and reference log-probs) and trains on
it, while the server samples. The same schedule as NeMo-RL's and verl's one-step off-policy GRPO.

* **Staleness** is the number of optimizer steps between the weights that sampled a window and the weights
  it is trained from: 0 for a window sampled on the spot (the first of an epoch, the first after a
  resume), 1 for every prefetched one; more than 1 raises (never more than one step stale).
* **Old-policy log-probs** are the trainer's own, computed before the update (as without overlap), and
  the truncated importance-sampling correction ``min(exp(logp_old − logp_server), cap)`` (TRL's
  ``vllm_importance_sampling_correction``) corrects for the stale sampler; it is on whenever overlap is
  (:data:`DEFAULT_OVERLAP_CAP` unless ``importance_sampling_cap`` is set).
* **Resume.** The request in flight is not in the checkpoint: a resumed run samples that window again
  with the restored weights and logs it (``state_dict`` records its dataset indices). The DataModule's
  resume position counts consumed micro-batches only, never a window read ahead, so no sample is lost or
  repeated.
* **Refused** (:func:`check_overlap`): ``num_iterations > 1`` (a window would be reused while the next
  one is sampled from weights older than its own) and ``dynamic_sampling: refill`` (refill draws further
  windows from the stream, the one read ahead among them). ``drop`` works.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from grasp_lightning.data.collate import Batch
from grasp_lightning.engines.base import PendingSample
from grasp_lightning.errors import GraspConfigError, GraspError
from grasp_lightning.grpo.vision import reuse_vision
from grasp_lightning.step_metrics import Max, Mean, RankMean

log = logging.getLogger(__name__)

#: ``importance_sampling_cap`` when ``model.rollout.overlap`` is on and the cap is unset: TRL's default.
DEFAULT_OVERLAP_CAP = 2.0
#: the most optimizer steps a sampled batch may lag the weights it is trained from.
MAX_STALENESS = 1


def check_overlap(num_iterations: int, dynamic_sampling: str) -> None:
    """The GRPO settings that cannot run with ``model.rollout.overlap: 1``.

    Raises:
        GraspConfigError: ``num_iterations > 1`` or ``dynamic_sampling: refill``, naming both settings.
    """
    if num_iterations > 1:
        raise GraspConfigError(f"model.rollout.overlap=1 with model.task.init_args.loss.num_iterations={num_iterations}: "
                               "a reused window would be trained while the next is sampled from weights older "
                               "than its own; set num_iterations=1 or overlap=0")
    if dynamic_sampling == "refill":
        raise GraspConfigError("model.rollout.overlap=1 with model.task.init_args.batching.dynamic_sampling=refill: refill "
                               "draws further windows from the stream, among them the one sampled ahead; use "
                               "dynamic_sampling=drop or off, or overlap=0")


@dataclass
class OverlapStats:
    """The overlap figures of the last window sampled ahead.

    Attributes:
        staleness: optimizer steps between the weights that sampled it and the weights it trains from
            (the largest of its generation calls).
        generation_s: seconds of generation; ``hidden_s``: of them, hidden behind the trainer's work;
            ``wait_s``: seconds the trainer waited for the server.
    """

    staleness: float
    generation_s: float
    hidden_s: float
    wait_s: float


@dataclass
class _Request:
    """One generation call of a window: its merged micro-batches, prompt, sharing, vision store, pending sample."""

    batch: Batch
    prompt: dict
    share: bool
    vision: object
    pending: PendingSample


class RolloutPrefetch:
    """The next window's requests in flight and the overlap figures of the last window (see the module docstring).

    Attributes:
        in_flight: dataset indices of each generation call of the window submitted ahead, or ``None``.
        resumed_in_flight: ``in_flight`` as the checkpoint recorded it (a resumed run samples it again).
    """

    def __init__(self) -> None:
        self._requests: list[_Request] = []
        self.in_flight: tuple | None = None
        self.resumed_in_flight: tuple | None = None
        self._stats: OverlapStats | None = None

    @staticmethod
    def _key(chunks: list[Batch]) -> tuple:
        return tuple(tuple(int(i) for i in c.indices) for c in chunks)

    def _submit(self, task, ctx, chunks: list[Batch]) -> tuple[list[_Request], float]:
        """Submit one request per generation call (the engine syncs its weights to the current step first);
        returns them and the seconds spent syncing weights."""
        policy, engine = ctx.policy, ctx.rollout_engine
        was_training = policy.training
        policy.eval()
        requests, sync = [], 0.0
        try:
            for chunk in chunks:
                prompt, share, vision = task.prompt_inputs(ctx, chunk)
                with reuse_vision(policy, vision):  # the embeddings sent to the server are kept in ``vision``
                    pending = engine.submit(policy, ctx.tokenizer, prompt, ctx.rollout_cfg,
                                            policy_version=ctx.policy_version)
                sync += engine.weight_sync_seconds
                requests.append(_Request(chunk, prompt, share, vision, pending))
        finally:
            policy.train(was_training)
        return requests, sync

    def sample(self, task, ctx, chunks: list[Batch], window, chunked) -> list:
        """This window's rollouts, one per generation call in ``chunks``, and the next window submitted.

        Args:
            task: the :class:`~grasp_lightning.tasks.grpo.GRPOTask` (scores the completions).
            ctx: the task context (``ctx.rollout_engine`` samples; ``ctx.policy_version`` = optimizer steps taken).
            chunks: the window's generation calls (merged micro-batches), on the device.
            window: the window (:class:`~grasp_lightning.data.windows.Window`), or ``None``.
            chunked: turns a list of micro-batches into generation calls
                (:func:`~grasp_lightning.grpo.sampling.generation_calls`).

        Raises:
            GraspError: a window more than :data:`MAX_STALENESS` steps stale (a broken schedule).
            EngineError: the engine failed.
        """
        t0 = time.perf_counter()
        version = ctx.policy_version
        key = self._key(chunks)
        requests, sync = [], 0.0
        if self.in_flight is not None and self.in_flight == key:
            requests = self._requests
        elif self.in_flight is not None:
            log.warning("rollout overlap: the request in flight was for dataset indices %s, this window holds %s; "
                        "sampling this window now", list(self.in_flight), list(key))
        if not requests and chunks:
            if self.resumed_in_flight == key:
                log.warning("rollout overlap: the window in flight when the checkpoint was written (dataset "
                            "indices %s) was not saved with it; sampling it again now, with the restored weights",
                            list(key))
            requests, sync = self._submit(task, ctx, chunks)
        self.resumed_in_flight = None
        self._requests, self.in_flight = [], None
        engine = ctx.rollout_engine
        completions = [engine.collect(r.pending) for r in requests]
        stale = [version - r.pending.version for r in requests]
        for s in stale:
            if not 0 <= s <= MAX_STALENESS:
                raise GraspError(f"rollout overlap: a window sampled with the weights of {version - s} optimizer "
                                 f"steps is trained at step {version} ({s} steps stale, at most {MAX_STALENESS})")
        after = window.peek() if window is not None else None
        if after is not None:
            device = ctx.device
            following = chunked([b.to(device) for b in after])
            if following:
                self._requests, more = self._submit(task, ctx, following)
                self.in_flight = self._key(following)
                sync += more
        ros = []
        for i, (r, c) in enumerate(zip(requests, completions)):
            ros.append(task.score_rollout(ctx, r.batch, r.prompt, r.share, r.vision, c, t0=t0,
                                          generation_seconds=r.pending.generation_seconds,
                                          weight_sync_seconds=sync if i == 0 else 0.0))
        self._stats = OverlapStats(staleness=float(max(stale, default=0)),
                                   generation_s=sum(r.pending.generation_seconds for r in requests),
                                   hidden_s=sum(r.pending.hidden_seconds for r in requests),
                                   wait_s=sum(r.pending.wait_seconds for r in requests))
        return ros

    def metrics(self) -> dict:
        """The last window's overlap figures as step metrics (empty without overlap): ``rollout/staleness``
        (steps, the largest), ``rollout/overlap`` (seconds of generation hidden behind the trainer's work over
        seconds of generation, 0 … 1), ``time/generation_hidden_s`` and ``time/generation_wait_s`` (seconds
        the trainer waited for the server)."""
        st = self._stats
        if st is None:
            return {}
        return {"rollout/staleness": Max(st.staleness), "rollout/overlap": Mean(st.hidden_s, st.generation_s),
                "time/generation_hidden_s": RankMean(st.hidden_s), "time/generation_wait_s": RankMean(st.wait_s)}

    def state_dict(self) -> dict:
        """``{"in_flight": [[indices], ...]}`` when a request is in flight (it is sampled again on resume)."""
        return {} if self.in_flight is None else {"in_flight": [list(x) for x in self.in_flight]}

    def load_state_dict(self, state: dict) -> None:
        """Remember the window that was in flight, to log that it is sampled again."""
        flight = state.get("in_flight")
        self.resumed_in_flight = tuple(tuple(int(i) for i in x) for x in flight) if flight else None
        if flight:
            log.warning("rollout overlap: the checkpoint was written with the window of dataset indices %s in "
                        "flight; it is sampled again when its window comes", [list(x) for x in flight])
