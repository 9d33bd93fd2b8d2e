"""Live progress of a sweep: done, failed, running, per node, ETA (rich), or plain lines when quiet."""

from __future__ import annotations

import collections
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kernels.base import NOT_FAILED, TrialStatus


class ProgressView:
    def __init__(self, total: int, already: int = 0, enabled: bool = True, echo: Any = print):
        self.total = total
        self.echo = echo
        self.enabled = enabled
        self.done = collections.Counter()
        self.per_node = collections.Counter()
        self.nodes: dict[str, str] = {}
        self.already = already
        self.inflight = lambda: 0  # set by the runner: trials handed to workers (the dispatcher's snapshot)
        self.retries = 0
        self._bar: Progress | None = None
        if enabled:
            self._console = Console(stderr=True)
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self._console,
                transient=False,
            )
            self._task = self._bar.add_task("sweep", total=total, completed=already, status="")

    def __enter__(self) -> ProgressView:
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar:
            self._refresh()
            self._bar.stop()

    def _refresh(self) -> None:
        if not self._bar:
            return
        failed = sum(n for s, n in self.done.items() if s not in NOT_FAILED)
        nodes = " ".join(f"{node}:{n}" for node, n in sorted(self.per_node.items()))
        status = f"ok {self.done[TrialStatus.OK]} failed {failed} running {self.inflight()}"
        if self.retries:
            status += f" retried {self.retries}"
        completed = self.already + sum(self.done.values())
        self._bar.update(self._task, completed=completed, status=f"{status} | {nodes}")

    def worker(self, slot: str, info: dict[str, Any]) -> None:
        self.nodes[slot] = info.get("node") or "?"
        gpu = info.get("gpu_id")
        self.log(
            f"worker {slot} ready on {info.get('node')} ({info.get('device')}"
            f"{', gpu ' + gpu if gpu else ''}, pid {info.get('pid')})"
        )

    def started(self) -> None:
        self._refresh()

    def finished(self, status: str, node: str | None) -> None:
        self.done[status] += 1
        self.per_node[node or "?"] += 1
        self._refresh()

    def retrying(self) -> None:
        self.retries += 1
        self._refresh()

    def log(self, message: str) -> None:
        if self._bar:
            self._bar.console.print(message)
        else:
            self.echo(message)
