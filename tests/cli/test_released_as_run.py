"""The released GRASP GRPO run as it ran (docs/released-recipe.md, "What the released run did").

1. The released reward terms, re-implemented here from the facts of the released code (the patterns of
   ``socialmllm/train/reasoning/trainer.py:9-12`` and the flags of ``:255-262``, the grounding score of
   ``:15-69``, read on the row's JSON as ``train_utils.py:217-223`` reads it), against our reader and the
   terms ``configs/released/sgr.yaml`` lists: 0 differences on random completions.
2. A small simulation of the released training loop, written from the facts of transformers 5.3.0's
   ``Trainer`` (``trainer.py``: ``set_initial_training_values`` 2300-2321, ``_run_epoch`` 1687-1760,
   ``training_step`` 1925-1927, ``DefaultFlowCallback`` ``trainer_callback.py:592-593``) and the released
   ``get_batch_samples`` (``reasoning/trainer.py:78-90``: each prompt becomes K micro-batches of one rollout,
   ``:138-164``), against the optimizer steps ``configs/released/sgr_as_run.yaml`` gives our loop.
"""

from __future__ import annotations

import math
import random
import re

import pytest

from grasp_lightning.commands.config import config_args, load_run
from grasp_lightning.grpo.rewards import compute_rewards

SGR = ["configs/sgr.yaml", "configs/released/sgr.yaml"]
AS_RUN = [*SGR, "configs/released/sgr_as_run.yaml"]

# --- 1. the released reward terms ------------------------------------------------------------------
# Facts of socialmllm/train/reasoning/trainer.py at 805d115 (patterns at :9-12, flags at :255-262).
RELEASED_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>")  # no DOTALL
RELEASED_GAZE = re.compile(r"<gaze>(.*?)</gaze>", re.DOTALL)
RELEASED_GESTURE = re.compile(r"<gesture>(.*?)</gesture>", re.DOTALL)
RELEASED_PERSON = re.compile(r"(?:Person\s+|\bP)(\d+)")


def released_grounding(text: str, events: list[dict], question_text: str) -> float:
    """compute_grounding_score (trainer.py:15-69) as the released code defines it, on the row's JSON."""
    if not events:
        return 0.0
    gaze_text = " ".join(RELEASED_GAZE.findall(text))
    gesture_text = " ".join(RELEASED_GESTURE.findall(text))
    if not gaze_text.strip() and not gesture_text.strip():
        return 0.0
    named = {"gaze": {int(m) for m in RELEASED_PERSON.findall(gaze_text)},
             "gesture": {int(m) for m in RELEASED_PERSON.findall(gesture_text)}}
    asked = {int(m) for m in RELEASED_PERSON.findall(question_text)} if question_text else set()
    gt = {"gaze": set(), "gesture": set()}
    for event in events:
        gt["gaze" if event["source"] == "gaze" else "gesture"].update(set(event.get("persons", [])) - asked)
    if not gt["gaze"] and not gt["gesture"]:
        return 0.0
    recalls = []
    for event in events:
        people = set(event.get("persons", [])) - asked
        if people:
            recalls.append(len(named["gaze" if event["source"] == "gaze" else "gesture"] & people) / len(people))
    precisions = [len((named[m] - asked) & gt[m]) / len(named[m] - asked) for m in ("gaze", "gesture")
                  if named[m] - asked and gt[m]]
    recall = sum(recalls) / len(recalls) if recalls else 0.0
    precision = sum(precisions) / len(precisions) if precisions else 0.0
    return 0.7 * recall + 0.3 * precision


def released_terms(text: str, target: str, events: list[dict], question_text: str) -> list[float]:
    """``[is_correct, has_format, has_grounding, grounding_quality]`` of one completion (trainer.py:252-275)."""
    match = RELEASED_ANSWER.search(text)
    correct = bool(match) and match.group(1).strip() == target
    grounding = bool(RELEASED_GAZE.search(text) or RELEASED_GESTURE.search(text))
    return [float(correct), float(bool(match)), float(grounding), released_grounding(text, events, question_text)]


PIECES = ["<answer>", "</answer>", "<gaze>", "</gaze>", "<gesture>", "</gesture>", "<think>", "</think>", "A", "B",
          "C", " ", "  ", "\n", "\n\n", "\t", "Person 0", "Person 1", "Person  3", "Person\n2", "Person4", "P1", "P12",
          "AP2", "P3a", " and ", " looks at ", "x", "y", "B)", "(B)", "b", "<answer"]
