"""The rich progress bar of a distillation run: time against the budget, loss, agreement."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class TrainProgress:
    """A bar over the wall-clock budget (the run ends on time, not on a step count)."""

    def __init__(self, budget_s: float, enabled: bool = True):
        self.budget_s = budget_s
        self.progress = Progress(
            TextColumn("[bold]distilling"), BarColumn(), TimeElapsedColumn(),
            TextColumn("step {task.fields[step]}"), TextColumn("loss {task.fields[loss]}"),
            TextColumn("held-out agreement {task.fields[agreement]}"),
            console=Console(stderr=True), disable=not enabled)
        self.task = self.progress.add_task("distil", total=budget_s, step=0, loss="-",
                                           agreement="-")

    def __enter__(self) -> TrainProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self, start: float, step: int, loss: float | None, agreement: float) -> None:
        self.progress.update(self.task, completed=min(time.perf_counter() - start, self.budget_s),
                             step=step, loss="-" if loss is None else f"{loss:.4f}",
                             agreement=f"{agreement:.1%}")
