"""The frozen vision tower once per window: its outputs kept with the rollout and fed to every later forward.

In a GRPO step each prompt's clip goes through the vision tower in the sampling prefill, the
reference model's scoring, the policy's training forward and, with ``num_iterations > 1`` or
importance sampling, the old-policy scoring, and again at every reuse of the window's rollouts. With the
tower frozen (``model.policy.freeze_vision``) and shared by the reference model (the
adapter-disabled LoRA policy, or a reference whose tower has the same weights), its output for a
clip is the same every time. :class:`VisionFeatures` keeps that output, one entry per clip or
image (per grid), and :func:`reuse_vision` hands it to the model instead of running the tower:
for the duration, the model's ``get_video_features``/``get_image_features`` (transformers'
Qwen3-VL and Qwen3.5 ``*Model`` methods, which the forward calls when it gets pixel values) look
each grid up and run the tower only for grids not yet seen, storing their outputs. The pixels and
grids are still passed, so M-RoPE positions (``get_rope_index``) and placeholder checks are
unchanged; only the tower's work is skipped.

Entries are found by content, not by position: a key is the medium, the grid ``(t, h, w)`` and an
exact integer fingerprint of the grid's patch rows (the float bits summed with two position
weightings in int64), so the lookup works for whichever layout asks (the ``B`` shared prompts, the
``B*K`` naive rows, the groups :func:`grasp_lightning.grpo.rollouts.take_groups` keeps). The features are
never checkpointed (derived from the data, they grow with the model and the clip: about 184 MiB for a
30 s clip at 8B widths); a run resumed inside a window encodes its restored prompts again.
The fingerprint is a hash: two different clips colliding on all of grid, patch count and both sums
is not excluded, only far-fetched.

Exactness: the tower's output for a clip does not depend on the other clips of its batch (Qwen's
vision attention is per grid, ``cu_seqlens``), so a reused output equals a recomputed one up to the
float rounding of differently shaped matmuls; a frozen tower has no parameter gradient, so the
language model's gradients are the same (``tests/unit/grpo/test_vision.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import weakref
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

#: The model methods that run the tower, with the medium name used in keys.
FEATURE_METHODS = (("get_video_features", "video"), ("get_image_features", "image"))
#: (pixel key, grid key, medium) of the inputs whose features are kept.
PIXEL_KEYS = (("pixel_values_videos", "video_grid_thw", "video"), ("pixel_values", "image_grid_thw", "image"))
_WARNED: set[int] = set()  # towers whose training was reported (once each)
#: other tower -> {this tower: equal weights}, for :meth:`VisionFeatures.serves` (weak: models come and go)
_SAME_TOWER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def inner_module(model, *attributes: str) -> torch.nn.Module | None:
    """The first of ``model`` (through a peft wrapper, ``get_base_model``) and its ``.model`` level that has
    every one of ``attributes``, or ``None``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for candidate in (base, getattr(base, "model", None)):
        if candidate is not None and all(hasattr(candidate, name) for name in attributes):
            return candidate
    return None


def vision_core(model) -> torch.nn.Module | None:
    """The module holding ``visual`` and the ``get_*_features`` methods (``Qwen3VLModel``), or ``None``.

    Looks through a peft wrapper (``get_base_model``) and the ``*ForConditionalGeneration.model`` level.
    """
    return inner_module(model, "visual", "get_video_features")


def trained_vision_parameters(model) -> list[str]:
    """Names of the vision tower's parameters that require grad (empty when it is frozen or absent)."""
    core = vision_core(model)
    if core is None:
        return []
    return [f"visual.{name}" for name, p in core.visual.named_parameters() if p.requires_grad]


def fingerprint(medium: str, patches: torch.Tensor, grid: torch.Tensor) -> tuple:
    """An exact content key of one grid's patch rows ``(P, D)``: medium, grid, ``P`` and two int64 sums.

    The float bits are read as integers (``int16`` for 2-byte dtypes, ``int32`` for float32,
    ``int64`` for float64) and summed with row and column weights ``1 .. P`` and ``1 .. D``, so the
    key is independent of memory layout and thread count (integer sums are exact).
    """
    bits_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[patches.element_size()]
    bits = patches.contiguous().view(bits_dtype).reshape(patches.shape[0], -1).long()
    rows = torch.arange(1, bits.shape[0] + 1, device=bits.device)
    cols = torch.arange(1, bits.shape[1] + 1, device=bits.device)
    return (medium, *(int(x) for x in grid.tolist()), int(patches.shape[0]),
            int((bits.sum(1) * rows).sum()), int((bits.sum(0) * cols).sum()))


