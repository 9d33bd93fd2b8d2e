"""How one public model's deployments share its requests (``models.<m>.strategy``), and the active health
checks' measurements (gateway.upstream.health). gateway.upstream.routing calls these with the deployments that
may be picked now (not excluded, not cooling down, not at their rpm/tpm).

- ``weighted`` (the default): the fewest requests in flight relative to the weight, ties by smooth weighted
  round-robin (sequential requests split exactly by weight);
- ``least-busy``: the fewest requests in flight, ties by smooth weighted round-robin;
- ``latency``: the lowest recent time to first byte (``Deployment.ttfb``: the median of its latest
  ``routing.latency_window`` attempts, so one slow answer on a loaded host does not move the traffic),
  measured from an attempt's send to the upstream's answer head; a deployment not measured yet is tried
  first, and ``routing.latency_explore`` of the requests (epsilon) go to another deployment picked at
  random, so a deployment that became fast again is seen.

Each pick says why (``WHY_*``), which the answer carries in ``x-farm-route`` beside ``x-farm-deployment``
when the model has more than one deployment.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from typing import Literal, Protocol, TypeVar


class Choosable(Protocol):
    """What a strategy reads and keeps of a deployment (gateway.upstream.routing.Deployment)."""

    weight: float
    in_flight: int
    current: float  # smooth weighted round-robin
    ttfb: float | None  # recent time to first byte: the median of ``samples``
    samples: deque[float]  # the latest times to first byte (routing.latency_window of them)


Deployment = TypeVar("Deployment", bound=Choosable)

Strategy = Literal["weighted", "latency", "least-busy"]

WHY_SINGLE = "single"  # the model has one deployment
WHY_PROBE = "probe after cooldown"
WHY_WEIGHTED = "weighted"
WHY_LEAST_BUSY = "least-busy"
WHY_FASTEST = "latency: fastest"
WHY_UNMEASURED = "latency: not measured yet"
WHY_EXPLORE = "latency: exploring"
WHY_FORCED = "forced: every deployment cools down or is at its limits"


def round_robin(best: Sequence[Deployment]) -> Deployment:
    """Smooth weighted round-robin among deployments tied on the strategy's measure."""
    if len(best) == 1:
        return best[0]
    total = 0.0
    chosen = best[0]
    for d in best:
        d.current += d.weight
        total += d.weight
        if d.current > chosen.current:
            chosen = d
    chosen.current -= total
    return chosen


def fewest(usable: Sequence[Deployment], by_weight: bool) -> Deployment:
    """The fewest requests in flight (relative to the weight when ``by_weight``), ties by round-robin."""
    best: list[Deployment] = []
    best_load = 0.0
    for d in usable:
        load = d.in_flight / d.weight if by_weight else d.in_flight
        if not best or load < best_load:
            best, best_load = [d], load
        elif load == best_load:
            best.append(d)
    return round_robin(best)


def fastest(usable: Sequence[Deployment], explore: float, rng: random.Random) -> tuple[Deployment, str]:
    """The ``latency`` strategy's pick and why: an unmeasured deployment first, else with probability
    ``explore`` another one at random, else the lowest ``ttfb`` (ties by round-robin)."""
    unmeasured = [d for d in usable if d.ttfb is None]
    if unmeasured:
        return round_robin(unmeasured), WHY_UNMEASURED
    low = min(d.ttfb for d in usable)  # type: ignore[type-var]
    best = [d for d in usable if d.ttfb == low]
    if explore and len(best) < len(usable) and rng.random() < explore:
        others = [d for d in usable if d.ttfb != low]
        return others[rng.randrange(len(others))], WHY_EXPLORE
    return round_robin(best), WHY_FASTEST


def observe(d: Choosable, seconds: float) -> None:
    """One attempt's time to first byte into ``d``'s estimate: the median of its latest ones."""
    samples = d.samples
    samples.append(seconds)
    v = sorted(samples)
    n = len(v)
    d.ttfb = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
