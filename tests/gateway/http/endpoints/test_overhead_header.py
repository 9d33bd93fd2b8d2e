"""The gateway's own time on each answer (issue 48): ``x-farm-overhead-ms``, read by the openai and anthropic
SDKs, is the figure the ``gateway_overhead_seconds`` histogram observes for that request (one computation,
gateway.core.record.own_time).

- A whole answer: its time in the gateway up to the answer, less the upstream's time and the queue wait:
  the ledger row's latency - upstream - queue wait.
- A stream: its head goes out before the body, so the header says the gateway's time until its head, less
  the upstream's time until the bytes that go out with it (and the queue wait). The upstream here answers
  after ``LATENCY_S``: the figure leaves it out, so it is at most the time to first byte less that.
"""

from __future__ import annotations

import openai
import pytest

from gateway.core.record import OVERHEAD_HEADER

MSGS = [{"role": "user", "content": "hi"}]
LATENCY_S = 0.2
ROUNDING_MS = 0.0005 + 1e-9  # the header's microsecond


def _observed_ms(gateway, model: str) -> float:
    """The histogram's sum for the gateway's only request (milliseconds)."""
    labels = {"project": "alpha", "model": model}
    total = gateway.gw.metrics.registry.get_sample_value("gateway_overhead_seconds_sum", labels)
    count = gateway.gw.metrics.registry.get_sample_value("gateway_overhead_seconds_count", labels)
    assert count == 1
    return total * 1000


async def _whole(sdk: str, client, model: str):
    if sdk == "openai":
        raw = await client.chat.completions.with_raw_response.create(model=model, messages=MSGS)
        assert raw.parse().choices  # the openai SDK parses as it reads
    else:
        raw = await client.messages.with_raw_response.create(model=model, max_tokens=50, messages=MSGS)
        assert (await raw.parse()).content
    return raw.headers


async def _streamed(sdk: str, client, model: str):
    if sdk == "openai":
        call = client.chat.completions.with_streaming_response.create(model=model, messages=MSGS, stream=True)
    else:
        call = client.messages.with_streaming_response.create(
            model=model, max_tokens=50, messages=MSGS, stream=True
        )
    async with call as resp:
        headers = resp.headers
        events = [line async for line in resp.iter_lines() if line.startswith("data:")]
    assert events
    return headers


@pytest.mark.parametrize("model", ["gpt-fake", "claude-fake"])  # the client's own format, and translated
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_whole_answer_carries_the_time_the_histogram_observes(gateway, fake, oai, anth, sdk, model):
    fake.latency_s = LATENCY_S
    client = oai(gateway) if sdk == "openai" else anth(gateway)
    headers = await _whole(sdk, client, model)
    own_ms = float(headers[OVERHEAD_HEADER])
    assert abs(own_ms - _observed_ms(gateway, model)) <= ROUNDING_MS
    (row,) = await gateway.rows()
    assert row["status"] == "ok"
    rest_ms = row["latency_ms"] - row["upstream_ms"] - row["queue_wait_ms"]
    assert abs(own_ms - rest_ms) <= ROUNDING_MS, (own_ms, rest_ms)


@pytest.mark.parametrize("model", ["gpt-fake", "claude-fake"])
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_a_stream_carries_its_time_to_the_head_less_the_upstreams(gateway, fake, oai, anth, sdk, model):
    fake.latency_s = LATENCY_S
    client = oai(gateway) if sdk == "openai" else anth(gateway)
    headers = await _streamed(sdk, client, model)
    own_ms = float(headers[OVERHEAD_HEADER])
    assert abs(own_ms - _observed_ms(gateway, model)) <= ROUNDING_MS
    (row,) = await gateway.rows()
    assert row["status"] == "ok" and row["stream"]
    # the head went out after the upstream's LATENCY_S: the figure is without it
    assert own_ms <= row["ttft_ms"] - LATENCY_S * 1000, (own_ms, row["ttft_ms"])


async def test_a_refused_request_carries_its_time_too(gateway, oai):
    """No upstream call (an unknown model is a 4xx): all of its time is the gateway's; the histogram, of
    the gateway's time around model calls, does not count it."""
    client = oai(gateway)
    with pytest.raises(openai.NotFoundError) as e:
        await client.chat.completions.create(model="no-such-model", messages=MSGS)
    own_ms = float(e.value.response.headers[OVERHEAD_HEADER])
    (row,) = await gateway.rows()
    assert abs(own_ms - (row["latency_ms"] - row["queue_wait_ms"])) <= ROUNDING_MS
    labels = {"project": "alpha", "model": "no-such-model"}
    assert gateway.gw.metrics.registry.get_sample_value("gateway_overhead_seconds_count", labels) is None
