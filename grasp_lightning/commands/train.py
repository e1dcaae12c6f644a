"""Command line: ``python -m grasp_lightning fit|validate|test|predict --config ...`` (LightningCLI),
and ``python -m grasp_lightning export --config ... --ckpt_path ... --out ...`` (:mod:`grasp_lightning.commands.export`).

Several ``--config`` files compose (a recipe, then overrides such as ``configs/demo.yaml``), every
key can be overridden on the command line (``--model.optim.lr 1e-5``), and ``--print_config``
prints the resolved configuration. The processor of the DataModule is linked to the policy, so a
checkpoint is named once.
"""

from __future__ import annotations

import logging
import os
import sys

from lightning.pytorch.cli import LightningCLI

from grasp_lightning.datamodule import GraspDataModule
from grasp_lightning.module import GraspModule


class GraspCLI(LightningCLI):
    """LightningCLI with the links between model and data that GRASP needs."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.policy.name_or_path", "data.processor")
        parser.link_arguments("model.policy.trust_remote_code", "data.trust_remote_code")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m grasp_lightning`` and the ``grasp-lightning`` script."""
    logging.basicConfig(level=os.environ.get("GRASP_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "check-data":  # dataset checks before training (grasp_lightning/commands/check_data.py)
        from grasp_lightning.commands.check_data import main as check_data_main

        sys.exit(check_data_main(args[1:]))
    if args and args[0] == "pipeline":  # multi-stage recipes, e.g. SFT -> SGR (grasp_lightning/commands/pipeline.py)
        from grasp_lightning.commands.pipeline import main as pipeline_main

        sys.exit(pipeline_main(args[1:]))
    if args and args[0] == "plan-memory":  # per-GPU memory of a config (grasp_lightning/planning/memory.py)
        from grasp_lightning.planning.memory import main as memory_main

        sys.exit(memory_main(args[1:]))
    if args and args[0] == "export":  # checkpoint -> Hugging Face directory (grasp_lightning/commands/export.py)
        from grasp_lightning.commands.export import main as export_main

        export_main(args[1:])
        return
    GraspCLI(GraspModule, GraspDataModule, args=args, save_config_kwargs={"overwrite": True},
             auto_configure_optimizers=False,
             parser_kwargs={"default_env": False})


if __name__ == "__main__":
    main()
