"""Validation benchmarks as plugins: GRASP-Bench, MMSI, Online-MMSI, TVQA+ and HumanSense.

Select them in a config under ``data.benchmarks`` by ``class_path`` (``configs/benchmarks.yaml``);
``python -m grasp_lightning validate`` then writes one ``results.json`` section and one Markdown
table per benchmark. Interface: :class:`~grasp_lightning.benchmarks.base.Benchmark`.
"""

from grasp_lightning.benchmarks.base import Benchmark, TaskAccuracy, VideoStore
from grasp_lightning.benchmarks.grasp import GraspBench
from grasp_lightning.benchmarks.humansense import HumanSense
from grasp_lightning.benchmarks.mmsi import MMSI, OnlineMMSI
from grasp_lightning.benchmarks.tvqa import TVQAPlus

__all__ = ["Benchmark", "GraspBench", "HumanSense", "MMSI", "OnlineMMSI", "TVQAPlus", "TaskAccuracy", "VideoStore"]
