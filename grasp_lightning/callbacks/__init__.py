"""``grasp_lightning.callbacks`` in a checkout: the repository's top-level ``callbacks/`` folder.

A built wheel holds ``callbacks/`` itself at this place (setup.cfg ``package_dir``), so this file is not
in it. In a checkout (an editable install, or the repository root on ``sys.path``) this file loads
``callbacks/__init__.py`` as ``grasp_lightning.callbacks``, with ``callbacks/`` as its search path, and puts it
in its own place in ``sys.modules`` (the import system's documented way for a module to replace
itself), so ``grasp_lightning.callbacks.*`` are the same module objects from a checkout and from a wheel.
"""

from grasp_lightning._checkout import load_folder_package

load_folder_package(__name__, "callbacks")
