"""Synthetic models and data for offline runs and tests, built by code: the tiny models and real-shape
stand-ins, the bundled sample data, the mp4 clips and the evaluation-suite fixtures. The training runtime
never imports them."""
