"""``python -m grasp_lightning``: see :mod:`grasp_lightning.cli`."""

from grasp_lightning.cli import main

main()
