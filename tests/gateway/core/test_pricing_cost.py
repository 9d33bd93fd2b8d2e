"""Cost (gateway.core.pricing): every ledger row priced from its token counts, cached tokens included, through
the real SDKs; the price table and its config; the daily cost budget (in-process, across a restart);
`farm gateway usage` and /metrics showing the cost. The Redis path is in test_cost_shared.py."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import aiohttp
import anthropic
import openai
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ConfigError, ProjectConfig, load_settings
from gateway.core.pricing import DEFAULT_PRICES, PriceTable
from gateway.core.usage import usage_details
from gateway.limits.base import LimitExceeded
from gateway.limits.local import ProjectLimits, share_of
from gateway.ops.cli import gateway as cli
from gateway.ops.cli import usage_rows
from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]
# Prices for the test config's models (none has a default price): gpt-fake by its upstream id, claude-fake
# by its public name; gpt-beta has none.
PRICES = {
    "gpt-upstream": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5},
    "claude-fake": {
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cached_input_per_mtok": 0.3,
        "cache_write_per_mtok": 3.75,
    },
}
CACHE_READ, CACHE_WRITE = 4, 6


def openai_cost(inp: int, out: int) -> float:
    cached = min(CACHE_READ, inp)  # OpenAI's cached tokens are part of the prompt tokens
    return ((inp - cached) * 2.0 + cached * 0.5 + out * 8.0) / 1e6


def anthropic_cost(inp: int, out: int) -> float:
    # Anthropic's input_tokens exclude the cache reads and writes, reported beside them
    return (inp * 3.0 + CACHE_READ * 0.3 + CACHE_WRITE * 3.75 + out * 15.0) / 1e6


async def _call(
    api: str, stream: bool, oai_client: openai.AsyncOpenAI, anth_client: anthropic.AsyncAnthropic
):
    if api == "chat":
        if stream:
            async for _ in await oai_client.chat.completions.create(
                model="gpt-fake", messages=MSGS, stream=True
            ):
                pass
        else:
            await oai_client.chat.completions.create(model="gpt-fake", messages=MSGS)
    elif api == "responses":
        if stream:
            async for _ in await oai_client.responses.create(model="gpt-fake", input="hi", stream=True):
                pass
        else:
            await oai_client.responses.create(model="gpt-fake", input="hi")
    else:
        kw = {"model": "claude-fake", "max_tokens": 16, "messages": MSGS}
        if stream:
            async for _ in await anth_client.messages.create(**kw, stream=True):
                pass
        else:
            await anth_client.messages.create(**kw)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_each_row_carries_the_cost_of_its_tokens_cached_ones_included(
    start_gateway, fake, oai, anth, api, stream
):
    gw = await start_gateway(prices=PRICES)
    fake.cache_read_tokens, fake.cache_write_tokens = CACHE_READ, CACHE_WRITE
    await _call(api, stream, oai(gw), anth(gw))
    (row,) = await gw.rows()
    (_, _, inp, out) = fake.usage_log[-1]
    assert row["status"] == "ok" and not row["tokens_estimated"]
    if api == "messages":
        assert row["input_tokens"] == inp + CACHE_READ + CACHE_WRITE  # every input token, cached included
        assert (row["cached_input_tokens"], row["cache_write_tokens"]) == (CACHE_READ, CACHE_WRITE)
        assert row["cost_usd"] == pytest.approx(anthropic_cost(inp, out), rel=1e-9)
    else:
        assert row["input_tokens"] == inp
        assert (row["cached_input_tokens"], row["cache_write_tokens"]) == (min(CACHE_READ, inp), 0)
        assert row["cost_usd"] == pytest.approx(openai_cost(inp, out), rel=1e-9)


async def test_a_model_without_a_price_costs_none_and_is_named_once_at_start(
    start_gateway, fake, oai, caplog
):
    with caplog.at_level(logging.WARNING, logger="gateway"):
        gw = await start_gateway(prices=PRICES)
    warned = [r.getMessage() for r in caplog.records if "has no price" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("model gpt-beta has no price"), warned
    await oai(gw, project="beta").chat.completions.create(model="gpt-beta", messages=MSGS)
    await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    rows = await gw.rows()
    by_model = {r["public_model"]: r for r in rows}
    assert by_model["gpt-beta"]["cost_usd"] is None  # unknown, not free
    assert by_model["gpt-beta"]["input_tokens"] > 0
    assert by_model["gpt-fake"]["cost_usd"] > 0


def test_config_prices_override_and_extend_the_defaults(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text(
        "prices:\n"
        "  gpt-5: {input_per_mtok: 1.0, output_per_mtok: 9.0}\n"
        "  my-model: {input_per_mtok: 0.5, output_per_mtok: 1.5, cached_input_per_mtok: 0.05}\n"
    )
    table = PriceTable(load_settings(path).prices)
    assert table.price("gpt-5", None).output_per_mtok == 9.0
    assert table.price("gpt-5", None).cached_input_per_mtok is None  # the override replaces the entry
    assert table.cost("gpt-5", None, 1_000_000, 0, cached_input=500_000) == pytest.approx(1.0)
    assert table.cost(None, "my-model", 1_000_000, 1_000_000, cached_input=1_000_000) == pytest.approx(1.55)
    assert table.price("gpt-5-mini", None) == DEFAULT_PRICES["gpt-5-mini"]  # the rest stay
    # looked up by the upstream id first, then by the public name
    assert table.price("my-model", "gpt-5").input_per_mtok == 0.5
    assert table.price("unknown-upstream", "gpt-5").input_per_mtok == 1.0
    assert table.cost("unknown-upstream", "unknown-public", 10, 10) is None


def test_the_shipped_prices_follow_the_published_ones():
    sonnet = DEFAULT_PRICES["claude-sonnet-4-5"]
    # 1 M fresh input + 1 M cache reads + 1 M cache writes + 1 M output
    assert sonnet.cost(3_000_000, 1_000_000, 1_000_000, 1_000_000) == pytest.approx(3 + 0.30 + 3.75 + 15)
    assert DEFAULT_PRICES["gpt-5-codex"].cost(2_000_000, 0, 1_000_000) == pytest.approx(1.25 + 0.125)
    assert DEFAULT_PRICES["claude-haiku-4-5"].cost(0, 1_000_000) == pytest.approx(5.0)


@pytest.mark.parametrize(
    "yaml_text, field",
    [
        ("prices:\n  gpt-5: {input_per_mtok: -1, output_per_mtok: 1}\n", "prices.gpt-5.input_per_mtok"),
        ("prices:\n  gpt-5: {input_per_mtok: 1}\n", "prices.gpt-5.output_per_mtok"),
        ("prices:\n  gpt-5: {input_per_mtok: 1, output_per_mtok: 1, cahced: 2}\n", "prices.gpt-5.cahced"),
        ("prices:\n  gpt-5: {input_per_mtok: lots, output_per_mtok: 1}\n", "prices.gpt-5.input_per_mtok"),
        (
            "providers: {p: {kind: openai, base_url: 'http://127.0.0.1:1/v1'}}\n"
            "models: {m: {provider: p, upstream_model: m}}\n"
            "projects: {alpha: {models: [m], daily_cost_budget_usd: 0}}\n",
            "projects.alpha.daily_cost_budget_usd",
        ),
    ],
)
def test_bad_price_config_names_the_field(tmp_path, yaml_text, field):
    path = tmp_path / "gw.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_settings(path)
    assert field + ":" in str(e.value), str(e.value)


# --- the daily cost budget ---------------------------------------------------------------------------
# 1000 $/Mtok: a chat request here (~10 input + 3-7 output tokens) costs about a cent
DEAR = {"gpt-upstream": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}}
BUDGET_USD = 0.05
MAX_TOKENS = 8


async def test_the_cost_budget_refuses_with_429_once_spent_and_a_restart_still_knows(
    start_gateway, fake, oai
):
    cfg = {"prices": DEAR, "projects": {"alpha": {"daily_cost_budget_usd": BUDGET_USD}}}
    gw = await start_gateway(**cfg)
    client = oai(gw)
    refused = None
    for _ in range(40):
        try:
            await client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=MAX_TOKENS)
        except openai.RateLimitError as e:
            refused = e
            break
    assert refused is not None, "the cost budget never refused"
    assert refused.response.headers["x-farm-limit"] == "daily_cost_budget"
    assert "has used its daily cost budget" in refused.message
    assert int(refused.response.headers["Retry-After"]) >= 1
    rows = await gw.rows()
    spent = sum(r["cost_usd"] for r in rows if r["status"] == "ok")
    one_request = (20 + MAX_TOKENS) * 1000 / 1e6  # more than any one request here reserves
    assert BUDGET_USD <= spent < BUDGET_USD + one_request, spent
    assert sum(1000 * (i + o) / 1e6 for _, _, i, o in fake.usage_log) == pytest.approx(spent)
    # the other project has no cost budget
    await oai(gw, project="beta").chat.completions.create(model="gpt-beta", messages=MSGS)

    await gw.stop()
    again = await start_gateway(database_url=gw.gw.settings.database_url, **cfg)
    again.keys = gw.keys
    n = len(fake.usage_log)
    with pytest.raises(openai.RateLimitError, match="daily cost budget"):
        await oai(again).chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=MAX_TOKENS)
    assert len(fake.usage_log) == n  # refused before the upstream


async def test_requests_in_flight_reserve_their_worst_case_cost(start_gateway, fake, oai):
    """A request reserves max_tokens at the output price plus its input estimate at the input price: with
    a budget for a little more than one reservation, a second concurrent request is refused while the
    first is in flight, with a message saying so."""
    gw = await start_gateway(prices=DEAR, projects={"alpha": {"daily_cost_budget_usd": 0.9}})
    fake.faults.append(Fault(stall_before_headers=True))
    client = oai(gw)
    first = asyncio.create_task(
        client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=1000)  # ~$1 reserved
    )
    while gw.gw.limits["alpha"].in_flight == 0:
        await asyncio.sleep(0.005)
    with pytest.raises(openai.RateLimitError, match="requests in flight reserve the rest of its daily cost"):
        await client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=1000)
    fake.release.set()
    await first
    assert gw.gw.limits["alpha"].cost_reserved == 0  # settled to the real cost
    spent = sum(1000 * (i + o) / 1e6 for *_, i, o in fake.usage_log)
    assert gw.gw.limits["alpha"].cost_today == pytest.approx(spent)


# --- usage and metrics -------------------------------------------------------------------------------
async def test_usage_and_metrics_show_the_cost(start_gateway, fake, oai, anth, tmp_path):
    gw = await start_gateway(prices=PRICES)
    fake.cache_read_tokens, fake.cache_write_tokens = CACHE_READ, CACHE_WRITE
    await _call("chat", False, oai(gw), anth(gw))
    await _call("messages", True, oai(gw), anth(gw))
    await oai(gw, project="beta").chat.completions.create(model="gpt-beta", messages=MSGS)
    rows = await gw.rows()
    costs = {r["public_model"]: r["cost_usd"] for r in rows}

    names, table = await usage_rows(gw.gw.settings, "model", None)
    by_model = {r[names.index("model")]: r[names.index("cost_usd")] for r in table}
    assert by_model["gpt-fake"] == pytest.approx(costs["gpt-fake"])
    assert by_model["claude-fake"] == pytest.approx(costs["claude-fake"])
    assert by_model["gpt-beta"] is None

    cfg = tmp_path / "gw.yaml"
    data = {"database_url": gw.gw.settings.database_url, "secret": gw.gw.settings.secret.get_secret_value()}
    cfg.write_text(yaml.safe_dump(data))
    res = await asyncio.to_thread(CliRunner().invoke, cli, ["usage", "--config", str(cfg), "--by", "project"])
    assert res.exit_code == 0, res.output
    assert "cost_usd" in res.output
    total = costs["gpt-fake"] + costs["claude-fake"]
    assert f"{total:.4f}" in res.output  # alpha's row and the total row

    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/metrics") as r:
            page = await r.text()
    samples = {
        (s.labels["project"], s.labels["model"]): s.value
        for fam in text_string_to_metric_families(page)
        if fam.name == "gateway_cost_usd"
        for s in fam.samples
        if s.name == "gateway_cost_usd_total"
    }
    assert samples[("alpha", "gpt-fake")] == pytest.approx(costs["gpt-fake"])
    assert samples[("alpha", "claude-fake")] == pytest.approx(costs["claude-fake"])
    assert samples[("beta", "gpt-beta")] == 0.0  # no price: adds nothing


def test_every_model_of_the_example_config_has_a_shipped_price():
    settings = load_settings("gateway/example-config.yaml")
    routes = [(name, d.upstream_model) for name, r in settings.models.items() for d in r.deployments]
    assert routes and PriceTable(settings.prices).unpriced(routes) == []


@pytest.mark.parametrize(
    "api, usage, expected",
    [
        ("chat", {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": None}, (10, 2, 0, 0)),
        ("chat", {"prompt_tokens": 10, "completion_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 64}}, (10, 2, 10, 0)),  # at most the input
        ("responses", {"input_tokens": 9, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 3}},
         (9, 1, 3, 0)),
        ("messages", {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 7,
                      "cache_creation_input_tokens": None}, (12, 1, 7, 0)),
    ],
)  # fmt: skip
def test_cached_tokens_are_read_from_each_api_shape(api, usage, expected):
    assert tuple(usage_details(api, {"usage": usage})) == expected


def test_a_garbage_cached_count_makes_the_usage_unbelievable():
    body = {
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": "x"},
        }
    }
    assert usage_details("chat", body) is None  # estimated instead, as for any other bad count


async def test_the_cost_budget_resets_at_utc_midnight_and_shares_divide_it():
    now = [datetime(2026, 11, 29, 23, 59, 0, tzinfo=UTC).timestamp()]
    cfg = ProjectConfig(models=["m"], daily_cost_budget_usd=1.0)
    p = ProjectLimits("alpha", cfg, clock=lambda: now[0])
    a = await p.admit(10, 0, cost_reserve=0.5)
    a.release()
    a.settle(10, 1.25)
    with pytest.raises(LimitExceeded) as e:
        await p.admit(10, 0, cost_reserve=0.5)
    assert e.value.limit == "daily_cost_budget" and e.value.retry_after_s == pytest.approx(60)
    now[0] += 61
    a = await p.admit(10, 0, cost_reserve=0.5)
    assert p.cost_today == 0.0 and p.cost_reserved == 0.5
    assert share_of(cfg, 4).daily_cost_budget_usd == pytest.approx(0.25)
