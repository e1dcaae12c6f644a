"""The one config loader: a run's ``--config`` files and overrides, instantiated as ``fit`` would.

Commands that read a run's settings (``check-data``, ``plan-memory``, ``export``) call
:func:`load_run`: the training CLI (:func:`grasp_lightning.commands.train.build_cli`, ``run=False``)
parses the arguments exactly as for ``fit`` (configs composed in order, ``--key value`` overrides,
the model-data links, every default from the code's signatures) and instantiates the module (with
its task; :class:`~grasp_lightning.module.GraspModule` loads no weights until ``configure_model``),
the DataModule and the trainer's settings, without building the ``Trainer`` (a recipe for 8 GPUs
loads on a laptop). The commands then ask the objects, never the YAML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grasp_lightning.commands.train import build_cli

if TYPE_CHECKING:
    from jsonargparse import Namespace

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.module import GraspModule
    from grasp_lightning.task import Task


@dataclass
class Run:
    """A run's configuration, instantiated.

    Attributes:
        module: the :class:`GraspModule` (``task``, ``policy_cfg``, ``lora_cfg``, ``rollout_cfg``,
            ``optim``, ...), policy not loaded.
        datamodule: the :class:`GraspDataModule` (its settings: ``source.root``, ``video.fps``, ...).
        trainer: the ``Trainer``'s arguments (``precision``, ``devices``, ``num_nodes``,
            ``accumulate_grad_batches``, ``strategy`` / ``logger`` / ``callbacks`` instantiated).
        config: the parsed configuration (a command's own arguments are read from it).
    """

    module: GraspModule
    datamodule: GraspDataModule
    trainer: Namespace
    config: Namespace

    @property
    def task(self) -> Task:
        """The module's task plugin."""
        return self.module.task


def cli_value(value: Any) -> str:
    """A config value as jsonargparse reads it on the command line (``true``, ``null``, JSON lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    """``{"a.b": 1}`` -> ``["--a.b=1"]``."""
    return [f"--{key}={cli_value(value)}" for key, value in overrides.items()]


def config_args(configs: Sequence[str | Path], overrides: Mapping[str, Any] | None = None) -> list[str]:
    """Command-line arguments of ``configs`` (in order) then ``overrides`` (dotted keys to values)."""
    args: list[str] = []
    for config in configs:
        args += ["--config", str(config)]
    return args + override_args(overrides or {})


def load_run(args: Sequence[str], *, arguments: Callable | None = None, prog: str | None = None) -> Run:
    """Instantiate a run's configuration from ``fit``-style arguments (no subcommand).

    Args:
        args: ``--config`` files and ``--key value`` overrides, as given to ``fit``
            (:func:`config_args` builds them from paths and a mapping).
        arguments: adds the calling command's own arguments to the parser (read back from
            :attr:`Run.config`).
        prog: the calling command's name in the usage line (``python -m grasp_lightning export``).

    Raises:
        SystemExit: the arguments do not parse (jsonargparse prints what is wrong, status 2).
        GraspConfigError: a value the module, the task or the DataModule refuses.
    """
    # nothing runs, so the global RNGs are not seeded (seed_everything is the fit's)
    cli = build_cli([*args, "--seed_everything=false"], run=False, prog=prog, build_trainer=False,
                    arguments=arguments)
    return Run(module=cli.model, datamodule=cli.datamodule, trainer=cli.config_init.trainer, config=cli.config)
