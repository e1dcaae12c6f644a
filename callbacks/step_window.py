"""The micro-batches of one optimizer step, as an observer callback sees them.

With ``trainer.accumulate_grad_batches = A`` Lightning calls ``on_train_batch_start`` and
``on_train_batch_end`` A times per optimizer step; ``trainer.global_step`` advances only inside the
last micro-batch's ``training_step`` (the optimizer step, or the epoch's last, shorter window).
:class:`StepWindow` tells a callback which micro-batches belong together, so it collects over the
whole window and writes once, when the optimizer has stepped, at the step the window fed: its 0-based
index, ``trainer.global_step`` before the step — where Lightning writes the module's ``self.log``
values of the same window (``fit_loop.epoch_loop._batches_that_stepped``), so a callback's series
and the ``train/`` series line up point for point.
"""

from __future__ import annotations


class StepWindow:
    """Track the accumulation window of the current optimizer step.

    Call :meth:`start` in ``on_train_batch_start`` and :meth:`stepped` in ``on_train_batch_end``.

    Attributes:
        step: the 0-based index of the optimizer step the current window feeds (``-1`` before the first).
        micro_batches: micro-batches seen so far in the current window.
    """

    def __init__(self) -> None:
        self.step = -1
        self.micro_batches = 0
        self._open = False

    def start(self, trainer) -> bool:
        """Register a micro-batch; ``True`` when it opens a new window (the first of its step)."""
        opened = not self._open
        if opened:
            self.step, self.micro_batches, self._open = trainer.global_step, 0, True
        self.micro_batches += 1
        return opened

    def stepped(self, trainer) -> bool:
        """``True`` when this micro-batch ran the optimizer step (``trainer.global_step`` advanced), which
        closes the window."""
        if self._open and trainer.global_step > self.step:
            self._open = False
            return True
        return False
