"""Objects named by an import path in a config: ``package.module:name``, ``package.module.name`` or
``path/to/file.py:name``.

A reward, a callback or a task of one's own is one file plus a line of YAML: the config names it
and this module finds it. The three spellings are those of Python entry points (``module:attr``),
of jsonargparse's ``class_path`` (``module.attr``), and of a plain file beside the run, which is
loaded as a module without installing anything (``importlib.util.spec_from_file_location``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from grasp_lightning.errors import GraspConfigError

__all__ = ["load_object", "split_path"]


def split_path(path: str) -> tuple[str, str]:
    """``(module or file, attribute)`` of an import path.

    ``"pkg.mod:fn"`` → ``("pkg.mod", "fn")``; ``"rewards.py:fn"`` → ``("rewards.py", "fn")``;
    ``"pkg.mod.fn"`` → ``("pkg.mod", "fn")``. The attribute may itself be dotted after a colon
    (``"pkg.mod:Class.method"``).

    Raises:
        GraspConfigError: the path has no module part or no attribute part.
    """
    if ":" in path:
        module, _, attr = path.rpartition(":")
    else:
        module, _, attr = path.rpartition(".")
    if not module.strip() or not attr.strip():
        raise GraspConfigError(f"{path!r} is not an import path: write package.module:name, "
                               f"package.module.name or path/to/file.py:name")
    return module.strip(), attr.strip()


def _load_file(file: str) -> object:
    """The module of a Python file (relative paths from the working directory), loaded once per path."""
    resolved = Path(file).expanduser().resolve()
    if not resolved.is_file():
        raise GraspConfigError(f"file {file!r} does not exist (looked at {resolved})")
    name = f"grasp_plugin_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise GraspConfigError(f"file {file!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered first, as import does: pickling and dataclasses find it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's file becomes a config error naming it
        del sys.modules[name]
        raise GraspConfigError(f"file {file!r} fails to load: {type(exc).__name__}: {exc}") from exc
    return module


def load_object(path: str) -> object:
    """The object an import path names (:func:`split_path` spellings).

    Args:
        path: ``package.module:name``, ``package.module.name`` or ``path/to/file.py:name``.

    Returns:
        The attribute (any object; callers check what they need, e.g. callable).

    Raises:
        GraspConfigError: naming ``path``: not an import path, the module does not import (the
            exception it raised is quoted), the file does not exist or fails to load, or it has no
            such attribute (the names it has are listed).
    """
    module_name, attr = split_path(path)
    if module_name.endswith(".py"):
        module = _load_file(module_name)
    else:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any import failure becomes a config error naming the module
            raise GraspConfigError(f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))[:20]
            raise GraspConfigError(f"module {module_name!r} has no attribute {attr!r} (it has: {public})")
        obj = getattr(obj, part)
    return obj
