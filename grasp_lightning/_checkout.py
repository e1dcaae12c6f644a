"""Load a top-level folder of the repository as a subpackage of ``grasp_lightning`` (checkout only).

``tasks/`` and ``callbacks/`` are top-level folders of the repository and install as
``grasp_lightning.tasks`` and ``grasp_lightning.callbacks`` (setup.cfg ``package_dir``). A checkout
has no such folders under ``grasp_lightning/``: the two stub packages there call
:func:`load_folder_package`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def load_folder_package(name: str, folder: str) -> None:
    """Replace the module ``name`` in ``sys.modules`` by the package in the repository's ``folder``.

    Args:
        name: the dotted name being imported (``grasp_lightning.tasks``).
        folder: the top-level folder of the repository that holds it (``tasks``).

    Raises:
        ImportError: the folder has no ``__init__.py`` (a broken checkout).
    """
    init = REPOSITORY / folder / "__init__.py"
    if not init.is_file():
        raise ImportError(f"{name}: {init} is missing; a checkout keeps {folder}/ beside grasp_lightning/", name=name)
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
