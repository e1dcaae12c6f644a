"""The commands of ``python -m grasp_lightning``: one table, one dispatcher (:mod:`grasp_lightning.__main__`).

Every command is a module with ``main(argv) -> int | None`` that builds its own parser; the table
names the module (imported only when its command runs, so ``--help`` is fast) and gives the one-line
help that ``python -m grasp_lightning --help`` lists. ``fit``, ``validate``, ``test`` and ``predict``
are LightningCLI's subcommands (:mod:`grasp_lightning.commands.train`): their ``main`` gets the
subcommand's name too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One command of ``python -m grasp_lightning``.

    Attributes:
        module: the module whose ``main(argv)`` runs it (its exit status, ``None`` for 0).
        help: the one-line description ``--help`` lists.
        lightning: a LightningCLI subcommand: ``main`` gets ``[name, *argv]`` instead of ``argv``.
        doc: the how-to page of the command (``docs/...``), named by its own ``--help``.
    """

    module: str
    help: str
    lightning: bool = False
    doc: str | None = None

    @property
    def description(self) -> str:
        """The help line and the how-to page: the top of ``python -m grasp_lightning NAME --help``."""
        return f"{self.help[0].upper()}{self.help[1:]}." + (f" How-to: {self.doc}." if self.doc else "")


_TRAIN = "grasp_lightning.commands.train"

#: Command name -> :class:`Command`, in the order ``--help`` lists them.
COMMANDS: dict[str, Command] = {
    "fit": Command(_TRAIN, "train with the configured task (SFT or GRPO)", lightning=True, doc="docs/training.md"),
    "validate": Command(_TRAIN, "decode GRASP-Bench (and data.eval_suites), print the per-category table, "
                                "write results.json, table.md and a bar chart", lightning=True,
                        doc="docs/evaluation.md"),
    "test": Command(_TRAIN, "the same as validate, with Lightning's test loop", lightning=True,
                    doc="docs/evaluation.md"),
    "predict": Command(_TRAIN, "answer every evaluation suite's items, or data.source.predict_file's, without "
                               "scoring them: one JSON line per item naming the model, checkpoint and decoding; "
                               "a rerun answers only what is missing", lightning=True, doc="docs/predict.md"),
    "chat": Command("grasp_lightning.commands.chat", "ask the model one question (or many) about one clip, an image "
                                                     "or a folder of frames and read its reasoning", doc="docs/chat.md"),
    "export": Command("grasp_lightning.commands.export",
                      "a Lightning checkpoint (or DeepSpeed directory) -> a Hugging Face model directory and its "
                      "model card (--push_to_hub uploads it)",
                      doc="docs/scaling.md"),
    "pipeline": Command("grasp_lightning.commands.pipeline",
                        "a multi-stage recipe, each stage starting from the previous stage's export",
                        doc="docs/training.md"),
    "check-data": Command("grasp_lightning.commands.check_data",
                          "scan a dataset before training: every line, clip, answer, event and token budget",
                          doc="docs/data.md"),
    "plan-memory": Command("grasp_lightning.commands.plan_memory",
                           "per-GPU memory of a config (weights, gradients, optimizer, reference, activations, "
                           "KV cache); --table: the memory table of docs/scaling.md", doc="docs/scaling.md"),
    "plot": Command("grasp_lightning.commands.plot", "draw the training curves of run folders into one PNG, to compare runs",
                    doc="docs/metrics.md"),
    "build-model": Command("grasp_lightning.synthetic.tiny",
                           "write the offline tiny Qwen3-VL, or a stand-in of a real checkpoint (--like)"),
    "make-sample": Command("grasp_lightning.synthetic.sample_data",
                           "write the small GRASP-format sample dataset (the bundled one: --seed 0)"),
}
