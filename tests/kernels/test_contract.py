"""Every registered kernel family against the farm's contract (kernels/base.py).

One tiny CPU trial per family and available backend (Triton in the interpreter: tests/conftest.py sets
TRITON_INTERPRET), checked for what the farm relies on: a TrialStatus, a typed Summary, correctness
numbers, a Cost consistent with the shape. A family added to kernels/registry.py is picked up here; add
its tiny trial to TINY below. Each failure message says what the family is missing.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kernels.base import Backends, Cost, KernelFamily, Summary, TrialOutcome, TrialRequest, TrialStatus
from kernels.measure.policy import MeasurePolicy
from kernels.registry import FAMILIES, get_family

POLICY = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=3, max_time_s=2, seeds=1)

_PAGED = {"batch": 1, "seqlen": 16, "dist": "fixed", "h_q": 1, "s_q": 1, "page_size": 64, "kv_dtype": "bf16"}
_ATTN = {"mode": "prefill", "batch": 1, "s_q": 16, "s_k": 16, "h_q": 1, "d": 16}

# family -> (tiny shape, dtype, config per backend, the shape key that doubles the FLOPs)
TINY: dict[str, tuple[dict[str, Any], str, dict[str, dict[str, Any]], str | None]] = {
    "gemm": ({"m": 8, "n": 8, "k": 8}, "float32", {}, "m"),
    "probe": ({"n": 0}, "float32", {"spin": {"ms": 0.1}, "wait": {"ms": 0.1}, "sleep": {"s": 0.0}}, None),
    "fp8_gemm": (
        {"m": 16, "n": 32, "k": 128},
        "float8_e4m3fn",
        {"triton": {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 1}},
        "m",
    ),
    "paged_mla": (_PAGED, "bfloat16", {"cache_trace": {"conversations": 2, "turns": 2}}, "h_q"),
    "attention": (_ATTN, "float32", {"triton": {"block_m": 16, "block_n": 16}}, "h_q"),
    "adversarial": ({"m": 8, "n": 8, "k": 8}, "float32", {}, "m"),  # the tests' own (testkit), honest here
}
# Backends that end their own process or need hardware no test machine has are not run here.
# The adversarial family's cheating backends end `invalid` by design (tests/kernels/test_validity.py).
NOT_RUN = {("probe", "crash")} | {
    ("adversarial", b) for b in ("cached", "replay", "threaded", "lazy", "side_stream", "persisting_l2")
}


def _trials() -> list[Any]:
    out = []
    for name in sorted(FAMILIES):
        family = get_family(name)
        for backend in family.backends:
            out.append(pytest.param(name, backend, id=f"{name}-{backend}"))
    return out


def test_every_registered_family_has_a_tiny_trial_here():
    missing = sorted(set(FAMILIES) - set(TINY))
    assert not missing, (
        f"families {missing} have no tiny trial in tests/kernels/test_contract.py: add one to TINY "
        "(a shape small enough for the Triton interpreter, the dtype, configs per backend)"
    )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_declares_its_surface(name):
    family = get_family(name)
    assert isinstance(family, KernelFamily), f"{name}: FAMILY must be a kernels.base.KernelFamily"
    assert isinstance(family.backends, Backends) and len(family.backends), (
        f"{name}: declare the backends in a kernels.base.Backends table (Backends.add or @register)"
    )
    refs = [b for b in family.backends.values() if b.reference]
    assert len(refs) == 1, f"{name}: mark exactly one backend reference=True (got {[b.name for b in refs]})"
    for backend in family.backends.values():
        assert backend.description, f"{name}.{backend.name}: give the backend a one-line description"
        reason = backend.unavailable_reason()
        assert reason is None or (isinstance(reason, str) and reason), (
            f"{name}.{backend.name}: requires() must return None or a non-empty reason"
        )
    assert family.shape_keys, f"{name}: list the shape keys every shape must have (shape_keys)"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_cost_is_a_cost_consistent_with_the_shape(name):
    family = get_family(name)
    shape, dtype, _, scale_key = TINY[name]
    cost = family.cost(shape, dtype)
    assert isinstance(cost, Cost), f"{name}: cost() must return a kernels.base.Cost (got {type(cost)})"
    for field in ("flops", "bytes_read", "bytes_written"):
        v = getattr(cost, field)
        assert isinstance(v, int | float) and math.isfinite(v) and v >= 0, f"{name}: Cost.{field} = {v!r}"
    if scale_key is None:
        return
    assert cost.flops > 0 and cost.bytes > 0, f"{name}: a real kernel moves bytes and does FLOPs"
    doubled = family.cost({**shape, scale_key: shape[scale_key] * 2}, dtype)
    assert doubled.flops == pytest.approx(2 * cost.flops), (
        f"{name}: FLOPs should double when shape.{scale_key} doubles ({cost.flops} -> {doubled.flops})"
    )
    assert cost.bytes < doubled.bytes <= 2 * cost.bytes, (
        f"{name}: bytes should grow, at most double, when shape.{scale_key} doubles"
    )


@pytest.mark.parametrize("name, backend", _trials())
def test_a_tiny_trial_keeps_the_contract(name, backend):
    family = get_family(name)
    shape, dtype, configs, _ = TINY[name]
    config = configs.get(backend, {})
    family.validate(shape, config, dtype, backend)  # the tiny trial is a valid one
    if (name, backend) in NOT_RUN:
        pytest.skip(f"{name}.{backend} ends its own worker process (tested in tests/cluster)")
    reason = family.backends[backend].unavailable_reason()
    out = family.run(TrialRequest(name, backend, shape, config, dtype, policy=POLICY))
    assert isinstance(out, TrialOutcome), f"{name}.{backend}: run() must return a TrialOutcome"
    assert isinstance(out.status, TrialStatus), f"{name}.{backend}: status must be a TrialStatus"
    if reason is not None:
        assert out.status is TrialStatus.SKIPPED and out.error == reason, (
            f"{name}.{backend}: an unavailable backend is skipped with its reason"
        )
        return
    assert out.status is TrialStatus.OK, f"{name}.{backend}: {out.status}: {out.error or out.correctness}"
    assert isinstance(out.correctness.get("passed"), bool), (
        f"{name}.{backend}: correctness must carry passed: bool (and the numbers it was judged on)"
    )
    if out.summary is None:  # a trial that times nothing (paged_mla cache_trace) says so with metrics
        assert not out.samples_ns and out.metrics, f"{name}.{backend}: no summary, so no samples either"
        return
    assert isinstance(out.summary, Summary), f"{name}.{backend}: build outcomes with TrialOutcome.measured"
    assert out.summary.n == len(out.samples_ns) - len(out.summary.discarded) >= 1
    assert out.summary.median is not None and out.summary.median > 0
    assert out.stop_reason and out.timer, f"{name}.{backend}: the measurement's stop reason and timer"
    stored = out.stored_fields()
    assert stored["summary"]["median"] == out.summary.median and stored["status"] == "ok"
    if TINY[name][3] is not None:  # a kernel: the farm's rates come from its Cost and the median
        cost = family.cost(shape, dtype)
        for key in ("tflops", "gbps"):
            assert key in out.metrics, f"{name}.{backend}: metrics.{key} (from kernels.base.derive_rates)"
        assert out.metrics["flops"] == pytest.approx(cost.flops), f"{name}.{backend}: flops is not cost()'s"


# Trials that time no kernel: the probe measures the farm itself (no inputs, no reference), the cache
# trace replays a KV-cache workload (no timed call). Every other trial goes through kernels.harness.
NOT_HARNESSED = {("probe", b) for b in ("noop", "spin", "wait", "sleep", "crash")} | {
    ("paged_mla", "cache_trace")
}


def _kernel_trials() -> list[Any]:
    return [p for p in _trials() if tuple(p.values) not in NOT_HARNESSED | NOT_RUN]


@pytest.mark.parametrize("name, backend", _kernel_trials())
def test_every_kernel_trial_is_checked_timed_and_rated_by_the_one_harness(name, backend, monkeypatch):
    """Issue 30: each family rebuilt seed -> inputs -> check -> measure -> rates for itself. Now one
    harness (kernels.harness.run_trial) owns that order: every kernel trial checks each seed's output
    before the one measurement of the last seed's call, and its rates carry the harness's names."""
    import kernels.harness as harness

    family = get_family(name)
    if family.backends[backend].unavailable_reason() is not None:
        pytest.skip(f"{name}.{backend} is unavailable here")
    shape, dtype, configs, _ = TINY[name]
    events: list[str] = []
    real_measure, real_combine = harness.measure, harness.combined_correctness

    def measure(call, policy, *, device):
        events.append("measure")
        return real_measure(call, policy, device=device)

    def combined_correctness(checks, seeds):
        events.append(f"checked {len(checks)} seeds")
        return real_combine(checks, seeds)

    monkeypatch.setattr(harness, "measure", measure)
    monkeypatch.setattr(harness, "combined_correctness", combined_correctness)
    policy = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=3, max_time_s=2, seeds=2)
    out = family.run(TrialRequest(name, backend, shape, configs.get(backend, {}), dtype, policy=policy))
    assert out.status is TrialStatus.OK, out.error or out.correctness
    assert events == ["checked 2 seeds", "measure"], (
        f"{name}.{backend}: {events} (not through kernels.harness)"
    )
    for key in ("flops", "bytes", "time_ns", "tflops", "gbps", "spread_cv"):
        assert key in out.metrics, f"{name}.{backend}: metrics.{key} (kernels.harness.rate_metrics)"
