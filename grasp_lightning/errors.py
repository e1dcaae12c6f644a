"""Exception types of grasp_lightning: one small module, imported everywhere.

Every error about data names *where* (a file and line, an archive member, or an item id) and
*what* is wrong, so a user can open the file and fix it.
"""

from __future__ import annotations

import math


class GraspError(Exception):
    """Base class of every error raised on purpose by grasp_lightning."""


class GraspDataError(GraspError, ValueError):
    """A data item, file or archive is unusable.

    Args:
        where: the place, e.g. ``"train/data_rl.jsonl:12"``, ``"bench.tar:json/x.json"`` or an
            item id.
        reason: what is wrong, in words a user can act on.
    """

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class GraspFormatError(GraspDataError):
    """A JSON/JSONL record does not follow the GRASP schema (bad JSON, missing key, unknown category)."""


class ClipNotFoundError(GraspDataError):
    """A referenced clip is in neither the tar shards nor the extracted folder."""


class ClipDecodeError(GraspDataError):
    """A clip exists but cannot be decoded (corrupt, truncated or empty video)."""


class ArchiveError(GraspDataError):
    """A tar shard is truncated, corrupt, or holds an unsafe member (absolute path, ``..``, link)."""


class TokenBudgetError(GraspDataError):
    """A multimodal prompt is longer than the token budget; it is never truncated."""


class GraspConfigError(GraspError, ValueError):
    """A configuration value is invalid or two values contradict each other."""


def is_number(value: object) -> bool:
    """True for a finite ``int`` or ``float`` (``bool`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: object, optional: bool = False) -> bool:
    """True for an integer-valued number >= 1 (``None`` too when ``optional``)."""
    return (optional and value is None) or (is_number(value) and float(value).is_integer() and value >= 1)


def require(ok: bool, key: str, want: str, value: object) -> None:
    """The settings check of every config dataclass and the DataModule.

    Raises:
        GraspConfigError: ``"<key> must be <want>, got <value>"`` unless ``ok``.
    """
    if not ok:
        raise GraspConfigError(f"{key} must be {want}, got {value!r}")
