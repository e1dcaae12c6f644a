"""Paths in commands and configs that resolve the same from any working directory.

The recipes name shipped files relative to the repository: ``--config configs/sft.yaml``, and inside
``configs/demo.yaml`` ``grasp_lightning/assets/tiny-qwen3vl``. Such a path is read relative to the
working directory first (a user's own ``configs/`` folder wins); when nothing is there, it is looked up
in the installation: under :data:`INSTALL_ROOT` (the folder holding the ``grasp_lightning`` package: the
repository root of a checkout, ``site-packages`` of a wheel) and under :data:`PACKAGE_DIR` (a wheel
ships ``configs/`` as ``grasp_lightning/configs/``, setup.cfg ``package_dir``). A ``--config`` file may
also be a bare recipe name (``--config sft.yaml``: ``configs/sft.yaml`` of the installation).
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from grasp_lightning.errors import GraspConfigError

PACKAGE_DIR = Path(__file__).resolve().parent
INSTALL_ROOT = PACKAGE_DIR.parent
PACKAGE_PREFIX = "grasp_lightning/"  # config values starting so name the package's shipped files


def _exists(path: Path) -> bool:
    """``path`` is a file or folder, or a glob pattern (``mmsi_test_*.json``) that matches one."""
    return path.exists() or (glob.has_magic(str(path)) and bool(glob.glob(str(path))))


def installed_path(path: str | Path, *, config: bool = False) -> Path | None:
    """The installation's copy of a relative ``path`` that the working directory lacks, else ``None``.

    Args:
        path: a relative path as written in a command or config (``configs/sft.yaml``,
            ``grasp_lightning/assets/sample``; a glob pattern is allowed).
        config: also try ``configs/<path>`` (a bare recipe name given to ``--config``).

    Returns:
        The absolute path under :data:`INSTALL_ROOT` or :data:`PACKAGE_DIR`; ``None`` when ``path`` is
        absolute, exists relative to the working directory, or the installation has no such file.
    """
    path = Path(path).expanduser()
    if path.is_absolute() or _exists(path):
        return None
    names = [path, Path("configs") / path] if config else [path]
    for name in names:
        for base in (INSTALL_ROOT, PACKAGE_DIR):
            if _exists(base / name):
                return base / name
    return None


def resolve_config_args(args: Sequence[str]) -> list[str]:
    """``args`` with every ``--config FILE`` (or ``--config=FILE``) that the working directory lacks
    replaced by the installation's file (:func:`installed_path`); other arguments unchanged. A file
    found nowhere is left for the parser, whose error names it."""
    args, out = list(args), []
    for i, arg in enumerate(args):
        if arg.startswith("--config=") and (found := installed_path(arg[len("--config="):], config=True)):
            arg = f"--config={found}"
        elif i > 0 and args[i - 1] == "--config" and (found := installed_path(arg, config=True)):
            arg = str(found)
        out.append(arg)
    return out


def resolve_package_paths(config: Any, key: str = "") -> None:
    """Resolve, in place, every string value of a parsed configuration that starts with
    ``grasp_lightning/`` (a shipped file: ``model.policy.name_or_path``, ``data.source.root``, an evaluation
    suite's ``path``) against the installation when the working directory has no such path.

    Args:
        config: a jsonargparse ``Namespace`` (or dict / list of them), changed in place.
        key: the dotted key of ``config`` (for the error message).

    Raises:
        GraspConfigError: such a value exists neither relative to the working directory nor under the
            installation; the message names the key, the value and both folders.
    """
    items = enumerate(config) if isinstance(config, list) else vars(config).items() \
        if isinstance(config, Namespace) else config.items()
    for name, value in list(items):
        path = f"{key}.{name}" if key else str(name)
        if isinstance(value, str) and value.startswith(PACKAGE_PREFIX):
            if _exists(Path(value)):
                continue
            found = installed_path(value)
            if found is None:
                raise GraspConfigError(f"{path}: {value!r} exists neither relative to the working directory "
                                       f"({Path.cwd()}) nor in the installation ({INSTALL_ROOT})")
            config[name] = str(found)
        elif isinstance(value, (list, dict, Namespace)):
            resolve_package_paths(value, path)
