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
from tests.helpers import REPO, SAMPLE, TINY

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
    "released/sgr_as_run.yaml": [("sgr", "released/sgr", "released/sgr_as_run"),
                                 ("sgr", "released/sgr", "released/sgr_as_run", "demo")],
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
        assert callbacks == ["grasp_lightning.callbacks.prediction_writer.PredictionWriter"]


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


def test_demo_then_eval_released_scores_every_bench_item(in_repo) -> None:
    """configs/sgr.yaml + demo.yaml + eval_released.yaml (docs/evaluation.md's CPU command): one item per
    batch, and no batch cap left from demo.yaml (4 batches: 4 of the 32 sample items before). The full
    validate run: 32 of 32 items scored, 1 min 43 s on 2 busy CPU cores."""
    import tarfile

    run = load_run(config_args([CONFIGS / n for n in ("sgr.yaml", "demo.yaml", "eval_released.yaml")]))
    with tarfile.open(SAMPLE / "test" / "grasp_bench.tar") as tar:
        items = sum(m.name.endswith(".json") for m in tar.getmembers())  # one GRASP-Bench item per JSON file
    limit, batch = run.trainer["limit_val_batches"], run.datamodule.loader.val_batch_size
    # Lightning: an int caps the batches, a float is a fraction of them (1.0: all)
    scored = min(items, limit * batch) if isinstance(limit, int) else round(items * (1.0 if limit is None else limit))
    assert (items, batch, scored) == (32, 1, 32), limit


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
    from tests.helpers import run_cli

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


# ------------------------------------------------------------------ grouped options: --help, --print_config
#: ``GRPOTask``'s groups (``model.task.init_args.<group>``) and ``GraspDataModule``'s (``data.<group>``).
TASK_GROUPS = ("reward", "advantage", "loss", "batching", "compute")
DATA_GROUPS = ("source", "video", "prompt", "loader", "errors")
#: Filled by the CLI from ``model.policy`` (``link_arguments``): listed as links, not as options.
LINKED = {"data.prompt.processor", "data.prompt.trust_remote_code"}
#: Every flat key of the layout before the groups, with a value of its old type.
OLD_TASK_KEYS = {"rewards": "[accuracy]", "reward_weights": "[1.0]", "advantage": "group", "advantage_eps": "0.1",
                 "advantage_clip": "5", "epsilon": "0.2", "epsilon_high": "0.3", "beta": "0", "loss_type": "grpo",
                 "num_iterations": "1", "drop_zero_variance_groups": "true", "overlong_buffer": "4",
                 "overlong_buffer_fraction": "0.5", "overlong_penalty": "1", "overlong_mode": "reward",
                 "share_prompt": "true", "dynamic_sampling": "off", "max_resample": "1", "rollout_batch_prompts": "1",
                 "importance_sampling_cap": "2", "logprob_chunk_size": "8", "encode_vision_once": "true"}
OLD_DATA_KEYS = ("root train_file videos bench mode processor trust_remote_code fps max_frames max_pixels max_image_pixels "
                 "frame_max_tokens max_prompt_tokens max_target_tokens batch_size val_batch_size num_workers seed "
                 "curriculum on_bad_item max_skip_fraction system_prompt repeat_batches train_limit val_limit "
                 "instruction predict_file predict_limit").split()


def _group_classes() -> dict[str, type]:
    """``"model.task.init_args.loss"`` / ``"data.video"`` -> the group's dataclass."""
    import typing

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.tasks.grpo import GRPOTask

    task, data = typing.get_type_hints(GRPOTask.__init__), typing.get_type_hints(GraspDataModule.__init__)
    return {**{f"model.task.init_args.{g}": task[g] for g in TASK_GROUPS}, **{f"data.{g}": data[g] for g in DATA_GROUPS}}


def _help_entries(text: str) -> dict[str, str]:
    """``--key`` -> its help text (without the ``(type: ..., default: ...)`` tail) from an argparse ``--help``."""
    import re

    entries: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        match = re.match(r"^  (--[\w.]+)", line)
        if match:
            key = match.group(1)
            rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)  # the option (and metavar), then the help, if short
            entries[key] = rest[1] if len(rest) > 1 and not rest[1].startswith("--") else ""
        elif key is not None and line.startswith(" " * 8):
            entries[key] += " " + line.strip()
        else:
            key = None
    return {k: re.sub(r"\(type: .*", "", v, flags=re.S).strip() for k, v in entries.items()}