@dataclass
class VisionFeatures:
    """The vision tower's outputs of a window's grids (clips and images), found by :func:`fingerprint`.

    Attributes:
        entries: key -> ``(embeds (T, D_text), deepstack)``, ``T`` the grid's merged visual tokens;
            ``deepstack`` is Qwen3-VL's per-layer ``(T, D_text)`` features (a list), ``None`` for Qwen3.5.
        tower: the vision module the outputs came from (``None``: the first model it serves becomes it).
        computed: grids the tower encoded while this object was in use (misses).
        reused: grids served from ``entries`` (hits).
    """

    entries: dict[tuple, tuple[torch.Tensor, list[torch.Tensor] | None]] = field(default_factory=dict)
    tower: torch.nn.Module | None = None
    computed: int = 0
    reused: int = 0
    _inside: bool = False

    @classmethod
    def for_model(cls, model) -> "VisionFeatures | None":
        """An empty store for ``model``'s frozen tower; ``None`` (today's path, a warning naming the
        parameters) when the tower trains, ``None`` silently when the model has no vision tower."""
        core = vision_core(model)
        if core is None:
            return None
        trained = trained_vision_parameters(model)
        if trained and id(core.visual) not in _WARNED:
            _WARNED.add(id(core.visual))
            log.warning("vision features are recomputed at every forward: the vision tower trains "
                        "(%s%s require grad; model.policy.freeze_vision is false)", trained[:2],
                        " ..." if len(trained) > 2 else "")
        if trained:
            return None
        return cls(tower=core.visual)

    def serves(self, model) -> bool:
        """Whether ``model``'s tower is this store's: the same module (the policy, or its adapter-disabled
        self as reference), or a frozen one with equal weights (a reference from the same checkpoint;
        compared once per module)."""
        core = vision_core(model)
        if core is None or trained_vision_parameters(model):
            return False
        if self.tower is None or core.visual is self.tower:
            self.tower = core.visual
            return True
        known = _SAME_TOWER.setdefault(core.visual, weakref.WeakKeyDictionary())
        if self.tower not in known:  # frozen towers do not change: compared once per pair of modules
            mine, theirs = self.tower.state_dict(), core.visual.state_dict()
            known[self.tower] = mine.keys() == theirs.keys() and all(
                torch.equal(mine[n], theirs[n].to(mine[n].device)) for n in mine)
            if not known[self.tower]:
                log.warning("the reference model's vision tower differs from the policy's: its clips are encoded again")
        return known[self.tower]

    def merge(self, other: "VisionFeatures | None") -> "VisionFeatures":
        """This store with ``other``'s entries added (rollouts of several generation calls)."""
        if other is not None and other is not self:
            self.entries.update(other.entries)
            self.computed += other.computed
            self.reused += other.reused
        return self

    def _wrap(self, medium: str, original):
        """``get_<medium>_features`` that serves stored grids and stores the ones it computes."""

        signature = inspect.signature(original)
        first, second = list(signature.parameters)[:2]  # (pixel_values[_videos], image|video_grid_thw)

        @functools.wraps(original)  # generate() reads the parameter names to pre-encode the pixels
        def features(*args, **kwargs):
            if self._inside:  # get_video_features calls get_image_features: one lookup per call from the forward
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            pixel_values, grid_thw = bound.arguments[first], bound.arguments.get(second)
            kwargs = dict(bound.arguments.get("kwargs", {}))
            sizes = grid_thw.prod(-1).tolist()
            keys = [fingerprint(medium, chunk, grid) for chunk, grid in zip(torch.split(pixel_values, sizes), grid_thw)]
            first_of = {key: i for i, key in reversed(list(enumerate(keys)))}  # a clip repeated K times: encoded once
            missing = sorted(i for key, i in first_of.items() if key not in self.entries)
            if missing:
                rows = torch.tensor(missing, device=grid_thw.device)
                pixels = torch.cat([torch.split(pixel_values, sizes)[i] for i in missing])
                self._inside = True
                try:
                    out = original(pixels, grid_thw.index_select(0, rows), **kwargs)
                finally:
                    self._inside = False
                deep = getattr(out, "deepstack_features", None)
                for j, i in enumerate(missing):
                    self.entries[keys[i]] = (out.pooler_output[j].detach(),
                                             None if deep is None else [d[j].detach() for d in deep])
                self.computed += len(missing)
                self.reused += len(keys) - len(missing)
            else:
                self.reused += len(keys)
                out = None
            device = pixel_values.device
            found = [self.entries[key] for key in keys]
            pooled = tuple(e.to(device) for e, _ in found)
            if out is None:
                from transformers.modeling_outputs import BaseModelOutputWithPooling

                out = BaseModelOutputWithPooling(pooler_output=pooled)
            else:
                out.pooler_output = pooled
            if found and found[0][1] is not None:
                out.deepstack_features = [tuple(d[layer].to(device) for _, d in found)
                                          for layer in range(len(found[0][1]))]
            return out

        return features


@contextlib.contextmanager
def reuse_vision(model, features: VisionFeatures | None):
    """For the duration, ``model``'s vision features come from ``features`` where it holds them.

    A no-op when ``features`` is ``None`` or does not serve the model (:meth:`VisionFeatures.serves`:
    a trained tower, or a reference with a different one). Grids not yet held are encoded by the
    tower and stored. The model's own ``get_*_features`` are restored on exit.
    """
    core = vision_core(model) if features is not None else None
    if core is None or not features.serves(model):
        yield
        return
    patched = []
    for name, medium in FEATURE_METHODS:
        if hasattr(core, name) and name not in vars(core):
            setattr(core, name, features._wrap(medium, getattr(core, name)))
            patched.append(name)
    try:
        yield
    finally:
        for name in patched:
            delattr(core, name)


class VisionForwardCounter:
    """Counts the grids (clips and images) the vision tower of ``model`` encodes while installed.

    A forward pre-hook on the tower module (``visual``) adds the rows of its ``grid_thw`` argument;
    used as a context manager. ``grids`` is the count so far.
    """

    def __init__(self, model) -> None:
        core = vision_core(model)
        if core is None:
            raise ValueError(f"{type(model).__name__} has no vision tower to count")
        self.tower, self.grids, self.calls, self._handle = core.visual, 0, 0, None

    def _hook(self, module, args, kwargs) -> None:
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        self.grids += 0 if grid is None else int(grid.shape[0])
        self.calls += 1

    def __enter__(self) -> "VisionForwardCounter":
        self._handle = self.tower.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()
