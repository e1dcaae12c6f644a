"""Shared test code, the one package tests import besides the library (conftest.py keeps the fixtures).

Its modules, one concern each; every name is imported here, so ``from tests.helpers import X`` and the
class paths the CLI is given (``--trainer.callbacks+=tests.helpers.<Name>``) work for all of them:

- :mod:`~tests.helpers.paths`: the shipped assets (:data:`REPO`, :data:`TINY`, :data:`TINY35`, :data:`SAMPLE`,
  :data:`REAL_CLIP`);
- :mod:`~tests.helpers.cli`: the in-process command :func:`run_cli`, TensorBoard readers :func:`scalars` and
  :func:`event_tags`, the arguments several files share;
- :mod:`~tests.helpers.data`: builders of tiny GRASP data (mp4 clips, tar shards, JSONL rows, bench items, QA sets);
- :mod:`~tests.helpers.ranks`: several CPU processes over gloo with a hard timeout;
- :mod:`~tests.helpers.recorders`: callbacks and reward terms a run names by class path;
- :mod:`~tests.helpers.models`: the tiny models with noisy weights, their tolerances, the sample RL data module;
- :mod:`~tests.helpers.golden`: the hand-scored golden GRASP-Bench;
- :mod:`~tests.helpers.released`: the released evaluation's prompts and inputs, written out by hand;
- :mod:`~tests.helpers.loggers`: readers of what a W&B offline run and an MLflow run stored;
- :mod:`~tests.helpers.standins`: the real-shape tier's data, arguments and the checks both families share;
- :mod:`~tests.helpers.measure`: a command in a child process with its peak memory and model loads;
- :mod:`~tests.helpers.docs`: the docs' commands, read from their Markdown;
- :mod:`~tests.helpers.vllm_tier`: the vLLM tier's CPU server settings.
"""

from tests.helpers.cli import FAST, SGR_REWARDS, TIMES, event_tags, find_callback, one_sgr_step_args, run_cli, scalars
from tests.helpers.data import (
    OPTIONS,
    QA_ANSWER,
    annotation_row,
    bench_json,
    bench_members,
    frame_level,
    level_to_index,
    make_image,
    make_mp4,
    make_qa_dataset,
    make_tar,
    qa_row,
    rl_row,
    sft_row,
    write_jsonl,
)
from tests.helpers.docs import blocks, command, section
from tests.helpers.golden import GOLDEN, SPANS, golden_items, golden_records
from tests.helpers.loggers import mlflow_files, wandb_history, wandb_media, wandb_records
from tests.helpers.measure import PROCESS_GIB, run_measured, run_state_tensors
from tests.helpers.models import (
    GRAD_TOLS,
    LOGIT_TOLS,
    LOGP_TOLS,
    K,
    ModelLoads,
    assert_grad_close,
    generate_with_logits,
    load_model,
    load_tiny_policy,
    perturb_weights,
    random_completions,
    sample_rl_datamodule,
)
from tests.helpers.paths import FAMILIES, REAL_CLIP, REPO, SAMPLE, TINY, TINY35, TINY_MODELS
from tests.helpers.ranks import MP_TIMEOUT, free_port, launch_ranks, rank_log, spawn_ranks, spawn_two_ranks, wait_ranks
from tests.helpers.recorders import (
    GradRecorder,
    MicroBatchLosses,
    PromptRecorder,
    SigtermAt,
    StepMetricsRecorder,
    StepRecorder,
    UpdateRecorder,
    WeightRecorder,
    WindowRecorder,
    checksum_reward,
    half_degenerate_reward,
    read_meta,
    read_steps,
)
from tests.helpers.released import (
    BENCH_OPTIONS,
    BENCH_QUESTION,
    RELEASED_INSTRUCTION,
    RELEASED_SYSTEM,
    SAMPLE_BENCH,
    first_bench_item,
    released_reference,
)
from tests.helpers.standins import (
    CLIPS,
    PUBLISHED_INSTRUCT_PROMPT,
    QUESTION,
    TARGET,
    TEMPLATE_FORMS,
    check_data_counts_prompt_tokens,
    check_rendered_prompt_and_labels,
    first_batch,
    labelled_part,
    scratch,
    standin_args,
    write_dataset,
)
from tests.helpers.vllm_tier import SERVER_ENV, SHIM, vllm_cfg

__all__ = [
    "BENCH_OPTIONS", "BENCH_QUESTION", "RELEASED_INSTRUCTION", "RELEASED_SYSTEM", "SAMPLE_BENCH", "first_bench_item",
    "mlflow_files", "released_reference", "wandb_history", "wandb_media", "wandb_records",
    "CLIPS", "FAMILIES", "FAST", "GOLDEN", "GRAD_TOLS", "K", "LOGIT_TOLS", "LOGP_TOLS", "MP_TIMEOUT", "OPTIONS",
    "PROCESS_GIB", "PUBLISHED_INSTRUCT_PROMPT", "QA_ANSWER", "QUESTION", "REAL_CLIP", "REPO", "SAMPLE", "SERVER_ENV",
    "SGR_REWARDS", "SHIM", "SPANS", "TARGET", "TEMPLATE_FORMS", "TIMES", "TINY", "TINY35", "TINY_MODELS",
    "GradRecorder", "MicroBatchLosses", "ModelLoads", "PromptRecorder", "SigtermAt", "StepMetricsRecorder",
    "StepRecorder", "UpdateRecorder", "WeightRecorder", "WindowRecorder", "annotation_row", "assert_grad_close",
    "bench_json", "bench_members", "blocks", "check_data_counts_prompt_tokens", "check_rendered_prompt_and_labels",
    "checksum_reward", "command", "event_tags", "find_callback", "first_batch", "frame_level", "free_port",
    "generate_with_logits", "golden_items", "golden_records", "half_degenerate_reward", "labelled_part",
    "launch_ranks", "level_to_index", "load_model", "load_tiny_policy", "make_image", "make_mp4", "make_qa_dataset",
    "make_tar", "one_sgr_step_args", "perturb_weights", "qa_row", "rank_log", "random_completions", "read_meta",
    "read_steps", "rl_row", "run_cli", "run_measured", "run_state_tensors", "sample_rl_datamodule",
    "scalars", "scratch", "section", "sft_row", "spawn_ranks", "spawn_two_ranks", "standin_args", "vllm_cfg",
    "wait_ranks", "write_dataset", "write_jsonl",
]
