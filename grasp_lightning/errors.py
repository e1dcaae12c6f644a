"""Exception types of grasp_lightning: one small module, imported everywhere.

Every error about data names *where* (a file and line, an archive member, or an item id) and
*what* is wrong, so a user can open the file and fix it.
"""

from __future__ import annotations


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
