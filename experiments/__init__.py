"""Research experiments built on grasp_lightning, one folder each, with their own README, recipes, results
and tests. Not part of the installed package: run them from a checkout of the repository (its root on the
Python path, e.g. ``python -m experiments.world.run``)."""
