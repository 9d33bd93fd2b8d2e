"""The queue at a team's scale (issue 46): the store's time per trial taken through the queue (a pool's
`Queue.claim`, then the result written with `Store.record_results` and the claims of written trials
dropped with `Queue.finish`, as jobs.queue.pool does per batch) while the queue holds more and more
waiting jobs, on the store the scale benchmark grew.

The figure is the median time per trial over a window of trials at each queue depth: flat means the
store's part of a trial does not grow with the queue or the store. This is the store's work only, in one
process (no Ray workers, no kernels): on a 2-core machine the issue's 10^5-trial job on 64 workers is
reduced to `trials` trials per depth, and says so.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import scale_store
from jobs.queue.queue import Queue
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of

SPEC = scale_store.PROBE.format(name="queued", n=list(range(40)))  # 400 trials a job


def queue_part(store: Store, depths: tuple[int, ...] = (1, 8, 32), trials: int = 200) -> dict[str, float]:
    """ms per trial (claim + write + finish) with `depth` jobs waiting, for each depth."""
    queue = Queue(store)
    spec = loads_spec(SPEC)
    samples = [100_000 + i for i in range(100)]
    out: dict[str, float] = {}
    waiting: list[int] = []
    for depth in depths:
        while len(waiting) < depth:
            waiting.append(queue.submit(spec, owner=f"owner{len(waiting) % 4}"))
        times = []
        for _ in range(trials):
            start = time.perf_counter()
            claimed = queue.claim("scale-pool")
            if claimed is None:
                break
            store.record_results([result_of(claimed.trial.id, samples, environment=scale_store.ENV)])
            queue.finish({claimed.job.id})
            times.append(time.perf_counter() - start)
        out[f"queue: ms per trial, {depth} jobs waiting"] = 1e3 * statistics.median(times) if times else None
    return out
