"""Task plugins, one file per training objective: ``sft.py`` (SFTTask) and ``grpo.py`` (GRPOTask:
GRPO and GRPO-SGR). A config names one by ``class_path``; the interface is ``grasp_lightning/task.py``."""
