"""The README's "Your own task" section, run as written: the example reward file and its `fit` command."""

from __future__ import annotations

import re
import shlex

from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.rewards import compute_rewards
from tests.conftest import REPO, run_cli, scalars

README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    """The README text under the heading ``title`` up to the next heading of any level."""
    start = README.index(title)
    match = re.compile(r"^#{2,3} ", re.M).search(README, start + len(title))
    return README[start: match.start() if match else len(README)]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def command(block: str) -> list[str]:
    """The arguments after ``python -m grasp_lightning`` of a README bash block (continuations joined)."""
    words = shlex.split(block.replace("\\\n", " "))
    return words[words.index("grasp_lightning") + 1:]


def test_readme_reward_example_scores_and_trains(tmp_path, monkeypatch) -> None:
    text = section("### A reward of your own")
    (code,) = blocks(text, "python")
    (tmp_path / "my_rewards.py").write_text(code)
    for name in ("configs", "grasp_lightning"):  # the README's command runs from the repository root
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    item = GraspItem(uid="x", origin="t:1", clip=ClipRef("c.mp4"), question="q", answer="B")
    short, long = "<think>" + "word " * 60 + "</think><answer>B</answer>", "<think>" + "word " * 61 + "</think><answer>B</answer>"
    out = compute_rewards([short, long, "<think>x</think><answer>A</answer>"], [item] * 3, ["my_rewards.py:brief_and_right"])
    assert out[:, 0].tolist() == [1.0, 0.5, 0.0]
    (fit,) = blocks(text, "bash")
    args = command(fit)
    assert args[0] == "fit" and "my_rewards.py:brief_and_right]" in " ".join(args)
    cli = run_cli([*args, "--trainer.max_steps=1", "--data.bench=null", "--data.num_workers=0",
                   "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=8"], tmp_path)
    series = scalars(cli.trainer.log_dir)
    assert len(series["train/rewards/brief_and_right/mean"]) == 1  # the term is logged under its function's name
    assert cli.model.task.reward_labels[-1] == "brief_and_right"


def test_readme_qa_rows_and_suite_read_as_documented(tmp_path) -> None:
    import json

    import yaml

    from grasp_lightning.data.qa import read_qa
    from grasp_lightning.plugins import load_object
    from tests.data_fixtures import make_image, make_mp4

    text = section("### Your own data")
    (rows,) = blocks(text, "json")
    (tmp_path / "clips").mkdir()
    (tmp_path / "images").mkdir()
    (tmp_path / "clips" / "kitchen.mp4").write_bytes(make_mp4(n_frames=16, fps=2))
    (tmp_path / "images" / "meeting.jpg").write_bytes(make_image(fmt="JPEG"))
    (tmp_path / "qa.val.jsonl").write_text(rows)
    items = read_qa(tmp_path / "qa.val.jsonl")
    first, second = items
    assert [json.loads(line)["id"] for line in rows.splitlines()] == [first.uid, second.uid]
    assert first.media == ("video",) and first.clip.start_seconds == 0.0 and first.clip.end_seconds == 6.0
    assert first.options == ("A) Person 1", "B) Person 2", "C) No one") and first.participants == {0, 1}
    assert second.media == ("image",) and second.answer == "B" and second.response.endswith("<answer>B</answer>")
    (suite_yaml,) = blocks(text, "yaml")
    (spec,) = yaml.safe_load(suite_yaml)["data"]["eval_suites"]
    suite = load_object(spec["class_path"])(**{**spec["init_args"], "path": str(tmp_path / "qa.val.jsonl")})
    suite.load()
    assert suite.name == "mine" and [item.uid for item in suite.items] == [first.uid, second.uid]
