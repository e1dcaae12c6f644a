"""The vLLM server: one file run by vLLM's own Python (its folder goes on that process's PYTHONPATH).

It imports nothing of ours; see :mod:`grasp_lightning.engines.server.vllm_server`.
"""
