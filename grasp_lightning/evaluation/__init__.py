"""Evaluation suites as plugins: GRASP-Bench, MMSI, Online-MMSI, TVQA+, HumanSense and generic QA files.

GRASP-Bench (``data.source.bench``) always runs; select the others in a config under ``data.eval_suites``
by ``class_path`` (``configs/eval_suites.yaml``). ``python -m grasp_lightning validate`` then writes
one ``results.json`` section and one Markdown table per suite. Interface:
:class:`~grasp_lightning.evaluation.base.EvalSuite`; per-epoch routing and scoring:
:class:`~grasp_lightning.evaluation.suite.SuiteRunner`.
"""

from grasp_lightning.evaluation.base import CategoryAccuracy, EvalSuite, SuiteReport, VideoStore
from grasp_lightning.evaluation.grasp_bench import GraspBench
from grasp_lightning.evaluation.humansense import HumanSense
from grasp_lightning.evaluation.mmsi import MMSI, OnlineMMSI
from grasp_lightning.evaluation.qa_suite import QASuite
from grasp_lightning.evaluation.suite import SuiteRunner
from grasp_lightning.evaluation.tvqa import TVQAPlus

__all__ = ["EvalSuite", "GraspBench", "HumanSense", "MMSI", "OnlineMMSI", "QASuite", "SuiteReport", "SuiteRunner",
           "TVQAPlus", "CategoryAccuracy", "VideoStore"]
