"""``python -m grasp_lightning fit|validate|test|predict --config ...``: the training CLI (LightningCLI).

Several ``--config`` files compose (a recipe, then overrides such as ``configs/demo.yaml``), every
key can be overridden on the command line (``--model.optim.lr 1e-5``), and ``--print_config``
prints the resolved configuration. The processor of the DataModule is linked to the policy, so a
checkpoint is named once.

:func:`build_cli` is the one place the CLI is built: for these four commands, for the commands that
read a run's configuration (:func:`grasp_lightning.commands.config.load_run`), for the pipeline's
stages and for the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.cli import LightningCLI
from typing_extensions import override

from grasp_lightning.callbacks.watch import RunWatch
from grasp_lightning.datamodule import GraspDataModule
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.module import RELEASED_KEY, GraspModule
from grasp_lightning.monitoring.loggers import run_dir
from grasp_lightning.paths import resolve_config_args, resolve_package_paths

# The shipped tasks, imported so that jsonargparse knows them as subclasses of Task: without a --config
# naming its class_path, `fit --model.task.help GRPOTask` failed with "Expected a dot import path string".
from grasp_lightning.tasks import grpo, sft  # noqa: F401


class GraspTrainer(L.Trainer):
    """Lightning's ``Trainer`` whose ``log_dir`` is the run's own folder for every logger type
    (:func:`grasp_lightning.monitoring.loggers.run_dir`, broadcast from rank zero like Lightning's): the same as
    Lightning's for TensorBoard and CSV; for W&B and MLflow the folder beside the run's checkpoints
    instead of the store's root (every run's ``config.yaml`` there overwrote the last; with an MLflow
    database store it is ``None`` and saving the config failed)."""

    @property
    @override
    def log_dir(self) -> str | None:
        return self.strategy.broadcast(run_dir(self))


class GraspCLI(LightningCLI):
    """LightningCLI with the links between model and data that GRASP needs (built by :func:`build_cli`), and
    the group ``watch``: :class:`grasp_lightning.callbacks.watch.RunWatch` (a console line per logged step,
    ``curves.jsonl`` and ``curves.png`` in the run folder) joins every run's callbacks, whatever its config
    lists, so that a config of one's own has it too (``--watch.console false`` etc. turn its parts off).

    Args:
        args, kwargs: LightningCLI's.
        build_trainer: with ``run=False``, instantiate the ``Trainer`` too; ``False``: only the model,
            the DataModule and the trainer's settings (``config_init.trainer``, its strategy, logger and
            callbacks instantiated), for commands that only read a run's configuration.
        run_dir: put the run's outputs under this folder: ``trainer.default_root_dir`` and the
            logger's ``save_dir`` (its ``name`` becomes ``logs``), e.g. a pipeline stage's folder.
        arguments: adds a command's own arguments to a ``run=False`` parser (``export``'s ``--out``).
    """

    def __init__(self, *args, build_trainer: bool = True, run_dir: str | Path | None = None,
                 arguments: Callable | None = None, **kwargs) -> None:
        self._build_trainer, self._run_dir, self._arguments = build_trainer, run_dir, arguments
        super().__init__(*args, **kwargs)

    @override
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.policy.name_or_path", "data.prompt.processor")
        parser.link_arguments("model.policy.trust_remote_code", "data.prompt.trust_remote_code")
        # on in every run, whatever its config lists (a config of one's own too): `--watch.console false`
        parser.add_lightning_class_args(RunWatch, "watch")

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs):
        """LightningCLI's subcommand parser, described by the command table's line and its how-to page
        (:data:`grasp_lightning.commands.COMMANDS`; Lightning's is the ``Trainer`` method's docstring, cut
        mid-sentence for ``predict``); ``predict`` defaults to ``return_predictions: false``: the
        ``PredictionWriter`` has the answers on disk, and ``Trainer.predict``'s default would also keep
        every batch's records in memory, growing with the dataset (lightning 2.6 ``cli.py``)."""
        from grasp_lightning.commands import COMMANDS

        if subcommand in COMMANDS:
            kwargs["description"] = COMMANDS[subcommand].description
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "predict":
            parser.set_defaults(return_predictions=False)
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        """LightningCLI's parser; a configuration-only one (``run=False``) also takes the keys of a
        ``fit`` config that are ``Trainer.fit`` arguments (a run's saved ``config.yaml`` and the
        recipes hold ``ckpt_path`` and ``weights_only``), and the command's own ``arguments``."""
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if add_subcommands:
            return
        self.parser.add_argument("--ckpt_path", type=str | None, default=None,
                                 help="a checkpoint: Lightning .ckpt file or DeepSpeed checkpoint directory")
        self.parser.add_argument("--weights_only", type=bool | None, default=None,
                                 help="how a checkpoint is loaded (torch.load weights_only), as for fit")
        if self._arguments is not None:
            self._arguments(self.parser)

    def before_instantiate_classes(self) -> None:
        """Resolve the values naming shipped files (``grasp_lightning/assets/...``) from any working
        directory (:func:`grasp_lightning.paths.resolve_package_paths`); move the outputs under
        ``run_dir`` (when given)."""
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        resolve_package_paths(config)
        if self._run_dir is None:
            return
        trainer = config.trainer
        trainer.default_root_dir = str(self._run_dir)
        logger = trainer.get("logger")
        init = getattr(logger, "init_args", None) if logger not in (None, True, False) else None
        if init is not None and "save_dir" in init:
            init.save_dir = str(self._run_dir)
            if "name" in init:
                init.name = "logs"

    def instantiate_trainer(self, **kwargs):
        """The ``Trainer``, or ``None`` for a configuration-only CLI (``build_trainer=False``)."""
        return super().instantiate_trainer(**kwargs) if self._build_trainer else None


