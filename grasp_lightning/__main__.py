"""``python -m grasp_lightning``: see :mod:`grasp_lightning.commands.train`."""

from grasp_lightning.commands.train import main

main()
