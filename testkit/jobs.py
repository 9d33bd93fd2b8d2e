"""Jobs for the tests of jobs/: a sweep spec's job in a store, as `farm sweep run` creates it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.spec.sweep import loads_spec

if TYPE_CHECKING:
    from jobs.store import Store


def spec_job(store: Store, text: str, *, git_commit: str | None = "abc") -> int:
    """The job of the sweep spec `text` (its whole grid, every trial pending) in `store`; its id."""
    spec = loads_spec(text)
    return store.create_job(
        name=spec.name, family=spec.family, spec_yaml=text, spec_hash=spec.spec_hash(),
        trials=spec.trials(), git_commit=git_commit,
    )  # fmt: skip
