"""Every file in ``configs/`` and in the experiments' recipe folders (``experiments/world/configs/``), loaded
as it is meant to be used, through the loader ``fit`` uses.

Each file is paired (:data:`USES`) with the ``--config`` lists its header gives: a recipe alone and
with ``configs/demo.yaml``, an overlay after the recipe it varies, a logger or evaluation file after
the demo. :func:`grasp_lightning.commands.config.load_run` (LightningCLI, ``run=False``) builds each
list as ``fit`` would (no weights loaded), and every key the YAML files set must come out as the
last file that sets it says. A file nobody paired fails :func:`test_every_config_file_is_paired`
(as torchtune's ``tests/recipes/test_configs.py``). The paper recipes and their overlays carry the
safety net: ``weights_only``, ``Preemption``, ``NonFiniteGuard`` and atomic checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grasp_lightning.commands.config import config_args, load_run

from .conftest import REPO, SAMPLE, TINY

CONFIGS = REPO / "configs"

# file -> the --config lists (names in configs/, in order) it is used in, from its header
USES: dict[str, list[tuple[str, ...]]] = {
    "sft.yaml": [("sft",), ("sft", "demo")],
    "sgr.yaml": [("sgr",), ("sgr", "demo")],
    "grpo.yaml": [("sgr", "grpo"), ("sgr", "grpo", "demo")],
    "demo.yaml": [("sft", "demo"), ("sgr", "demo")],
    "lora.yaml": [("sft", "lora", "demo"), ("sgr", "lora"), ("sgr", "lora", "demo")],
    "qlora.yaml": [("sft", "qlora", "demo"), ("sgr", "qlora")],
    "eval_released.yaml": [("sgr", "eval_released"), ("sgr", "demo", "eval_released")],
    "eval_suites.yaml": [("sgr", "demo", "eval_suites")],
    "predict.yaml": [("sgr", "demo", "predict"), ("sgr", "predict")],
    "tensorboard.yaml": [("sgr", "demo", "wandb", "tensorboard")],
    "wandb.yaml": [("sgr", "demo", "wandb")],
    "mlflow.yaml": [("sgr", "demo", "mlflow")],
    "grasp_pipeline.yaml": [],  # the pipeline command's own file: test_the_pipeline_config_loads_every_stage
    "released/sft.yaml": [("sft", "released/sft"), ("sft", "released/sft", "demo")],
    "released/sgr.yaml": [("sgr", "released/sgr"), ("sgr", "released/sgr", "demo")],
}
#: The synthetic-world experiment's recipes (run from the repository root), paired the same way: names in that folder.
WORLD_CONFIGS = REPO / "experiments" / "world" / "configs"
WORLD_USES: dict[str, list[tuple[str, ...]]] = {
    "sft.yaml": [("sft",)],
    "sgr.yaml": [("sgr",)],
    "grpo.yaml": [("grpo",)],
    "sgr_modal.yaml": [("sgr", "sgr_modal")],
    "temporal.yaml": [("sgr", "temporal")],
}
FOLDERS = {CONFIGS: USES, WORLD_CONFIGS: WORLD_USES}  #: every recipe folder and its pairings
#: (folder, --config list) of every pairing of every folder
PAIRINGS = [(folder, combo) for folder, uses in FOLDERS.items()
            for combo in sorted({combo for names in uses.values() for combo in names})]
PAPER_RECIPES = ("sft", "sgr")  # the paper's stages; grpo.yaml is an overlay on sgr.yaml
SAFETY = ("grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint", "grasp_lightning.callbacks.control.preemption.Preemption",
          "grasp_lightning.callbacks.control.guards.NonFiniteGuard")


def _yaml(name: str, folder: Path = CONFIGS) -> dict:
    return yaml.safe_load((folder / f"{name}.yaml").read_text()) or {}


def _merge(base, over):
    """What a later ``--config`` does to an earlier one's value: mappings merge key by key, a subclass
    value of another ``class_path`` starts afresh (its init_args only), anything else is replaced."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    if "class_path" in over and base.get("class_path") != over["class_path"]:
        return over
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(base.get(key), value) if key in base else value
    return out


