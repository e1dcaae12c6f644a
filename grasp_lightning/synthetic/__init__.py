"""Generators of models and data for offline runs and tests: the tiny model and real-shape stand-ins,
the bundled sample data and the evaluation-suite fixtures. The training runtime never imports them."""
