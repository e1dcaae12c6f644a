"""Paths of the shipped assets: the repository, the tiny models of both families, the sample data, the real clip."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TINY = REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"

#: The offline tiny hybrid Qwen3.5 (3 Gated DeltaNet linear-attention layers + 1 full-attention layer).
TINY35 = REPO / "grasp_lightning" / "assets" / "tiny-qwen3_5"

#: Both tiny model families, for tests parametrised over them (``@pytest.mark.parametrize("family", FAMILIES)``).
TINY_MODELS = {"qwen3_vl": TINY, "qwen3_5": TINY35}

FAMILIES = tuple(TINY_MODELS)

SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"


def _real_clip() -> Path:
    """The real two-person clip: ``../shared`` beside the checkout when present, else the byte-identical
    copy shipped inside the sample shard (extracted once into a temporary file)."""
    for candidate in (REPO.parent / "shared/data/real/kitchen_two_person.mp4",
                      Path("/work/shared/data/real/kitchen_two_person.mp4")):
        if candidate.is_file():
            return candidate
    out = Path(tempfile.gettempdir()) / "grasp_lightning_kitchen_two_person.mp4"
    if not out.is_file():
        shard = SAMPLE / "train/videos/social-iq_part000.tar"
        with tarfile.open(shard) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("kitchen.two_person_qa0000.mp4"))
            out.write_bytes(tar.extractfile(member).read())
    return out


#: The real two-person clip (mp4), for decoders tested on real footage.
REAL_CLIP = _real_clip()
