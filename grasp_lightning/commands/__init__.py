"""The subcommands of ``python -m grasp_lightning``."""
