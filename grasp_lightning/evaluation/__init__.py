"""Validation benchmarks as plugins: GRASP-Bench, MMSI, Online-MMSI, TVQA+ and HumanSense.

Select them in a config under ``data.benchmarks`` by ``class_path`` (``configs/eval_suites.yaml``);
``python -m grasp_lightning validate`` then writes one ``results.json`` section and one Markdown
table per benchmark. Interface: :class:`~grasp_lightning.evaluation.base.Benchmark`.
"""

from grasp_lightning.evaluation.base import Benchmark, TaskAccuracy, VideoStore
from grasp_lightning.evaluation.grasp_bench import GraspBench
from grasp_lightning.evaluation.humansense import HumanSense
from grasp_lightning.evaluation.mmsi import MMSI, OnlineMMSI
from grasp_lightning.evaluation.tvqa import TVQAPlus

__all__ = ["Benchmark", "GraspBench", "HumanSense", "MMSI", "OnlineMMSI", "TVQAPlus", "TaskAccuracy", "VideoStore"]
