"""The confirmation verdict (jobs.judge.confirm._judge) on controlled samples: a slowdown is confirmed only
when the pooled comparison says slower and two thirds of the rounds agree."""

from __future__ import annotations

import numpy as np

from jobs.judge.checks import FAIL, PASS, Context
from jobs.judge.confirm import _judge
from jobs.spec.cards import load_card
from jobs.store import TrialRow


def _trial(tid: int, config: dict) -> TrialRow:
    return TrialRow(id=tid, family="gemm", backend="torch_fp32", shape={"m": 8}, config=config,
                    dtype="float32", status="ok")  # fmt: skip


def _judged(a_rounds: list[float], b_rounds: list[float]):
    """Rounds of A and B samples around the given medians (ns), 30 samples each with 2% spread."""
    rng = np.random.default_rng(0)
    samples: dict[int, list[int]] = {}
    a, b = [], []
    for r, (ma, mb) in enumerate(zip(a_rounds, b_rounds, strict=True)):
        a.append(_trial(100 + r, {}))
        b.append(_trial(200 + r, {"_repeat": 4}))
        samples[100 + r] = [int(v) for v in ma * (1 + 0.02 * rng.standard_normal(30))]
        samples[200 + r] = [int(v) for v in mb * (1 + 0.02 * rng.standard_normal(30))]
    ctx = Context(load_card("gemm"), _trial(2, {"_repeat": 4}), None, _trial(1, {}), samples.__getitem__)
    return _judge(None, ctx, a, b, confirm_id=9)  # type: ignore[arg-type]


def test_a_slowdown_in_every_round_is_confirmed():
    out = _judged([1e5, 1e5, 1e5], [4e5, 4.1e5, 3.9e5])
    assert out.outcome == FAIL and out.numbers["rounds_slower"] == 3, out


def test_no_slowdown_in_any_round_is_dismissed():
    out = _judged([1e5, 1e5, 1e5], [1e5, 1.01e5, 0.99e5])
    assert out.outcome == PASS and out.numbers["rounds_slower"] == 0, out


def test_a_slowdown_in_only_one_round_is_not_confirmed():
    out = _judged([1e5, 1e5, 1e5], [1e7, 1e5, 1e5])
    assert out.outcome != FAIL and out.numbers["rounds_slower"] == 1, out
