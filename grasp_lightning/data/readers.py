"""Which reader reads a training file: chosen by the file's name up to its first dot.

``data_sft``, ``data_rl`` and ``annotations`` are the GRASP files (:mod:`grasp_lightning.data.formats`),
``qa`` the generic QA format (:mod:`grasp_lightning.data.qa`), so a split is named
``data_rl.easy.jsonl`` or ``qa.train.jsonl``; any other name has no reader and is refused by its
callers (the DataModule, ``check-data``) with the names expected. Schemas: ``docs/data-format.md``.
"""

from __future__ import annotations

from pathlib import Path

from grasp_lightning.data.formats import read_annotations, read_rl, read_sft
from grasp_lightning.data.qa import read_qa

#: The reader of each training file, by the file's stem (``data_sft.jsonl`` -> ``data_sft``).
READERS = {"data_sft": read_sft, "data_rl": read_rl, "annotations": read_annotations, "qa": read_qa}


def reader_for(path: str | Path):
    """The reader of a training file by its name up to the first dot (:data:`READERS`), or ``None`` for
    another name."""
    return READERS.get(Path(path).name.split(".")[0])