def library_chatter_to_stderr() -> None:
    """Send DeepSpeed's log lines to stderr, so that stdout holds only what a command prints
    (``--print_config > run.yaml`` is YAML).

    DeepSpeed's ``DeepSpeed`` logger writes to ``sys.stdout`` with a handler of its own
    (``deepspeed/utils/logging.py``), and its import warns "Setting accelerator to CPU" on a machine
    without a GPU; jsonargparse imports it while reading Lightning's annotations. It is imported here
    with stdout sent to stderr, then its handlers are pointed at stderr. Without DeepSpeed installed,
    nothing happens.
    """
    if importlib.util.find_spec("deepspeed") is None:
        return
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: F401  (its import logs the accelerator it found)
    for handler in logging.getLogger("DeepSpeed").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)


#: How YAML (jsonargparse's loader) spells null on the command line.
YAML_NULLS = ("null", "Null", "NULL", "~")


def null_group_args(args: Sequence[str]) -> list[str]:
    """``args`` with every ``null`` given to a key nested below a class's ``init_args`` rewritten as the
    group's mapping: ``--model.task.init_args.compute.logprob_chunk_size=null`` (or ``... null`` as two
    arguments) becomes ``--model.task.init_args.compute={"logprob_chunk_size": null}``.

    Works around jsonargparse 4.53: a command-line value for ``--CLS.init_args.GROUP.KEY`` (a dataclass
    group, e.g. ``GRPOTask``'s ``reward``, or any deeper key) is parsed to Python, then handed to the
    class's own parser as the text ``f"--{key}={value}"`` (``_typehints.adapt_class_type``), so ``null``
    arrives as the string ``"None"``: an ``int | None`` key fails with "Does not validate against any of
    the Union subtypes" and a ``str | None`` key silently becomes ``"None"``. The mapping form, a
    documented spelling, is merged with the group's other keys and keeps ``None`` (no upstream issue was
    found for this in jsonargparse's tracker). Other arguments, and keys one level below ``init_args``
    (which jsonargparse reads correctly), are unchanged.
    """
    args, out, i = list(args), [], 0
    while i < len(args):
        arg, value, used = args[i], None, 1
        if arg.startswith("--") and ".init_args." in arg:
            if "=" in arg:
                arg, value = arg.split("=", 1)
            elif i + 1 < len(args):
                value, used = args[i + 1], 2
        head, _, rest = arg.partition(".init_args.")
        if value in YAML_NULLS and "." in rest:
            group, *path = rest.split(".")
            nested = None
            for part in reversed(path):
                nested = {part: nested}
            out.append(f"{head}.init_args.{group}={json.dumps(nested)}")
            i += used
            continue
        out.append(args[i])
        i += 1
    return out


