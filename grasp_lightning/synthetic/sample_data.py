"""The sample data generator's entry point: ``python -m grasp_lightning.synthetic.sample_data OUT_DIR``.

Usage::

    python -m grasp_lightning.synthetic.sample_data OUT_DIR [--seed 0] [--real-clip PATH]

The generator itself is the package :mod:`grasp_lightning.synthetic.sample` (drawing, questions,
entries, writer; :func:`~grasp_lightning.synthetic.sample.writer.generate_sample`); this module is its command.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Sequence

from grasp_lightning.synthetic.sample.writer import generate_sample


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m grasp_lightning.synthetic.sample_data OUT_DIR [--seed 0] [--real-clip PATH] [--clips-per-shard 8]``."""
    parser = argparse.ArgumentParser(prog="python -m grasp_lightning make-sample", description="Generate a small GRASP-format sample dataset.")
    parser.add_argument("out_dir", type=Path, help="output root (train/, test/, README.md)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument("--real-clip", type=Path, default=None,
                        help="kitchen_two_person.mp4 (default: the copy in the shipped sample)")
    parser.add_argument("--clips-per-shard", type=int, default=8, help="clips per train tar shard")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    generate_sample(args.out_dir, args.seed, args.real_clip, args.clips_per_shard)


if __name__ == "__main__":
    main()
