"""The harness's recheck of a call's output after timing (kernels.harness.stale_output, issue 45), watched
in a product family's trials: `watch(monkeypatch, module)` puts a wrapper around the `run_trial` that
`module` calls (the family's case module, or kernels.harness where the family calls harness.run_trial),
so that every seed's Prepared is seen as the family built it, and returns a `Watch` of what happened.

  Watch.checked    the seeds whose check ran, in order: [0, 1, 2] for a two-seed trial whose recheck ran
                   (seed 2 is the fresh seed the harness builds after timing; a recheck skipped because
                   the declared inputs were missing or differed in shape never runs seed 2's check)
  Watch.inputs     each seed's declared inputs as (shape, dtype) pairs
  cached=True      each Prepared's call returns its first output forever: the first call of every seed
                   (the one checked before timing) is right, every later one is stale

Nothing in the product changes: the family's Prepared is copied with its call and check wrapped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import Any


@dataclasses.dataclass
class Watch:
    checked: list[int] = dataclasses.field(default_factory=list)
    inputs: dict[int, list[tuple[tuple[int, ...], Any]]] = dataclasses.field(default_factory=dict)

    def rechecked(self, seeds: int) -> bool:
        """Whether the trial checked its `seeds` seeds and then, after timing, the fresh seed's."""
        return self.checked == list(range(seeds + 1))


def first_forever(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call`, run once: every later call returns that first output."""
    first: list[Any] = []

    def cached() -> Any:
        if not first:
            first.append(call())
        return first[0]

    return cached


def watch(monkeypatch: Any, module: ModuleType, *, cached: bool = False) -> Watch:
    """Wrap `module.run_trial` (pytest's `monkeypatch` puts it back) so that the trials it runs are
    watched (`Watch`) and, with `cached`, their calls return their first output forever."""
    real = module.run_trial
    seen = Watch()

    def run_trial(req: Any, prepare: Callable[..., Any], **kwargs: Any) -> Any:
        def watched(seed: int, device: Any) -> Any:
            prep = prepare(seed, device)
            seen.inputs[seed] = [(tuple(t.shape), t.dtype) for t in prep.inputs]

            def check(out: Any) -> Any:
                seen.checked.append(seed)
                return prep.check(out)

            call = first_forever(prep.call) if cached else prep.call
            return dataclasses.replace(prep, call=call, check=check)

        return real(req, watched, **kwargs)

    monkeypatch.setattr(module, "run_trial", run_trial)
    return seen
