"""What a CPU-timed call got of a core, and who did its work (issue 45).

On a shared runner the wall time of a call is its own work plus the time its thread stood in the run
queue while other processes had the cores: two busy loops beside a job made the same fixed amount of CPU
work read 20 to 66 ms. Linux keeps, per thread, the time it was runnable but waiting for a core
(/proc/thread-self/schedstat: time on a CPU, time in the run queue, timeslices; the scheduler's own
accounting, read in ~2 us). A sample's *level* is then its wall time less the run-queue wait inside it:
what the call took where it had a core whenever it could run. Time a call spends blocked (a sleep, I/O,
waiting on another thread) is not run-queue wait and stays in the level, so a call that waits is not
made to look fast. Where the kernel keeps no schedstat (not Linux), the level is the wall time and a
measurement whose process got far less CPU than its wall time is flagged `contended` instead
(kernels.measure.timing).

Work handed off: workers run torch on one thread, so CPU time spent by the process's *other* threads
while the timing thread runs the calls is work the call gave away (a thread pool, an async helper) that
the timed thread's clock does not see as its own. `Usage` keeps both clocks over the timed loop;
kernels.validity judges them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

SCHEDSTAT = "/proc/thread-self/schedstat"


class RunQueue:
    """The calling thread's run-queue wait so far (ns), read from the thread's own schedstat. Open it on
    the thread it is about (the file is bound to the thread that opened it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls) -> RunQueue | None:
        """This thread's reader, or None where the kernel keeps no schedstat."""
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return None
        reader = cls(fd)
        try:
            reader.wait_ns()
        except (OSError, ValueError, IndexError):
            reader.close()
            return None
        return reader

    def wait_ns(self) -> int:
        return int(os.pread(self._fd, 64, 0).split()[1])

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class Usage:
    """The timed loop's clocks: wall, the timing thread's CPU and the whole process's CPU (seconds)."""

    wall_s: float = 0.0
    thread_cpu_s: float = 0.0
    process_cpu_s: float = 0.0

    @classmethod
    def now(cls) -> Usage:
        return cls(time.perf_counter(), time.thread_time(), time.process_time())

    def since(self, start: Usage) -> Usage:
        return Usage(
            self.wall_s - start.wall_s,
            self.thread_cpu_s - start.thread_cpu_s,
            self.process_cpu_s - start.process_cpu_s,
        )

    @property
    def other_threads_cpu_s(self) -> float:
        """CPU time the process's other threads spent while the loop ran."""
        return max(0.0, self.process_cpu_s - self.thread_cpu_s)


LEVELS = {
    "wall": "wall time",
    "wall_less_run_queue": "wall time less each call's run-queue wait",
}


def level_label(clocks: dict) -> str | None:
    """What a CPU measurement's level was, in words (with the share of a core it got), or None for a GPU
    measurement (its clocks say no `level`)."""
    level = clocks.get("level")
    if level is None:
        return None
    share = clocks.get("core_share")
    return LEVELS.get(level, level) + (f" (got {share:.0%} of a core)" if share is not None else "")
