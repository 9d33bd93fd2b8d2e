"""Dynamic dispatch of trials over long-lived worker actors.

Each worker slot pulls the next trial as soon as it has room (no static partition), so a slow GPU or
node never holds the job back. A trial that names a shipped kernel source (cluster.shipping) runs on a
worker started with that source: a slot takes only trials of its own source, and an idle slot for whose
source nothing is queued is restarted with the source of the next trial no other slot will take soon.
A trial past its timeout gets its actor killed; the trial is reported as timed out and the slot gets a
fresh actor. A trial whose actor dies is retried on another worker
up to `max_attempts`; a slot whose actors keep dying is retired.

The dispatcher knows nothing about storage: it reports through the `Listener` callbacks, which the
job runner turns into database writes and progress output.
"""

from __future__ import annotations

import collections
import math
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from cluster.session import first_line
from cluster.worker import RemoteWorker, WorkerResult
from kernels.base import TrialOutcome, TrialRequest, TrialStatus

_ACTOR_GONE = (RayActorError, ActorDiedError, ActorUnavailableError)
TICK_S = 0.25  # the longest wait between two turns of the loop of a dispatcher that serves a queue


@dataclass
class WorkItem:
    trial_id: int
    request: TrialRequest
    label: str = ""
    attempts: int = 0  # attempts already made whose worker died
    avoid: set[str] = field(default_factory=set)  # slots it died on; retried elsewhere when possible
    solo: bool = False  # never batched again (set after a batch it was in timed out or crashed)
    timeout_s: float | None = None  # its job's limit when jobs of several specs share the workers (a pool)
    source: str | None = None  # the digest of the shipped kernels/ it runs on (None: the cluster's own)
    gpu_types: frozenset[str | None] | None = None  # the GPU types of the workers it may run on (None: any)
    # the GPU type whose free worker the queue gave it to (a pool's claim; None: no type in particular): a
    # worker of that type takes it first, one of another type only when the queue has nothing for its own
    claimed_for: str | None = None


@dataclass
class _Call:
    """One actor call: a batch of consecutive trials, run one after another by the worker."""

    items: list[WorkItem]
    ref: Any


class Listener(Protocol):
    def worker_ready(self, slot: str, info: dict[str, Any]) -> None: ...
    def dispatch_started(self, ready: int, wanted: int, waited_s: float) -> None: ...
    def worker_lost(self, slot: str, reason: str, retired: bool) -> None: ...
    def trial_started(self, item: WorkItem, slot: str) -> None: ...
    def trial_finished(self, item: WorkItem, slot: str, result: WorkerResult) -> None: ...
    def trial_timed_out(self, item: WorkItem, slot: str, seconds: float) -> None: ...
    def trial_crashed(self, item: WorkItem, slot: str, error: str, final: bool) -> None: ...


class NoWorkersLeft(RuntimeError):
    pass


@dataclass(frozen=True)
class SlotState:
    """One worker slot as the dispatcher sees it at one moment."""

    name: str
    ready: bool  # an actor is up and has reported its info
    retired: bool  # its actors kept dying: it takes no more work
    in_flight: int  # trials handed to its actor and not finished
    generation: int  # actors started for this slot so far (1 + replacements)
    node: str | None  # the node its current actor runs on (None until it is ready)
    gpu_id: str | None
    gpu_type: str | None = None  # the accelerator type of the node it is placed on (None: any)
    running: tuple[int, ...] = ()  # the trials in flight on it
    head_started: float = 0.0  # time.monotonic() when the call at its head started


@dataclass(frozen=True)
class DispatchSnapshot:
    """A read-only view of the dispatcher (for progress, metrics and tests): nothing in it changes."""

    queued: int  # trials not yet handed to a worker
    slots: tuple[SlotState, ...]

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.slots)

    @property
    def busy(self) -> int:
        return sum(1 for s in self.slots if s.in_flight)


