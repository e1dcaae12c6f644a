"""Planning a run before it starts: per-GPU memory and token counts of a config (``plan-memory``)."""
