"""What a run shows while it trains: texts, tables and images to every Lightning logger
(:mod:`~grasp_lightning.monitoring.loggers`) and the curves history with its picture
(:mod:`~grasp_lightning.monitoring.curves`)."""