@dataclass
class _Slot:
    name: str
    generation: int = 0
    actor: Any = None
    ready_ref: Any = None
    start_deadline: float = 0.0
    info: dict[str, Any] | None = None
    inflight: collections.deque = field(default_factory=collections.deque)  # of _Call, in call order
    head_started: float = 0.0
    deaths_in_row: int = 0
    retired: bool = False
    source: str | None = None  # the shipped kernels/ its actor was started with
    gpu_type: str | None = None  # its actor is placed on a node of this accelerator type (None: any)

    @property
    def ready(self) -> bool:
        return self.info is not None and not self.retired


@dataclass
class DispatchOptions:
    workers: int
    gpu: bool  # one GPU per actor (num_gpus=1) or a CPU slot
    timeout_s: float
    max_attempts: int = 3
    max_worker_deaths: int = 3  # consecutive deaths without a finished trial before a slot retires
    pipeline: int = 2  # calls queued on an actor at once, to hide the call latency
    batch_target_s: float = 0.05  # short trials are batched into calls of about this long
    max_batch: int = 64
    start_timeout_s: float = 180.0
    # Trials are handed out once every worker is up, so that the first trials are not timed on one
    # worker while the others still start (and load the machine); after this long, with those ready.
    ready_wait_s: float = 60.0
    lookahead: int = 1024  # trials read ahead of the workers from the (possibly very long) source
    threads_per_worker: int | None = None
    name_prefix: str = "kf"
    namespace: str = "kernelfarm"
    # the packed kernels/ of a digest, as bytes or an object ref (cluster.shipping); needed once a WorkItem
    # names a source
    source_archive: Callable[[str], Any] | None = None
    # workers per GPU type (Ray's accelerator_type:<type> resource; None: any node): the slots, in order,
    # are placed on nodes of their type. None: `workers` slots on any node.
    gpu_types: dict[str | None, int] | None = None


