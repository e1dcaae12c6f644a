"""A run one can watch (callbacks/watch.py, grasp_lightning/monitoring/curves.py, ``plot``): a GRPO-SGR demo ``fit`` in
a real process, its console captured in a file, shows one line per logged step with the logged
reward, KL, length and step time; its run folder holds ``curves.jsonl`` and ``curves.png``; ``plot``
draws two run folders into one figure and refuses a missing or empty folder with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, SGR_REWARDS, scalars

STEPS = 2
LINE = re.compile(r"step (\d+)/(\d+) \| reward (\S+) \(accuracy (\S+)\) \| kl (\S+) \| len (\S+) \| zero-var (\S+) "
                  r"\| loss (\S+) \| lr (\S+) \| (\S+) s/step \| ETA (\S+)$")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """``fit --config configs/sgr.yaml --config configs/demo.yaml --trainer.max_steps=2`` (K = 4, 24 new
    tokens, a checksum reward so that rewards differ, one validation batch after step 2), stdout and
    stderr into ``console.log``; returns (run folder, console text)."""
    tmp = tmp_path_factory.mktemp("watch")
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", "configs/sgr.yaml", "--config",
           "configs/demo.yaml", f"--trainer.max_steps={STEPS}", *SGR_REWARDS, "--data.loader.num_workers=0",
           "--model.rollout.num_generations=4", "--model.rollout.max_new_tokens=24", "--model.optim.warmup_steps=0",
           f"--trainer.val_check_interval={STEPS}", "--trainer.limit_val_batches=1",
           "--model.evaluation.max_new_tokens=8", f"--trainer.logger.init_args.save_dir={tmp}",
           f"--trainer.default_root_dir={tmp}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    console = tmp / "console.log"
    with open(console, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600)
    text = console.read_text()
    assert proc.returncode == 0, text[-3000:]
    return tmp / "demo" / "version_0", text


def test_the_console_shows_one_line_per_logged_step_with_the_logged_values(demo_run) -> None:
    folder, text = demo_run
    lines = [line for line in text.splitlines() if "grasp_lightning.callbacks.watch:" in line]
    assert len(lines) == STEPS
    logged = scalars(folder)
    for step, line in enumerate(lines):
        assert "\r" not in line
        m = LINE.search(line)
        assert m, line
        shown, total, reward, accuracy, kl, length, zero_var, loss, lr, seconds, eta = m.groups()
        assert (int(shown), int(total)) == (step + 1, STEPS)

        def at(tag: str) -> float:
            return dict(logged[tag])[step]

        assert float(reward) == pytest.approx(at("train/reward/mean"), abs=5e-5)
        assert float(accuracy) == pytest.approx(at("train/rewards/accuracy/mean"), abs=5e-5)
        assert float(kl) == pytest.approx(at("train/kl"), rel=1e-3, abs=1e-12)
        assert float(length) == pytest.approx(at("train/completion_length/mean"), abs=0.05)
        assert float(zero_var) == pytest.approx(at("train/zero_variance_groups/fraction"), abs=0.005)
        assert float(loss) == pytest.approx(at("train/loss"), rel=1e-3, abs=1e-12)
        assert float(lr) == pytest.approx(at("lr-AdamW"), rel=5e-3)
        assert float(seconds) == pytest.approx(at("time/optimizer_step_s"), abs=0.005)
        assert float(seconds) > 0
    assert lines[-1].endswith("ETA 0:00:00")
    assert "Epoch 0:" not in text  # Lightning's progress bar is off when the console is a file


def test_the_run_folder_keeps_the_logged_history_and_draws_it(demo_run) -> None:
    folder, _ = demo_run
    records = [json.loads(line) for line in (folder / "curves.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/reward/mean" in r]
    assert [r["step"] for r in train] == list(range(STEPS))
    logged = scalars(folder)
    for record in train:
        for tag in ("train/reward/mean", "train/kl", "train/completion_length/mean", "time/optimizer_step_s",
                    "train/loss"):
            assert record[tag] == pytest.approx(dict(logged[tag])[record["step"]], rel=1e-6), tag
    val = [r for r in records if "val/acc/overall" in r]
    assert [r["step"] for r in val] == [step for step, _ in logged["val/acc/overall"]]
    assert val[0]["val/acc/overall"] == pytest.approx(logged["val/acc/overall"][0][1], rel=1e-6)
    png = (folder / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_plot_compares_two_run_folders_in_one_figure(demo_run, tmp_path, capsys) -> None:
    from grasp_lightning.commands.plot import main, plot
    from grasp_lightning.monitoring.curves import read_history, series

    folder, _ = demo_run
    other = tmp_path / "grpo"
    other.mkdir()
    (other / "curves.jsonl").write_text("".join(json.dumps({"step": s, "train/reward/mean": 0.1 * s, "train/kl": 0.01})
                                                + "\n" for s in range(3)))
    out = tmp_path / "compare.png"
    fig = plot([str(folder), str(other)], out, labels=["sgr", "grpo"])
    assert out.read_bytes()[:4] == b"\x89PNG"
    reward = next(ax for ax in fig.axes if ax.get_title() == "reward")
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in reward.get_lines()}
    assert lines["grpo: train/reward/mean"] == ([0, 1, 2], pytest.approx([0.0, 0.1, 0.2]))
    assert lines["sgr: train/reward/mean"] == series(read_history(folder), "train/reward/mean")
    assert "sgr: train/rewards/accuracy/mean" in lines and "grpo: train/rewards/accuracy/mean" not in lines
    kl = next(ax for ax in fig.axes if ax.get_title().startswith("KL"))
    styles = {line.get_label(): (line.get_color(), line.get_linestyle()) for line in kl.get_lines()}
    assert sorted(styles) == ["grpo: train/kl", "sgr: train/kl"]
    assert styles["sgr: train/kl"][0] == styles["grpo: train/kl"][0]  # one colour per tag, a line style per run
    assert (styles["sgr: train/kl"][1], styles["grpo: train/kl"][1]) == ("-", "--")

    assert main([str(folder), str(other), "--out", str(tmp_path / "cli.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli.png")
    assert (tmp_path / "cli.png").is_file()


def test_plot_refuses_a_missing_or_empty_folder_with_one_line(tmp_path, capsys) -> None:
    from grasp_lightning.commands.plot import main

    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'nowhere'}: no such run folder\n"
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no curves.jsonl" in err
    assert not (tmp_path / "x.png").exists()