MUST = ["<answer>B\nB</answer>", "<answer>x\ny</answer><answer>B</answer>", "<answer></answer>", "<answer>\nB\n</answer>",
        "<answer> B </answer>", "<gaze></gaze>", "<gesture>\n</gesture><answer>B</answer>",
        "<think><gaze>Person 0</gaze><gesture>P2 and Person 1</gesture></think><answer>B</answer>",
        "<answer>B\n</answer>\n<answer>C</answer>", "<gaze>Person 0\n</gaze><answer>\n\nB</answer>"]


def _rows(rng: random.Random, n: int) -> list[list[dict]]:
    """``n`` data_rl.jsonl rows with random events (sources written as the data does and not), people and
    question texts (missing, empty, naming people)."""
    from tests.helpers import rl_row

    rows = []
    for i in range(n):
        events = [{"source": rng.choice(["gaze", "Gaze", "pointing", "nod", " gaze "]),
                   "persons": rng.sample(range(5), rng.randint(1, 3))} for _ in range(rng.randint(0, 3))]
        meta = {"type": "meta", "difficulty": "easy", "gt_events": events}
        question = rng.choice([None, "", "Who does Person 1 point at?", "Does P0 look at Person 2 or P3?"])
        if question is not None:
            meta["question_text"] = question
        rows.append(rl_row(rng.choice("ABCD"), meta=meta, video=f"v/clip_{i}.mp4"))
    return rows


def test_released_reward_terms_match_the_released_code_on_random_completions(in_repo, tmp_path) -> None:
    from grasp_lightning.data.formats import read_rl
    from tests.helpers import write_jsonl

    terms = load_run(config_args(SGR)).task.reward.terms
    assert terms == ["accuracy_released", "format_released", "grounding_presence_released",
                     "social_grounding_released"]
    rng = random.Random(7)
    rows = _rows(rng, 24)
    items = read_rl(write_jsonl(tmp_path / "data_rl.jsonl", rows))
    texts, row_of = [], []
    for r in range(len(rows)):
        for text in MUST + ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14))) for _ in range(400)]:
            texts.append(text)
            row_of.append(r)
    ours = compute_rewards(texts, [items[r] for r in row_of], terms).tolist()
    differ = []
    for text, r, got in zip(texts, row_of, ours):
        meta = rows[r][1]
        target = next(s["content"] for s in rows[r] if s.get("output")).strip()
        want = released_terms(text, target, meta["gt_events"], meta.get("question_text", ""))
        if any(abs(a - b) > 1e-6 for a, b in zip(got, want)):
            differ.append((text, r, got, want))
    assert len(texts) == 24 * 410 and differ == []
    # the multi-line answers the issue names: released values, where ours (the paper's terms) differs
    item_b = next(i for i, it in enumerate(items) if it.answer == "B")
    paper = compute_rewards(MUST[:2], [items[item_b]] * 2, ["accuracy", "format"]).tolist()
    released = compute_rewards(MUST[:2], [items[item_b]] * 2, terms[:2]).tolist()
    assert paper == [[0.0, 1.0], [0.0, 1.0]] and released == [[0.0, 0.0], [1.0, 1.0]]


# --- 2. the released loop as it ran --------------------------------------------------------------------