def _plain(value):
    """A resolved value as YAML would write it (Namespaces as mappings, tuples as lists, paths as str)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def _mismatches(expected, resolved, where: str = "") -> list[str]:
    """Every leaf of ``expected`` (the merged YAML) that ``resolved`` does not hold."""
    if isinstance(expected, dict):
        if not isinstance(resolved, dict):
            return [f"{where}: {resolved!r} is not a mapping"]
        return [m for k, v in expected.items()
                for m in (_mismatches(v, resolved[k], f"{where}.{k}".strip(".")) if k in resolved
                          else [f"{where}.{k}: missing"])]
    if isinstance(expected, list) and expected and all(isinstance(v, dict) for v in expected):
        if not isinstance(resolved, list) or len(resolved) != len(expected):
            return [f"{where}: {len(expected)} items in the YAML, resolved {resolved!r}"]
        return [m for i, (e, r) in enumerate(zip(expected, resolved)) for m in _mismatches(e, r, f"{where}[{i}]")]
    if isinstance(expected, float) or isinstance(resolved, float):
        return [] if resolved == pytest.approx(expected, rel=1e-12) else [f"{where}: {resolved!r} != {expected!r}"]
    return [] if _plain(expected) == resolved else [f"{where}: {resolved!r} != {expected!r}"]


def _logger_paths(combo: tuple[str, ...], tmp_path: Path) -> dict:
    """Keep the loggers' stores out of the repository (the MLflow logger opens its database on creation)."""
    if combo[-1] == "mlflow":
        return {"trainer.logger.init_args.tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "trainer.logger.init_args.artifact_location": str(tmp_path / "mlartifacts")}
    return {"trainer.logger.init_args.save_dir": str(tmp_path)} if combo[-1] == "wandb" else {}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.relative_to(REPO).as_posix())
def test_every_config_file_is_paired(folder: Path) -> None:
    """A new file in configs/ (or an experiment's configs/) fails here until USES (WORLD_USES) says how it is
    used (and a gone one too)."""
    uses_of = FOLDERS[folder]
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == sorted(uses_of)
    for name, uses in uses_of.items():
        assert all(name.removesuffix(".yaml") in combo for combo in uses), name
        assert all((folder / f"{n}.yaml").is_file() for combo in uses for n in combo), name


@pytest.mark.parametrize(("folder", "combo"), PAIRINGS,
                         ids=[f"{f.relative_to(REPO).parent.as_posix()}:{'+'.join(c)}" for f, c in PAIRINGS])
def test_every_pairing_loads_with_the_yaml_values(folder, combo, in_repo, tmp_path) -> None:
    overrides = _logger_paths(combo, tmp_path)
    run = load_run(config_args([folder / f"{n}.yaml" for n in combo], overrides))
    expected = {}
    for name in combo:
        expected = _merge(expected, _yaml(name, folder))
    expected = _merge(expected, _as_tree(overrides))
    expected.pop("seed_everything", None)  # load_run seeds nothing (seed_everything=false); fit's is the YAML's
    resolved = _plain(run.config)
    assert not _mismatches(expected, resolved)
    callbacks = [cb["class_path"] for cb in resolved["trainer"]["callbacks"] or []]
    if folder == CONFIGS and combo[0] in PAPER_RECIPES and "predict" not in combo:  # every run of a paper recipe
        assert resolved["weights_only"] is True
        assert all(path in callbacks for path in SAFETY), callbacks
        assert {"NonFiniteGuard", "Preemption"} <= {type(cb).__name__ for cb in run.trainer.callbacks}
    if "predict" in combo:
        assert callbacks == ["grasp_lightning.callbacks.predictions.PredictionWriter"]


def _as_tree(dotted: dict) -> dict:
    tree: dict = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def test_grpo_is_sgr_with_its_rewards_and_run_name(in_repo) -> None:
    """configs/grpo.yaml on configs/sgr.yaml changes the rewards, their weights and the run name, nothing else."""
    sgr = _plain(load_run(config_args([CONFIGS / "sgr.yaml"])).config)
    run = load_run(config_args([CONFIGS / "sgr.yaml", CONFIGS / "grpo.yaml"]))
    grpo = _plain(run.config)
    assert (run.task.reward.terms, run.task.reward.weights) == (["accuracy", "format"], [1.0, 0.1])
    assert grpo["trainer"]["logger"]["init_args"]["name"] == "grpo"
    task, logger = grpo["model"]["task"]["init_args"], grpo["trainer"]["logger"]["init_args"]
    sgr["model"]["task"]["init_args"]["reward"].update(terms=task["reward"]["terms"], weights=task["reward"]["weights"])
    sgr["trainer"]["logger"]["init_args"]["name"] = logger["name"]
    assert {k: v for k, v in grpo.items() if k != "config"} == {k: v for k, v in sgr.items() if k != "config"}
    assert run.config.weights_only is True


@pytest.mark.parametrize("combo", [("sgr", "eval_released"), ("sgr", "demo", "eval_released")], ids="+".join)
def test_eval_released_decodes_one_item_at_a_time(combo, in_repo) -> None:
    """The released script generates one item at a time; exact parity needs data.loader.val_batch_size 1."""
    run = load_run(config_args([CONFIGS / f"{n}.yaml" for n in combo]))
    assert run.datamodule.loader.val_batch_size == 1
    assert run.module.eval_cfg.protocol == "released"