def test_help_documents_every_grouped_option(in_repo, capsys) -> None:
    """``fit --help`` lists every key of the DataModule's groups and ``fit --model.task.help GRPOTask`` every key of
    the task's, each with a help line of its own (the dataclasses' ``Attributes:``), and nothing outside a group."""
    import dataclasses

    from grasp_lightning.__main__ import main as dispatch

    for args, prefix in ((["fit", "--help"], "data."),
                         (["fit", "--model.task.help", "GRPOTask"], "model.task.init_args.")):
        with pytest.raises(SystemExit) as done:
            dispatch(args)
        assert done.value.code == 0
        entries = _help_entries(capsys.readouterr().out)
        entries = {k.replace("--model.task.", "--model.task.init_args."): v for k, v in entries.items()}  # the task's help
        listed = {k[2:] for k in entries if k.startswith("--" + prefix) and k.count(".") > prefix.count(".")
                  and not k.startswith("--data.eval_suites")}  # the plugin list (and its .help)
        expected = {f"{group}.{f.name}" for group, cls in _group_classes().items() if group.startswith(prefix)
                    for f in dataclasses.fields(cls)} - LINKED
        assert listed == expected, (listed ^ expected)
        undocumented = sorted(k for k in expected if len(entries["--" + k].split()) < 3)
        assert not undocumented, undocumented
        if prefix == "data.":
            assert {k.split(".")[1] for k in listed} == set(DATA_GROUPS)
            assert "--data.eval_suites" in entries  # the one plugin list outside the groups


def test_print_config_of_sgr_shows_the_groups_with_the_recipe_values(in_repo, capsys) -> None:
    """``fit --config configs/sgr.yaml --print_config``: the task's and the DataModule's settings by group, with
    every key of each group (but the two linked from ``model.policy``) and the recipe's values in their groups."""
    import dataclasses

    from grasp_lightning.__main__ import main as dispatch

    with pytest.raises(SystemExit) as done:
        dispatch(["fit", "--config", str(CONFIGS / "sgr.yaml"), "--print_config"])
    assert done.value.code == 0
    out = capsys.readouterr().out  # DeepSpeed's accelerator line may come first: the YAML starts at the first key
    printed = yaml.safe_load(out[out.index("seed_everything:"):])
    task, data = printed["model"]["task"]["init_args"], printed["data"]
    assert list(task) == list(TASK_GROUPS) and list(data) == [*DATA_GROUPS, "eval_suites"]
    for group, cls in _group_classes().items():
        section = task if group.startswith("model.") else data
        keys = [f.name for f in dataclasses.fields(cls) if f"{group}.{f.name}" not in LINKED]  # links: not printed
        assert list(section[group.rsplit(".", 1)[1]]) == keys, group
    recipe = _yaml("sgr")
    for group in recipe["model"]["task"]["init_args"]:
        for key, value in recipe["model"]["task"]["init_args"][group].items():
            assert task[group][key] == value, (group, key)
    for group in recipe["data"]:
        for key, value in recipe["data"][group].items():
            assert data[group][key] == value, (group, key)
    assert task["loss"]["beta"] == 0.05 and data["video"]["max_frames"] == 512  # spot values of configs/sgr.yaml


@pytest.fixture(scope="module")
def fit_parser():
    """The ``fit`` parser (configs/sgr.yaml), raising instead of exiting on a bad argument."""
    from grasp_lightning.commands.train import build_cli

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        parser = build_cli(["--config", str(CONFIGS / "sgr.yaml")], run=False, build_trainer=False).parser
    parser.exit_on_error = False
    return parser


@pytest.mark.parametrize("key", [f"model.task.init_args.{k}" for k in OLD_TASK_KEYS] + [f"data.{k}" for k in OLD_DATA_KEYS])
def test_an_old_flat_key_is_refused_naming_it(fit_parser, key) -> None:
    """Every key of the flat layout is an error naming it, on the command line and in a YAML file, never ignored."""
    from jsonargparse import ArgumentError

    name = key.rsplit(".", 1)[1]
    value = OLD_TASK_KEYS.get(name, "1") if key.startswith("model.") else "1"
    with pytest.raises(ArgumentError, match=name):
        fit_parser.parse_args(["--config", str(CONFIGS / "sgr.yaml"), f"--{key}={value}"])
    head, leaf = key.rsplit(".", 1)
    tree: dict = {leaf: yaml.safe_load(value)}
    for part in reversed(head.split(".")):
        tree = {part: tree}
    with pytest.raises(ArgumentError, match=name):
        fit_parser.parse_args(["--config", str(CONFIGS / "sgr.yaml"), "--config", yaml.safe_dump(tree)])


def test_a_grouped_key_parses_and_a_group_given_a_flat_value_is_refused(fit_parser) -> None:
    """The grouped keys take values (the parser's result holds them where the groups say); from Python, a group
    given anything but its dataclass is a GraspConfigError naming the group and its keys."""
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.tasks.grpo import GRPOTask

    cfg = fit_parser.parse_args(["--config", str(CONFIGS / "sgr.yaml"), "--model.task.init_args.loss.beta=0",
                                 "--model.task.init_args.reward.terms=[accuracy]", "--data.video.fps=1.5"])
    assert (cfg.model.task.init_args.loss.beta, cfg.model.task.init_args.reward.terms) == (0.0, ["accuracy"])
    assert cfg.data.video.fps == 1.5 and cfg.data.loader.batch_size == 1  # the rest of the group: the recipe's
    with pytest.raises(GraspConfigError, match=r"model.task.init_args.advantage is a setting group \(kind, eps, "
                                                r"clip\), got 'group'"):
        GRPOTask(advantage="group")