#: Keys that are not settings, each with the key that holds its setting: a config or command line naming one
#: fails at start-up naming the other (:func:`refuse_moved_keys`) instead of jsonargparse's "not accepted".
MOVED_KEYS: dict[str, str] = {
    "model.task.init_args.batching.drop_zero_variance_groups": "model.task.init_args.batching.dynamic_sampling",
    "data.loader.mode": "data.loader.data_mode",
    **{f"model.evaluation.{key}": f"{RELEASED_KEY}{key}" for key in (
        "reasoning", "model_type", "max_frames", "frame_max_tokens", "frame_spatial_patch", "timestamps")},
}


def _dotted_keys(tree: object, prefix: str = "") -> list[str]:
    """Every dotted key of a nested mapping (``{"a": {"b": 1}}`` -> ``["a", "a.b"]``)."""
    if not isinstance(tree, dict):
        return []
    keys = []
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        keys += [key, *_dotted_keys(value, key)]
    return keys


def refuse_moved_keys(args: Sequence[str]) -> None:
    """Refuse a key of :data:`MOVED_KEYS` in ``args``: as ``--key``, inside a ``--config`` file or YAML string, or
    inside a mapping given to a key on the command line (``--model.evaluation={"max_frames": 8}``).

    Raises:
        GraspConfigError: naming the key given and the key that holds its setting.
    """
    args, found = list(args), []
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        key, eq, value = arg[2:].partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        if key == "config":
            text = Path(value).read_text(encoding="utf-8") if _is_file(value) else value
            found += _dotted_keys(_yaml_mapping(text))
        else:
            found += [key, *_dotted_keys(_yaml_mapping(value), key)]
    for key in found:
        if key in MOVED_KEYS:
            raise GraspConfigError(f"{key} is not a setting: set {MOVED_KEYS[key]} instead")


def _is_file(value: str) -> bool:
    """Whether ``value`` names a file (a YAML string given to ``--config`` may be too long for a path)."""
    try:
        return bool(value) and Path(value).is_file()
    except OSError:
        return False


def _yaml_mapping(text: str) -> dict | None:
    """``text`` read as YAML when it is a mapping, else ``None`` (a file the parser reports, a plain value)."""
    try:
        tree = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return None
    return tree if isinstance(tree, dict) else None


def build_cli(args: Sequence[str], run: bool = True, *, prog: str | None = None, **options) -> GraspCLI:
    """The training CLI as ``python -m grasp_lightning fit|validate|test|predict`` builds it.

    Args:
        args: command-line arguments (``["fit", "--config", ...]``; without the subcommand when
            ``run`` is false). A ``--config`` file the working directory lacks is read from the
            installation (``configs/sft.yaml`` or ``sft.yaml`` from any directory:
            :func:`grasp_lightning.paths.resolve_config_args`); ``null`` works for every key
            (:func:`null_group_args`); a key of :data:`MOVED_KEYS` is refused (:func:`refuse_moved_keys`).
        run: parse a subcommand and run it; ``False``: parse and instantiate only (the caller runs
            ``cli.trainer.fit(cli.model, datamodule=cli.datamodule)`` or reads the objects).
        prog: the program name in the usage line (e.g. ``python -m grasp_lightning check-data``).
        options: :class:`GraspCLI`'s own (``build_trainer``, ``run_dir``, ``arguments``).

    Returns:
        The CLI (``cli.model``, ``cli.datamodule``, ``cli.trainer``, ``cli.config``, ``cli.config_init``).
    """
    args, command_line = null_group_args(resolve_config_args(args)), list(args) == sys.argv[1:]
    refuse_moved_keys(args)
    if run and command_line:
        sys.argv[1:] = args  # --config files of the installation as absolute paths, also for re-launched ranks
        args = None  # the command line itself: LightningCLI reads sys.argv (and does not warn that it sees both)
    kwargs = dict(args=args, run=run, trainer_class=GraspTrainer, save_config_kwargs={"overwrite": True},
                  auto_configure_optimizers=False,
                  parser_kwargs={"default_env": False, **({"prog": prog} if prog else {})}, **options)
    library_chatter_to_stderr()
    argv = sys.argv
    if not run:  # LightningCLI warns when it sees both `args` and sys.argv (nothing is launched before fit)
        sys.argv = sys.argv[:1]
    try:
        return GraspCLI(GraspModule, GraspDataModule, **kwargs)
    finally:
        sys.argv = argv  # multi-process launchers re-run sys.argv


def main(argv: Sequence[str]) -> int:
    """``python -m grasp_lightning fit|validate|test|predict ...`` (``argv`` starts with the subcommand)."""
    build_cli(argv, prog="python -m grasp_lightning")
    return 0