class Dispatcher:
    def __init__(self, options: DispatchOptions, listener: Listener):
        self.opt = options
        self.listener = listener
        kinds = [t for t, n in (options.gpu_types or {None: options.workers}).items() for _ in range(n)]
        self.slots = [_Slot(name=f"w{i}", gpu_type=t) for i, t in enumerate(kinds)]
        self.queue: collections.deque[WorkItem] = collections.deque()
        self._source: Iterator[WorkItem] = iter(())
        self._items: Iterable[WorkItem] = ()
        self._source_left = 0  # trials the source still holds (when its length was given)
        self._dispatching = False
        self._ref_owner: dict[Any, _Slot] = {}
        # running mean of a trial's time on a worker, per (family, backend): what batch sizes are cut from
        self._trial_s: dict[tuple[str, str], float] = {}
        # called once per turn of the loop (at least every TICK_S) by a caller that serves a queue: it may
        # `drop` trials (a cancelled job) or stop the loop with `stop()`
        self.tick: Callable[[Dispatcher], None] | None = None
        self._stop = False

    def snapshot(self) -> DispatchSnapshot:
        """The queue length and each slot's state now; safe to call from another thread (a scrape)."""
        slots = []
        for s in list(self.slots):
            info = s.info or {}
            slots.append(
                SlotState(
                    name=s.name,
                    ready=s.ready,
                    retired=s.retired,
                    in_flight=sum(len(call.items) for call in list(s.inflight)),
                    generation=s.generation,
                    node=info.get("node"),
                    gpu_id=info.get("gpu_id"),
                    gpu_type=s.gpu_type,
                    running=tuple(item.trial_id for call in list(s.inflight) for item in call.items),
                    head_started=s.head_started,
                )
            )
        return DispatchSnapshot(queued=self._queued(), slots=tuple(slots))

    def _queued(self) -> int:
        return len(self.queue) + self._source_left

    def _refill(self) -> None:
        """Read trials from the source until `lookahead` are queued (retries go to the queue's front)."""
        while len(self.queue) < self.opt.lookahead:
            item = next(self._source, None)
            if item is None:
                self._source_left = 0
                return
            self.queue.append(item)
            self._source_left = max(0, self._source_left - 1)

    # ---- actors ---------------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        slot.generation += 1
        slot.info = None
        opts: dict[str, Any] = {
            "name": f"{self.opt.name_prefix}-{slot.name}-{slot.generation}",
            "namespace": self.opt.namespace,
            "num_cpus": 0,
            "num_gpus": 1 if self.opt.gpu else 0,
            "scheduling_strategy": "SPREAD",
        }
        if slot.gpu_type is not None:  # a sliver of the type's resource places it on such a node
            opts["resources"] = {f"accelerator_type:{slot.gpu_type}": 0.001}
        args: tuple[Any, ...] = (slot.name, self.opt.threads_per_worker)
        if slot.source is not None:
            if self.opt.source_archive is None:
                raise ValueError(f"trial source {slot.source[:12]}: the dispatcher has no source_archive")
            args += (slot.source, self.opt.source_archive(slot.source))
        slot.actor = RemoteWorker.options(**opts).remote(*args)
        slot.ready_ref = slot.actor.info.remote()
        self._ref_owner[slot.ready_ref] = slot
        slot.start_deadline = time.monotonic() + self.opt.start_timeout_s

    def _kill(self, slot: _Slot) -> list[WorkItem]:
        """Kill the slot's actor; return every trial that was in flight on it, in call order."""
        if slot.actor is not None:
            ray.kill(slot.actor, no_restart=True)
        for call in slot.inflight:
            self._ref_owner.pop(call.ref, None)
        if slot.ready_ref is not None:
            self._ref_owner.pop(slot.ready_ref, None)
        orphans = [item for call in slot.inflight for item in call.items]
        slot.inflight.clear()
        slot.actor, slot.ready_ref, slot.info = None, None, None
        return orphans

    def _lose(self, slot: _Slot, reason: str, *, count_death: bool) -> None:
        """The slot's actor is gone (or killed): replace it, or retire the slot."""
        if count_death:
            slot.deaths_in_row += 1
        retired = slot.deaths_in_row >= self.opt.max_worker_deaths
        slot.retired = retired
        self.listener.worker_lost(slot.name, reason, retired)
        if not retired:
            self._start(slot)

    def grow(self, workers: int, gpu_type: str | None = None) -> int:
        """Bring the slots of `gpu_type` that are not retired up to `workers` (GPUs that joined the
        cluster): retired slots come back first (their node may be the one that returned), then new ones.
        A warm dispatcher (a pool between jobs, or running) starts their actors now; a cold one leaves them
        to `run`. Returns how many slots were added."""
        warm = any(s.actor is not None for s in self.slots)
        revived = [s for s in self.slots if s.retired and s.gpu_type == gpu_type]
        added = 0
        while sum(not s.retired for s in self.slots if s.gpu_type == gpu_type) < workers:
            if revived:
                slot = revived.pop(0)
                slot.retired, slot.deaths_in_row = False, 0
            else:
                slot = _Slot(name=f"w{len(self.slots)}", gpu_type=gpu_type)
                self.slots = [*self.slots, slot]  # a new list: a snapshot may be iterating the old one
            if warm:
                self._start(slot)
            added += 1
        return added

    def shutdown(self) -> None:
        for slot in self.slots:
            self._kill(slot)

    def stop(self) -> None:
        """Make `run` return at its next turn (its trials in flight stay with their workers)."""
        self._stop = True

    def drop(
        self, match: Callable[[WorkItem], bool], reason: str = "killed: its trial's job was cancelled"
    ) -> list[WorkItem]:
        """Take the trials `match` selects out of the dispatcher: queued ones leave the queue, and a worker
        running one is killed (and replaced), its other trials going back to the queue. Returns the trials
        dropped; none of them is reported to the listener (they were not run)."""
        dropped = [item for item in self.queue if match(item)]
        self.queue = collections.deque(item for item in self.queue if not match(item))
        for slot in self.slots:
            if not any(match(item) for call in slot.inflight for item in call.items):
                continue
            orphans = self._kill(slot)
            dropped += [item for item in orphans if match(item)]
            self.queue.extendleft(reversed([item for item in orphans if not match(item)]))
            self._lose(slot, reason, count_death=False)
        return dropped

    def _timeout(self, slot: _Slot) -> float:
        """The time limit of the call at the head of the slot: its trials' own, else the dispatcher's."""
        own = [i.timeout_s for i in slot.inflight[0].items if i.timeout_s is not None]
        return min(own) if own else self.opt.timeout_s

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, items: Iterable[WorkItem], total: int | None = None, *, keep_workers: bool = False) -> None:
        """Run every item. `items` is read lazily, `lookahead` at a time; `total` (its length, when
        known) only feeds the queued count of snapshots. `keep_workers`: the workers stay up when it
        returns, and a later `run` uses them (a pool serving a queue); `items` may then be an iterator
        that has nothing now and more later (it is asked again at every turn)."""
        self._items = items
        self._source = iter(items)
        self._source_left = total or 0
        self._stop = False
        self._refill()
        if not self.queue:
            return
        started = time.monotonic()
        if not keep_workers or not any(s.actor is not None for s in self.slots):
            self._dispatching = False
            for slot in self.slots:
                if not slot.retired:
                    self._start(slot)
        try:
            while (self.queue or any(s.inflight for s in self.slots)) and not self._stop:
                if all(s.retired for s in self.slots):
                    raise NoWorkersLeft(
                        f"every worker slot was retired after {self.opt.max_worker_deaths} deaths in a row; "
                        f"{self._queued()} trials not run"
                    )
                if not self._dispatching:
                    self._open_when_ready(started)
                if self._dispatching:
                    self._fill()
                self._wait_and_handle()
                self._enforce_deadlines()
                if self.tick is not None:
                    self.tick(self)
                self._refill()
        finally:
            if not keep_workers:
                self.shutdown()

    def _open_when_ready(self, started: float) -> None:
        """Start handing out trials when every live slot is ready, or `ready_wait_s` after the start
        with those that are (the listener is told how many are missing)."""
        live = [s for s in self.slots if not s.retired]
        ready = sum(s.ready for s in live)
        waited = time.monotonic() - started
        if ready and (ready == len(live) or waited >= self.opt.ready_wait_s):
            self._dispatching = True
            self.listener.dispatch_started(ready, len(self.slots), waited)

    def _fill(self) -> None:
        ready = [s for s in self.slots if s.ready]
        # Queue a second call per actor only while there is plenty left, so the tail stays balanced.
        depth = self.opt.pipeline if self._queued() >= 2 * max(1, len(ready)) else 1
        for slot in ready:
            while len(slot.inflight) < depth:
                if not any(_meant_for(item, slot) for item in self.queue):
                    self._refill_for(slot)  # a source that is asked per trial (a pool's queue) is asked now
                if not any(_fits(item, slot) for item in self.queue):
                    break
                if not any(item.source == slot.source and _fits(item, slot) for item in self.queue):
                    if not slot.inflight:
                        self._switch_source(slot)
                    break  # a busy slot keeps its source: the trial waits for a slot of its own source
                items = self._take_batch(slot, len(ready))
                ref = slot.actor.run_batch.remote(pickle.dumps([i.request for i in items]))
                self._ref_owner[ref] = slot
                if not slot.inflight:
                    slot.head_started = time.monotonic()
                slot.inflight.append(_Call(items, ref))
                for item in items:
                    self.listener.trial_started(item, slot.name)

    def _refill_for(self, slot: _Slot) -> None:
        """Ask the source for a trial this slot can run: a source with `take(gpu_type)` (a pool's queue)
        is asked for the slot's GPU type; any other is read ahead as `_refill` does."""
        take = getattr(self._items, "take", None)
        if take is None:
            self._refill()
            return
        item = take(slot.gpu_type)
        if item is not None:
            self.queue.append(item)

    def _switch_source(self, slot: _Slot) -> None:
        """Restart the idle `slot` with the kernel source of the first queued trial that no other slot
        will take soon (one of that source that is idle or starting)."""
        soon = {
            s.source
            for s in self.slots
            if s is not slot and s.actor is not None and not s.retired and not (s.ready and s.inflight)
        }
        for item in self.queue:
            if item.source not in soon and _fits(item, slot):
                break
        else:
            return
        self._kill(slot)
        slot.source = item.source
        what = f"kernel source {item.source[:12]}" if item.source else "the cluster's kernel source"
        self.listener.worker_lost(slot.name, f"restarted for {what}", False)
        self._start(slot)

    def _batch_size(self, kind: tuple[str, str], ready: int) -> int:
        """Trials per call: 1 until trials of this family and backend are known to be short, then enough
        to fill ~batch_target_s, and never so many that the batch comes near the per-trial timeout."""
        trial_s = self._trial_s.get(kind)
        if trial_s is None:
            return 1
        active = sum(not s.retired for s in self.slots)  # starting workers will want their share too
        fair = math.ceil(self._queued() / (2 * max(1, active, ready)))
        fill = int(min(self.opt.batch_target_s, self.opt.timeout_s / 4) / max(trial_s, 1e-6))
        return max(1, min(fill, self.opt.max_batch, fair))

    def _take_batch(self, slot: _Slot, ready: int) -> list[WorkItem]:
        """The next trial for this slot, plus the trials right behind it of the same family and backend."""
        first = self._take_for(slot)
        kind = _kind(first)
        size = 1 if first.solo else self._batch_size(kind, ready)
        batch = [first]
        while (
            size > len(batch)
            and self.queue
            and not self.queue[0].solo
            and slot.name not in self.queue[0].avoid
            and self.queue[0].source == first.source
            and _meant_for(self.queue[0], slot)
            and _kind(self.queue[0]) == kind
        ):
            batch.append(self.queue.popleft())
        return batch

    def _take_for(self, slot: _Slot) -> WorkItem:
        """The first queued trial of the slot's source that the queue gave to a worker of the slot's GPU
        type (_meant_for) and the slot has not died on; else the first such of another type; else the
        first of its source."""
        first = other = None
        for i, item in enumerate(self.queue):
            if item.source != slot.source or not _fits(item, slot):
                continue
            if slot.name not in item.avoid:
                if _meant_for(item, slot):
                    del self.queue[i]
                    return item
                other = i if other is None else other
            first = i if first is None else first
        assert first is not None, "a slot takes trials of its own source only"
        at = other if other is not None else first
        item = self.queue[at]
        del self.queue[at]
        return item

    def _next_deadline(self) -> float:
        now = time.monotonic()
        deadlines = [s.head_started + self._timeout(s) for s in self.slots if s.inflight]
        deadlines += [s.start_deadline for s in self.slots if s.ready_ref is not None and s.info is None]
        if not self._dispatching:
            deadlines.append(now + 0.2)  # look again at the ready gate soon
        return max(0.0, min(deadlines, default=now + 1.0) - now)

    def _wait_and_handle(self) -> None:
        refs = list(self._ref_owner)
        if not refs:
            return
        timeout = min(self._next_deadline(), 1.0 if self.tick is None else TICK_S)
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if done:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            slot = self._ref_owner.pop(ref, None)
            if slot is None:  # its slot was killed while we waited
                continue
            if ref == slot.ready_ref:
                self._handle_ready(slot, ref)
            else:
                self._handle_result(slot, ref)

    def _handle_ready(self, slot: _Slot, ref: Any) -> None:
        slot.ready_ref = None
        try:
            slot.info = ray.get(ref)
        except ray.exceptions.RayError as err:
            self._kill(slot)
            self._lose(slot, f"actor failed to start: {first_line(err)}", count_death=True)
            return
        slot.info["gpu_type"] = slot.gpu_type  # where its trials ran, as the node declares it
        self.listener.worker_ready(slot.name, slot.info)

    def _handle_result(self, slot: _Slot, ref: Any) -> None:
        call = slot.inflight[0]
        if ref != call.ref:  # results of one actor arrive in order; an out-of-order one means death
            self._ref_owner[ref] = slot
            return
        try:
            results = pickle.loads(ray.get(ref))
        except _ACTOR_GONE as err:
            self._actor_died(slot, call, first_line(err))
            return
        except ray.exceptions.RayTaskError as err:  # the framework failed, not the kernel
            failed = WorkerResult(TrialOutcome(status=TrialStatus.ERROR, error=str(err)))
            results = [failed] * len(call.items)
        except ray.exceptions.RayError as err:  # object lost, system error: treat the worker as gone
            self._actor_died(slot, call, first_line(err))
            return
        slot.inflight.popleft()
        slot.head_started = time.monotonic()
        slot.deaths_in_row = 0
        for item, result in zip(call.items, results, strict=True):
            if result.started and result.finished:
                took = result.finished - result.started
                old = self._trial_s.get(_kind(item))
                self._trial_s[_kind(item)] = took if old is None else 0.8 * old + 0.2 * took
            self.listener.trial_finished(item, slot.name, result)

    def _requeue_solo(self, items: list[WorkItem]) -> None:
        """Trials of a failed batch: nobody knows which one failed, so each runs alone next time."""
        for item in items:
            item.solo = True
        self.queue.extendleft(reversed(items))

    def _actor_died(self, slot: _Slot, call: _Call, error: str) -> None:
        slot.inflight.popleft()
        orphans = self._kill(slot)
        if len(call.items) > 1:
            # Each was in flight on a worker that died: count the attempt, but never give up on a trial
            # before it has run alone, where a crash can be pinned on it.
            for item in call.items:
                item.attempts += 1
                item.avoid.add(slot.name)
                self.listener.trial_crashed(
                    item, slot.name, f"{error} (in a batch of {len(call.items)})", False
                )
            self._requeue_solo(call.items)
        else:
            item = call.items[0]
            item.attempts += 1
            item.avoid.add(slot.name)
            final = item.attempts >= self.opt.max_attempts
            self.listener.trial_crashed(item, slot.name, error, final)
            if not final:
                self.queue.appendleft(item)
        self.queue.extendleft(reversed(orphans))
        # A trial that already killed a worker is the likely culprit, not this slot: only deaths under
        # trials on their first attempt count towards retiring the slot.
        self._lose(slot, f"actor died: {error}", count_death=all(i.attempts == 1 for i in call.items))

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.inflight and now - slot.head_started > (limit := self._timeout(slot)):
                call = slot.inflight[0]
                seconds = now - slot.head_started
                orphans = self._kill(slot)[len(call.items) :]
                if len(call.items) > 1:
                    # these trials are slower than their kind's mean said: stop batching them
                    self._trial_s[_kind(call.items[0])] = limit
                    self._requeue_solo(call.items)
                    reason = f"killed: a batch of {len(call.items)} trials ran past {limit:g} s"
                else:
                    self.listener.trial_timed_out(call.items[0], slot.name, seconds)
                    reason = f"killed: trial {call.items[0].label} ran past {limit:g} s"
                self.queue.extendleft(reversed(orphans))
                self._lose(slot, reason, count_death=False)
            elif slot.ready_ref is not None and slot.info is None and now > slot.start_deadline:
                self._kill(slot)
                slot.retired = True
                self.listener.worker_lost(
                    slot.name,
                    f"no actor could start in {self.opt.start_timeout_s:g} s (no free GPU or node?)",
                    True,
                )


def _fits(item: WorkItem, slot: _Slot) -> bool:
    """Whether the slot's GPU type is one the trial may run on."""
    return item.gpu_types is None or slot.gpu_type in item.gpu_types


def _meant_for(item: WorkItem, slot: _Slot) -> bool:
    """Whether the slot may run the trial and the queue gave it to no other GPU type's worker: a trial a
    pool claimed for a free H100 waits for an H100 while the queue has trials of its own for a free H200
    (its best fit: jobs.queue.fairshare); an H200 runs it only when the queue has none."""
    return _fits(item, slot) and item.claimed_for in (None, slot.gpu_type)


def _kind(item: WorkItem) -> tuple[str, str]:
    return item.request.family, item.request.backend


__all__ = [
    "DispatchOptions",
    "DispatchSnapshot",
    "Dispatcher",
    "Listener",
    "NoWorkersLeft",
    "SlotState",
    "WorkItem",
    "WorkerResult",
]
