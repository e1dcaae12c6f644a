"""The synthetic social world experiment (``experiments/world/README.md``): the generator
(:mod:`experiments.world.world`), the end-to-end run (:mod:`experiments.world.run`), its recipes
(``configs/``), committed results (``results/``) and tests."""
