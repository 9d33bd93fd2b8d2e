"""Seen: with a provider pool smaller than the projects' total concurrency, one project with 40 requests in
flight made another project's single request wait 16 s, recorded as upstream time."""

from __future__ import annotations

import asyncio
import logging

MSGS = [{"role": "user", "content": "hi"}]


async def test_a_flooding_project_does_not_starve_another_and_the_wait_is_queue_time(
    start_gateway, fake, oai, caplog
):
    caplog.set_level(logging.WARNING, logger="gateway")
    gw = await start_gateway(
        providers={"oa": {"max_connections": 2}},
        projects={"alpha": {"max_concurrency": 40}, "beta": {"max_concurrency": 4}},
    )
    assert any("max_connections 2" in r.getMessage() for r in caplog.records)  # said at start
    fake.latency_s = 0.25
    alpha, beta = oai(gw, "alpha"), oai(gw, "beta")
    flood = [
        asyncio.create_task(alpha.chat.completions.create(model="gpt-fake", messages=MSGS)) for _ in range(20)
    ]
    while fake.in_flight < 2:  # the flood holds both connections and 18 requests wait
        await asyncio.sleep(0.005)
    t0 = asyncio.get_running_loop().time()
    await beta.chat.completions.create(model="gpt-beta", messages=MSGS)
    beta_s = asyncio.get_running_loop().time() - t0
    done_before_beta = sum(t.done() for t in flood)
    await asyncio.gather(*flood)
    fake.latency_s = 0.0
    # FIFO would put beta behind all 20 (10 rounds of 0.25 s); a fair share serves it within about a round
    assert done_before_beta <= 4, done_before_beta
    assert beta_s < 1.0, beta_s
    assert fake.max_in_flight <= 2
    rows = {r["project"]: r for r in await gw.rows() if r["project"] == "beta"}
    row = rows["beta"]
    assert row["queue_wait_ms"] > 50  # the wait for a connection is queue wait ...
    # ... not upstream time: beyond the fake's 250 ms, less than what it waited (the defect had it all there)
    assert row["upstream_ms"] - 250 < row["queue_wait_ms"], row
