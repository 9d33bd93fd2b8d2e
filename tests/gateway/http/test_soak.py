"""A short soak (benchmarks/soak.py): 600 requests at concurrency 16 through a gateway subprocess against the
fake upstream in its random fault mode (429, 503, stalls past the read timeout, connections closed mid-body,
a few requests the upstream answers 400), with a SIGKILL of the gateway half-way and a restart on the same
database. Well under a minute on a 2-core machine."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from benchmarks.soak import SoakConfig, gateway_caused, report, run_soak
from testkit.gateway.fake_upstream import BAD_REQUEST_MARKER, FakeUpstream


@pytest.mark.slow
def test_short_soak_with_sigkill_keeps_every_promise(tmp_path):
    cfg = SoakConfig(requests=600, concurrency=16, bad_rate=0.01, workdir=tmp_path, verbose=False)
    f = asyncio.run(run_soak(cfg))
    print(report(f))  # shown when the test fails
    assert f["received"] == cfg.requests and f["given_up"] == 0
    assert f["without_request_id"] == 0
    assert f["missing_rows"] == 0, "responses clients received whose ledger row is missing"
    assert f["gateway_caused_5xx"] == 0
    assert f["upstream_400"] > 0 and f["retried_400"] == 0
    assert not f["over_cap"], f"upstream concurrency over its cap: {f['over_cap']} ({f['concurrency_caps']})"
    assert f["passed"]


async def test_fake_fault_mode_counts_repeated_400s_and_concurrency_per_path():
    """The soak's detectors detect: a body answered 400 and sent again is counted, and so is concurrency."""
    fake = FakeUpstream(record=False, fault_rates={}, latency_s=0.05)
    await fake.start()
    try:
        bad = {"model": "m", "messages": [{"role": "user", "content": f"x {BAD_REQUEST_MARKER}"}]}
        good = {"model": "m", "messages": [{"role": "user", "content": "fine"}]}
        async with aiohttp.ClientSession() as s:

            async def post(body: dict) -> int:
                async with s.post(f"{fake.base_url}/chat/completions", json=body) as r:
                    await r.read()
                    return r.status

            assert await post(bad) == 400
            assert await post(bad) == 400  # a retry of a 400
            assert await asyncio.gather(*(post(good) for _ in range(3))) == [200, 200, 200]
        st = fake.stats()
        assert st["answered_400"] == 2 and st["retried_400"] == 1
        assert st["max_in_flight_by_path"]["/v1/chat/completions"] == 3
    finally:
        await fake.close()


def test_gateway_caused_5xx_is_told_from_an_upstream_one():
    assert gateway_caused(500, b'{"error": {"message": "internal gateway error"}}', False)
    assert not gateway_caused(503, b'{"error": {"message": "fake upstream error 503"}}', False)
    assert not gateway_caused(504, b'{"error": {"message": "upstream \'p\' sent no response"}}', False)
    assert gateway_caused(
        200, b'data: {"a": 1}\n\ndata: {"error": {"message": "internal gateway error"}}\n\n', True
    )
    assert not gateway_caused(
        200, b'event: error\ndata: {"type": "error", "error": {"message": "upstream broke off"}}\n\n', True
    )
