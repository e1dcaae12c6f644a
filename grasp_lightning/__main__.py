"""``python -m grasp_lightning COMMAND ...`` (and the ``grasp-lightning`` script): the one dispatcher.

It looks ``COMMAND`` up in :data:`grasp_lightning.commands.COMMANDS` and runs that module's
``main``; ``--help`` (or no command) lists every command. Each command parses its own arguments
(``python -m grasp_lightning fit --help`` is LightningCLI's help).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from grasp_lightning.commands import COMMANDS
from grasp_lightning.errors import GraspError


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: only for ``--help`` and the usage of an unknown command."""
    parser = argparse.ArgumentParser(prog="python -m grasp_lightning",
                                     description="Train video MLLMs on GRASP: SFT and GRPO with the Social "
                                                 "Grounding Reward, and the tools around a run.",
                                     epilog="python -m grasp_lightning COMMAND --help shows a command's options.",
                                     formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=18,
                                                                                         width=110))
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, add_help=False)
    return parser


def configure_logging(level: str | int = "INFO") -> None:
    """One handler for every log line: the root logger's (``logging.basicConfig``, timestamped).

    ``import lightning`` gives the ``lightning`` logger a console handler of its own
    (``lightning/__init__.py``: ``INFO: ...``) while its records also propagate to the root logger, so
    every Lightning INFO line would be printed twice; that handler is removed here (Lightning's
    ``lightning.pytorch`` and ``lightning.fabric`` loggers add theirs only while the root has none).
    """
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import lightning  # noqa: F401  (adds the handler now, so that it can be removed before any line)

    lightning_logger = logging.getLogger("lightning")
    for handler in list(lightning_logger.handlers):
        if isinstance(handler, logging.StreamHandler):
            lightning_logger.removeHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named by the first argument; return its exit status.

    From the command line (``argv`` None), a :class:`grasp_lightning.errors.GraspError` (bad data or
    configuration) prints its message alone on stderr and returns 1; ``GRASP_TRACEBACK=1`` re-raises it.
    Called with ``argv``, it propagates.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0 if args else 2
    name = args[0]
    if name.startswith("-"):  # LightningCLI's own top-level options (e.g. --config FILE naming the subcommand)
        module, command_args = COMMANDS["fit"].module, args
    elif name in COMMANDS:
        command = COMMANDS[name]
        module, command_args = command.module, [name, *args[1:]] if command.lightning else args[1:]
    else:
        build_parser().error(f"unknown command {name!r} (choose from {', '.join(COMMANDS)})")
    configure_logging(os.environ.get("GRASP_LOG_LEVEL", "INFO"))
    try:
        status = importlib.import_module(module).main(command_args)
    except GraspError as e:
        if argv is not None or os.environ.get("GRASP_TRACEBACK"):
            raise  # called in process (tests, scripts): the caller gets the exception
        # the command line: the message names the key, file or item and what is wrong; a 60-line traceback
        # through LightningCLI would bury it
        print(f"error: {type(e).__name__}: {e}\n(GRASP_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1
    except Exception as e:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        if not isinstance(e, MisconfigurationException) or argv is not None or os.environ.get("GRASP_TRACEBACK"):
            raise
        # Lightning refusing the trainer settings (a GPU recipe on a machine without one): its message, one line
        print(f"error: {type(e).__name__}: {e} (the trainer settings: trainer.accelerator, trainer.devices, "
              f"trainer.strategy, trainer.precision; on a CPU add --config configs/demo.yaml after the recipe)"
              "\n(GRASP_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
