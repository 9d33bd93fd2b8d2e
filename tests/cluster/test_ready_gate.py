"""Trustworthy CPU timings: dispatch waits for every worker (or says how many are missing after a
bounded wait), and CPU timing workers are not oversubscribed unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import ray
import raykit

from cluster import session
from cluster.dispatch import Dispatcher, DispatchOptions, WorkItem
from kernels.base import TrialRequest
from kernels.measure.policy import MeasurePolicy


@pytest.fixture(scope="module")
def two_cores_four_gpus(ray_local):
    """The session's Ray (tests/raykit.py): one node, 2 CPU cores and 4 logical GPUs (no accelerator)."""
    assert (raykit.LOGICAL_CPUS, raykit.LOGICAL_GPUS) == (2, 4)
    return ray_local


class Events:
    """The dispatcher's callbacks, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None:
        self.log.append(("ready", slot))

    def dispatch_started(self, ready: int, wanted: int, waited_s: float) -> None:
        self.log.append(("dispatch", (ready, wanted, waited_s)))

    def worker_lost(self, slot: str, reason: str, retired: bool) -> None:
        self.log.append(("lost", reason))

    def trial_started(self, item: WorkItem, slot: str) -> None:
        self.log.append(("started", slot))

    def trial_finished(self, item: WorkItem, slot: str, result: Any) -> None:
        self.log.append(("finished", slot))

    def trial_timed_out(self, item: WorkItem, slot: str, seconds: float) -> None:
        self.log.append(("timeout", slot))

    def trial_crashed(self, item: WorkItem, slot: str, error: str, final: bool) -> None:
        self.log.append(("crashed", slot))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.log]


def _items(n: int) -> list[WorkItem]:
    policy = MeasurePolicy(warmup_ms=0, min_samples=1, max_samples=1, max_time_s=0.1)
    return [
        WorkItem(i, TrialRequest("probe", "noop", {"n": i}, {}, "float32", policy=policy)) for i in range(n)
    ]


def test_no_trial_is_handed_out_before_every_worker_is_ready(two_cores_four_gpus):
    events = Events()
    Dispatcher(DispatchOptions(workers=2, gpu=True, timeout_s=60, name_prefix="gate-all"), events).run(
        _items(12)
    )
    kinds = events.kinds()
    assert kinds.count("finished") == 12
    first_trial = kinds.index("started")
    assert kinds[:first_trial].count("ready") == 2
    [(ready, wanted, _waited)] = [v for k, v in events.log if k == "dispatch"]
    assert (ready, wanted) == (2, 2)


@pytest.mark.slow  # waits out the bounded wait
def test_after_the_bounded_wait_dispatch_starts_with_the_ready_workers_and_says_how_many_are_missing(
    two_cores_four_gpus,
):
    events = Events()
    # five GPU workers on a cluster of four GPUs: the fifth can never start
    options = DispatchOptions(
        workers=5, gpu=True, timeout_s=60, ready_wait_s=2.0, start_timeout_s=120, name_prefix="gate-miss"
    )
    Dispatcher(options, events).run(_items(6))
    [(ready, wanted, waited)] = [v for k, v in events.log if k == "dispatch"]
    assert wanted == 5 and 1 <= ready <= 4 and waited >= 2.0
    assert events.kinds().count("finished") == 6


def test_cpu_timing_workers_are_cut_to_the_cores_unless_oversubscribed(two_cores_four_gpus):
    plan = session.connect()
    assert plan.workers == 2 and plan.gpu and not plan.cuda
    assert "asked for 4 workers" in plan.note and "--oversubscribe" in plan.note
    assert "CPU timings" in plan.note
    over = session.connect(oversubscribe=True)
    assert over.workers == 4 and "oversubscribed" in over.note


JOIN = """
import json, sys
from cluster import session
plan = session.connect(sys.argv[1], gpus=int(sys.argv[2]), oversubscribe=sys.argv[3] == "1")
print(json.dumps({"workers": plan.workers, "cuda": plan.cuda, "note": plan.note, "address": plan.address}))
"""


def _join(address: str, gpus: int, oversubscribe: bool) -> dict:
    """Another process joins the session's cluster by its address, as `farm --address` does."""
    proc = subprocess.run(
        [sys.executable, "-c", JOIN, address, str(gpus), "1" if oversubscribe else "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_logical_gpus_of_a_joined_cluster_give_cpu_timings_whatever_the_driver_has(two_cores_four_gpus):
    address = ray.get_runtime_context().gcs_address
    plan = _join(address, gpus=2, oversubscribe=True)
    assert plan["address"] == address
    assert not plan["cuda"] and plan["workers"] == 2 and "no CUDA device" in plan["note"]


def test_grow_revives_a_retired_slot_first_then_adds_new_ones_started_at_once_when_warm(two_cores_four_gpus):
    """A pool follows the cluster through Dispatcher.grow: a slot retired (its node gone) comes back
    before a new one is added, and a warm dispatcher starts their workers at once."""
    d = Dispatcher(DispatchOptions(workers=2, gpu=True, timeout_s=60, name_prefix="grow"), Events())
    d.slots[1].retired = True  # as after its worker could not start within start_timeout_s
    try:
        assert d.grow(1) == 0  # w0 is live: nothing to add
        d.run(_items(2), keep_workers=True)  # warm: w0's worker stays up
        assert d.grow(3) == 2
        assert [s.name for s in d.slots] == ["w0", "w1", "w2"] and not any(s.retired for s in d.slots)
        started = [s for s in d.slots[1:] if s.ready_ref is not None]
        assert len(started) == 2
        assert {ray.get(s.ready_ref, timeout=120)["slot"] for s in started} == {"w1", "w2"}
        assert d.grow(3) == 0
    finally:
        d.shutdown()
