"""grasp_lightning: Lightning training of video MLLMs on GRASP (SFT, GRPO with the Social Grounding Reward).

Paper: GRASP, arXiv 2605.15764. Layout and data flow: ``docs/development.md`` ("Layout"); formats: ``docs/data-format.md``.
"""

__version__ = "0.1.0"