# ------------------------------------------------------------------ keys that moved, the released group, defaults
@pytest.mark.parametrize("key, new", [
    ("model.task.init_args.batching.drop_zero_variance_groups", "model.task.init_args.batching.dynamic_sampling"),
    ("data.loader.mode", "data.loader.data_mode"),
    ("model.evaluation.max_frames", "model.evaluation.released.max_frames"),
    ("model.evaluation.reasoning", "model.evaluation.released.reasoning"),
    ("model.evaluation.model_type", "model.evaluation.released.model_type"),
    ("model.evaluation.timestamps", "model.evaluation.released.timestamps"),
    ("model.evaluation.frame_max_tokens", "model.evaluation.released.frame_max_tokens"),
    ("model.evaluation.frame_spatial_patch", "model.evaluation.released.frame_spatial_patch"),
])
def test_a_moved_key_is_refused_naming_the_key_that_holds_it(tmp_path, key, new) -> None:
    """On the command line, in a YAML file and in a YAML string, a key that moved stops the run at start-up with a
    GraspConfigError naming it and its new key (jsonargparse alone says only "not accepted")."""
    from grasp_lightning.commands.train import MOVED_KEYS, build_cli
    from grasp_lightning.errors import GraspConfigError

    assert MOVED_KEYS[key] == new
    head, leaf = key.rsplit(".", 1)
    tree: dict = {leaf: "1"}
    for part in reversed(head.split(".")):
        tree = {part: tree}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(tree))
    message = f"{key} is not a setting: set {new} instead"
    for extra in ([f"--{key}=1"], [f"--{key}", "1"], ["--config", str(tmp_path / "old.yaml")],
                  ["--config", yaml.safe_dump(tree)], [f"--{head}", json.dumps({leaf: 1})]):
        with pytest.raises(GraspConfigError) as err:
            build_cli(["--config", str(CONFIGS / "sgr.yaml"), *extra], run=False, build_trainer=False)
        assert str(err.value) == message, extra


def test_the_released_protocol_settings_are_a_group_of_their_own(fit_parser) -> None:
    """``model.evaluation.released.<key>`` parses into ``ReleasedEvalConfig`` and reaches the protocol; the
    decoding keys stay one level up."""
    import dataclasses

    from grasp_lightning.module import EvalConfig, ReleasedEvalConfig

    cfg = fit_parser.parse_args(["--config", str(CONFIGS / "sgr.yaml"), "--config", str(CONFIGS / "eval_released.yaml"),
                                 "--model.evaluation.released.max_frames=8",
                                 "--model.evaluation.released.model_type=qwen3_5"])
    evaluation = fit_parser.instantiate_classes(cfg).model.eval_cfg
    assert isinstance(evaluation, EvalConfig) and isinstance(evaluation.released, ReleasedEvalConfig)
    assert (evaluation.protocol, evaluation.released.max_frames, evaluation.released.model_type) == ("released", 8,
                                                                                                      "qwen3_5")
    assert evaluation.released.timestamps == "released" and evaluation.released.frame_max_tokens == 256
    assert evaluation.make_protocol().settings == dict(reasoning=True, model_type="qwen3_5", max_frames=8,
                                                       frame_max_tokens=256, timestamps="released")
    assert [f.name for f in dataclasses.fields(EvalConfig)] == [
        "protocol", "max_new_tokens", "do_sample", "temperature", "top_p", "stop_at_answer", "engine", "released"]


def test_every_model_setting_group_is_importable_from_the_module_and_in_its_table() -> None:
    """``grasp_lightning.module`` is the one place the ``model.*`` setting groups are found: every dataclass argument
    of ``GraspModule`` (and the groups nested in one) is importable from it and named in its docstring's table."""
    import dataclasses
    import typing

    import grasp_lightning.module as module

    hints = typing.get_type_hints(module.GraspModule.__init__)
    groups = {name: cls for name, cls in hints.items() if dataclasses.is_dataclass(cls)}
    nested = {f"{name}.{f.name}": typing.get_type_hints(cls)[f.name] for name, cls in groups.items()
              for f in dataclasses.fields(cls) if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name])}
    assert set(groups) == {"policy", "reference", "lora", "optim", "rollout", "evaluation"}
    assert set(nested) == {"rollout.vllm", "evaluation.released"}
    for name, cls in {**groups, **nested}.items():
        assert getattr(module, cls.__name__) is cls and cls.__name__ in module.__all__, name
        assert f"``model.{name}``" in module.__doc__ and f"``{cls.__name__}``" in module.__doc__, name


def test_the_loss_function_defaults_to_the_configs_loss_type() -> None:
    """``grpo_loss`` called without ``loss_type`` aggregates as ``model.task.init_args.loss.type`` does by default."""
    import inspect

    from grasp_lightning.grpo.config import LossConfig
    from grasp_lightning.grpo.objective import grpo_loss

    assert inspect.signature(grpo_loss).parameters["loss_type"].default == LossConfig().type == "grpo"
