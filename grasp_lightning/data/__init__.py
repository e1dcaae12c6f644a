"""Data handling: GRASP formats and readers, the tar index, video decoding, prompts, collation,
the resumable sampler and accumulation windows (the DataModule that composes them is
``grasp_lightning/datamodule.py``)."""