def _sft_target_tokens() -> list[int]:
    """Token counts of the bundled SFT data's targets (``<think>…</think><answer>…</answer>``) under the
    tiny model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    lines = (SAMPLE / "train" / "data_sft.jsonl").read_text().splitlines()
    targets = [part["content"] for line in lines for part in json.loads(line) if part.get("output")]
    assert targets and all(t.startswith("<think>") and t.endswith("</answer>") for t in targets)
    return [len(tokenizer(t, add_special_tokens=False).input_ids) for t in targets]


def test_demo_budgets_fit_the_format_the_sft_demo_teaches(in_repo) -> None:
    """A policy that writes the SFT demo's targets is not cut off by the demo's rollout or evaluation budget."""
    longest = max(_sft_target_tokens())
    run = load_run(config_args([CONFIGS / "sgr.yaml", CONFIGS / "demo.yaml"]))
    assert run.module.rollout_cfg.max_new_tokens >= longest
    assert run.module.eval_cfg.max_new_tokens >= longest


@pytest.mark.parametrize("demo", [False, True])
def test_the_pipeline_config_loads_every_stage(demo, in_repo, tmp_path) -> None:
    """configs/grasp_pipeline.yaml (the pipeline command's file): every stage's arguments, and the final
    validate's, load through the same loader; the stages are the paper recipes, safety net included."""
    from grasp_lightning.commands.pipeline import pipeline_from_args

    pipeline, _ = pipeline_from_args(["--config", "configs/grasp_pipeline.yaml", "--demo", str(demo).lower(),
                                      "--run_dir", str(tmp_path)])
    assert [s.configs for s in pipeline.stages] == [["configs/sft.yaml"], ["configs/sgr.yaml"]]
    export = None
    for stage in pipeline.stages:
        run = load_run(pipeline.stage_args(stage, export))
        assert run.config.weights_only is True
        assert {"NonFiniteGuard", "Preemption"} <= {type(cb).__name__ for cb in run.trainer.callbacks}
        if demo:
            assert run.module.policy_cfg.name_or_path == (export or "grasp_lightning/assets/tiny-qwen3vl")
        export = str(tmp_path / stage.name / "export")
    for name in pipeline.final_validate or []:
        assert (REPO / name).is_file()
    assert pipeline.final_validate == (["configs/eval_suites.yaml"] if demo else None)


# ------------------------------------------------------------------ shipped files from any directory
def test_config_files_resolve_against_the_installation(tmp_path, monkeypatch) -> None:
    from grasp_lightning.paths import resolve_config_args

    monkeypatch.chdir(tmp_path)
    shipped = str(REPO / "configs" / "sft.yaml")
    assert resolve_config_args(["fit", "--config", "configs/sft.yaml", "--config=sgr.yaml", "--config", "nope.yaml",
                                "--trainer.max_steps=2"]) == \
        ["fit", "--config", shipped, f"--config={REPO / 'configs' / 'sgr.yaml'}", "--config", "nope.yaml",
         "--trainer.max_steps=2"]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "sft.yaml").write_text("seed_everything: 1\n")  # the user's own file wins
    assert resolve_config_args(["--config", "configs/sft.yaml"]) == ["--config", "configs/sft.yaml"]


def test_fit_from_another_directory_reads_the_shipped_recipe_and_demo_files(tmp_path, monkeypatch) -> None:
    """The quickstart from a folder that has neither configs/ nor grasp_lightning/: the recipe and the overlay
    by their repository paths and by bare name, and demo.yaml's ``grasp_lightning/assets/...`` values, resolve
    against the installation; the run trains."""
    from .conftest import run_cli

    monkeypatch.chdir(tmp_path)
    cli = run_cli(["fit", "--config", "sft.yaml", "--config", "configs/demo.yaml", "--trainer.max_steps=1",
                   "--trainer.limit_val_batches=0", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
                   "--data.source.bench=null"], tmp_path)
    config = cli.config.fit
    assert config.model.policy.name_or_path == str(REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl")
    assert config.data.prompt.processor == config.model.policy.name_or_path
    assert config.data.source.root == str(REPO / "grasp_lightning" / "assets" / "sample")
    assert type(cli.model.task).__module__ == "grasp_lightning.tasks.sft"
    assert cli.trainer.global_step == 1


def test_a_shipped_path_found_nowhere_names_itself_and_both_folders(tmp_path, monkeypatch) -> None:
    from grasp_lightning.errors import GraspConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(GraspConfigError) as e:
        load_run(config_args(["configs/sft.yaml", "configs/demo.yaml"],
                             {"model.policy.name_or_path": "grasp_lightning/assets/no-such-model"}))
    assert str(e.value) == (f"model.policy.name_or_path: 'grasp_lightning/assets/no-such-model' exists neither "
                            f"relative to the working directory ({tmp_path}) nor in the installation ({REPO})")