def released_loop(batches: int, accumulate: int, k: int) -> tuple[list[list[tuple[int, int]]], list[int], int]:
    """One rank's epoch of the released run, step by step, from the facts of transformers 5.3.0's Trainer.

    ``batches`` is ``len(dataloader)`` (batches of prompts on this rank), ``accumulate`` the
    ``gradient_accumulation_steps``, ``k`` the rollouts per prompt. Facts used (transformers/trainer.py 5.3.0):
    ``num_update_steps_per_epoch = max(L // A + int(L % A > 0), 1)`` and ``max_steps = ceil(epochs * that)``
    (2314-2321), ``steps_in_epoch = L`` (2346); the outer loop asks ``get_batch_samples`` for ``A`` batches
    (the last outer step for ``L % A`` or A, 1690-1701), which the released trainer turns into ``K`` one-rollout
    micro-batches per batch of prompts (reasoning/trainer.py:78-90, 138-164); ``current_gradient_accumulation_steps
    = len(batch_samples)`` (1705) divides each micro-batch's loss (1925-1927); the optimizer steps when
    ``(step + 1) % A == 0 or step + 1 == steps_in_epoch`` with ``step`` counting micro-batches (1717, 1756-1772);
    training stops once ``global_step >= max_steps`` (trainer_callback.py:592-593, loop exits at 1788-1791).

    Returns:
        ``(steps, divisors, max_steps)``: per optimizer step the ``(batch of prompts, rollout)`` micro-batches it
        accumulated, in order; the loss divisor of every micro-batch trained; the announced ``max_steps``.
    """
    per_epoch = max(batches // accumulate + int(batches % accumulate > 0), 1)
    max_steps = math.ceil(1 * per_epoch)  # --num_train_epochs 1 (train_sgr.sh:27)
    remainder = batches % accumulate or accumulate
    loader = iter(range(batches))
    steps, divisors, pending, step, global_step = [], [], [], -1, 0
    for update_step in range(per_epoch):
        wanted = accumulate if update_step != per_epoch - 1 else remainder
        samples = []
        for _ in range(wanted):
            try:
                b = next(loader)
            except StopIteration:
                break
            samples += [(b, j) for j in range(k)]
        for sample in samples:
            step += 1
            pending.append(sample)
            divisors.append(len(samples))
            if (step + 1) % accumulate == 0 or step + 1 == batches:
                steps.append(pending)
                pending, global_step = [], global_step + 1
                if global_step >= max_steps:
                    return steps, divisors, max_steps
    return steps, divisors, max_steps


def test_the_released_loop_simulation_matches_the_issue_figures() -> None:
    # issue 48 item 1: 256 prompts on one GPU, K = 8, accumulate 4, one epoch -> 64 steps, 32 prompts seen,
    # 4 rollouts of one prompt per step, each group over 2 steps
    steps, divisors, max_steps = released_loop(256, 4, 8)
    assert (len(steps), max_steps) == (64, 64)
    assert {b for step in steps for b, _ in step} == set(range(32))
    assert steps[0] == [(0, 0), (0, 1), (0, 2), (0, 3)] and steps[1] == [(0, 4), (0, 5), (0, 6), (0, 7)]
    assert steps[2][0] == (1, 0) and set(divisors) == {32}
    # a loader length that A does not divide: a short last step at micro-batch L (step + 1 == steps_in_epoch)
    steps, _, max_steps = released_loop(13, 4, 8)
    assert max_steps == 4 and [len(s) for s in steps] == [4, 4, 4, 1] and steps[-1] == [(1, 4)]


class _Prompts:
    """A micro-batch of prompts standing in for :class:`~grasp_lightning.data.collate.Batch` (no decoding)."""

    def __init__(self, indices):
        self.indices = list(indices)
        self.window = None

    def __len__(self) -> int:
        return len(self.indices)


def _our_steps(run, rank: int, world: int, prompts: int, monkeypatch) -> tuple[list, int, list[int]]:
    """Our loop for one rank: the DataModule's train loader under the as-run overlay (decoding replaced by
    dataset indices), stepped by a real Lightning Trainer with the overlay's accumulation; each micro-batch
    records what the task trains (:meth:`GRPOTask.completion_of`)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    import grasp_lightning.datamodule as dm_module
    from grasp_lightning.data.records import ClipRef, GraspItem
    from grasp_lightning.data.windows import WindowCollate

    task, dm, k = run.task, run.datamodule, run.module.rollout_cfg.num_generations
    accumulate = run.trainer.accumulate_grad_batches
    dm.train_items = [GraspItem(uid=f"r{i}", origin=f"rl:{i}", clip=ClipRef(path="v.mp4"), question="Q <answer>",
                                options=(), answer="B") for i in range(prompts)]
    monkeypatch.setattr(dm_module, "store_for", lambda *a, **kw: None)
    monkeypatch.setattr(dm, "_rank", lambda train=False: (rank, world))
    monkeypatch.setattr(dm, "dataset", lambda items, *a, **kw: list(range(len(items))))
    monkeypatch.setattr(dm, "_loader", lambda data, batches, side, windowed: DataLoader(
        data, batch_sampler=batches, collate_fn=WindowCollate(_Prompts, dm.loader.batch_size)))
    trainer_stub = type("T", (), {"datamodule": dm, "accumulate_grad_batches": accumulate})()
    run.module._trainer = trainer_stub
    monkeypatch.setattr(type(run.module), "rollout_engine", property(lambda self: None))
    run.module.setup("fit")  # connect(window=A, repeat=K, split_groups=True), as fit does
    run.module._trainer = None
    loader = dm.train_dataloader()
    order = loader.batch_sampler.sampler.order()[rank::world]  # the rank's prompts, by stream position

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.pending, self.steps = [], []

        def training_step(self, batch, batch_idx):
            w = batch.window
            source, completion = task.completion_of(w.position, w.iteration, len(w.batches), k)
            self.pending += [(order.index(i), completion) for i in w.batches[source].indices]
            return (self.w ** 2).sum() + 1.0

        def on_before_optimizer_step(self, optimizer):
            self.steps.append(self.pending)
            self.pending = []

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Recorder()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, accumulate_grad_batches=accumulate,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train_dataloaders=loader)
    return model.steps, int(trainer.estimated_stepping_batches), order


@pytest.mark.parametrize("prompts", [256, 100])
def test_the_as_run_overlay_steps_as_the_released_loop(in_repo, monkeypatch, prompts) -> None:
    run = load_run(config_args(AS_RUN))
    k, accumulate = run.module.rollout_cfg.num_generations, run.trainer.accumulate_grad_batches
    world, batch = run.trainer.devices, run.datamodule.loader.batch_size
    assert (k, accumulate, world, batch) == (8, 4, 8, 1)  # train_sgr.sh:28-29, arguments.py:52-55
    assert run.task.splits_groups and run.task.num_iterations == k and run.task.loss.divide_by_num_generations
    per_rank = math.ceil(prompts / world)  # len(dataloader): the sampler pads to whole global batches (both)
    want, divisors, max_steps = released_loop(per_rank, accumulate, k)
    # the loss before the clip: the Trainer divides by len(batch_samples) = A*K; ours by A (Lightning) and K
    assert set(divisors) == {accumulate * k}
    for rank in (0, world - 1):
        steps, stepping, _ = _our_steps(run, rank, world, prompts, monkeypatch)
        assert stepping == max_steps and steps == want, rank
    # the figures: 256 prompts on 8 GPUs: 32 per rank, 8 steps, 4 prompts (1/8) of each rank's 32 trained
    if prompts == 256:
        assert len(want) == 8 and {b for s in want for b, _ in s} == {0, 1, 2, 3}
    else:  # 13 per rank: 4 steps, the last of one rollout
        assert [len(s) for s in want] == [4, 4, 4, 1]


def test_our_recipes_keep_their_loop(in_repo) -> None:
    for files in (SGR, ["configs/sgr.yaml"]):
        task = load_run(config_args(files)).task
        assert not task.splits_groups and task.num_iterations == 1 and not task.loss.divide_by_num_generations


def test_the_as_run_overlay_trains_the_demo_epoch(in_repo, tmp_path, monkeypatch) -> None:
    """docs/released-recipe.md's CPU command: 24 demo rows, 2 per micro-batch, accumulation 1, K = 8: the epoch is
    the loader's 12 micro-batches, i.e. 12 steps of one rollout of 2 prompts, from 2 rollout batches (4 prompts)."""
    from grasp_lightning.tasks.grpo import GRPOTask
    from tests.helpers import run_cli

    seen, sampled = [], []
    step, sample = GRPOTask.training_step, GRPOTask.sample_window

    def recording(self, ctx, batch):
        w = batch.window
        seen.append((w.index, self.completion_of(w.position, w.iteration, len(w.batches), 8)))
        return step(self, ctx, batch)

    def counting(self, ctx, batches, window=None):
        sampled.append([i for b in batches for i in b.indices])
        return sample(self, ctx, batches, window)

    monkeypatch.setattr(GRPOTask, "training_step", recording)
    monkeypatch.setattr(GRPOTask, "sample_window", counting)
    cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/released/sgr.yaml", "--config",
                   "configs/released/sgr_as_run.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
                   "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0"], tmp_path)
    assert cli.trainer.global_step == 12 and cli.trainer.estimated_stepping_batches == 12
    assert seen == [(0, (0, j)) for j in range(8)] + [(1, (0, j)) for j in range(4)]
    assert len(sampled) == 2 and all(len(s) == 2 for s in sampled)


def test_rows_as_written_leaves_training_rows_alone_and_keeps_the_evaluation_instruction(in_repo) -> None:
    from grasp_lightning.data.prompts import INSTRUCTION, user_text
    from grasp_lightning.data.records import ClipRef, GraspItem

    item = GraspItem(uid="r", origin="rl:1", clip=ClipRef(path="v.mp4"), question="Who points?\nA) P0\nB) P1",
                     options=("A) P0", "B) P1"), answer="B")
    released = load_run(config_args([*SGR, "configs/demo.yaml"])).datamodule
    paper = load_run(config_args(["configs/sgr.yaml", "configs/demo.yaml"])).datamodule
    train, val = released.dataset([item], None, False, training=True), released.dataset([item], None, False)
    assert user_text(item, train.prompt.instruction) == "Who points?\nA) P0\nB) P1"  # the row as written
    assert val.prompt.instruction == INSTRUCTION and paper.dataset([item], None, False, training=True).prompt.instruction == INSTRUCTION
    assert user_text(item, INSTRUCTION).endswith(INSTRUCTION)
