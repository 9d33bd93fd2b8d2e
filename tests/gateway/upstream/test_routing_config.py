"""Routing config (models.<m>.deployments, fallbacks, routing:) and the picker's cooldown rules, on a real
Router built from settings (no upstream needed: picking sends nothing)."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, ProjectConfig, load_settings
from gateway.limits.local import Limits
from gateway.upstream.client import pool_warnings
from gateway.upstream.routing import Router, is_context_window_error

PROVIDERS = {
    "oa": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"},
    "oa2": {"kind": "openai", "base_url": "http://127.0.0.1:10/v1", "max_connections": 4},
    "an": {"kind": "anthropic", "base_url": "http://127.0.0.1:11/v1"},
    "drafter": {"kind": "local"},
}


def settings(models: dict, **kw):
    kw.setdefault("projects", {"p": {"models": [next(iter(models))]}})
    return load_settings(None, providers=PROVIDERS, models=models, **kw)


def deployments(*names: str, **extra) -> list[dict]:
    return [{"name": n, "provider": "oa", "upstream_model": f"up-{n}", **extra.get(n, {})} for n in names]


def test_single_form_is_one_deployment_named_after_its_provider():
    s = settings({"gpt-5": {"provider": "oa", "upstream_model": "gpt-5-up"}})
    route = s.models["gpt-5"]
    assert [(d.name, d.provider, d.upstream_model, d.weight) for d in route.deployments] == [
        ("oa", "oa", "gpt-5-up", 1.0)
    ]
    assert (route.provider, route.upstream_model, route.fallbacks) == ("oa", "gpt-5-up", [])


def test_deployments_form_keeps_the_first_as_provider():
    s = settings({"gpt-5": {"deployments": deployments("k1", "k2", k2={"weight": 3, "rpm": 100})}})
    route = s.models["gpt-5"]
    assert (route.provider, route.upstream_model) == ("oa", "up-k1")
    assert (route.deployments[1].weight, route.deployments[1].rpm) == (3, 100)


@pytest.mark.parametrize(
    ("models", "match"),
    [
        (
            {
                "gpt-5": {
                    "deployments": deployments("a") + [{"name": "b", "provider": "x", "upstream_model": "m"}]
                }
            },
            r"models\.gpt-5\.deployments\.1\.provider: unknown provider 'x'",
        ),
        (
            {"gpt-5": {"provider": "x", "upstream_model": "m"}},
            r"models\.gpt-5\.provider: unknown provider 'x'",
        ),
        (
            {"gpt-5": {"deployments": deployments("a", "a")}},
            r"models\.gpt-5.*deployments\.1\.name: duplicate",
        ),
        ({"gpt-5": {"provider": "oa"}}, r"models\.gpt-5.*upstream_model: required"),
        (
            {"gpt-5": {"provider": "oa", "upstream_model": "m", "deployments": deployments("a")}},
            r"models\.gpt-5.*either provider/upstream_model or deployments",
        ),
        (
            {"gpt-5": {"deployments": deployments("a", "b", b={"provider": "drafter"})}},
            r"models\.gpt-5\.deployments\.1\.provider: .*offline drafter \(local\) cannot share",
        ),
        (
            {"gpt-5": {"deployments": deployments("a", a={"weight": 0})}},
            r"models\.gpt-5\.deployments\.0\.weight",
        ),
        (
            {"gpt-5": {"provider": "oa", "upstream_model": "m", "fallbacks": ["nope"]}},
            r"models\.gpt-5\.fallbacks\.0: unknown model 'nope'",
        ),
        (
            {
                "gpt-5": {"provider": "oa", "upstream_model": "m", "context_window_fallbacks": ["claude"]},
                "claude": {"provider": "drafter", "upstream_model": "c"},
            },
            r"models\.gpt-5\.context_window_fallbacks\.0: 'claude' is of kind local.*offline drafter",
        ),
        (
            {"gpt-5": {"provider": "oa", "upstream_model": "m", "fallbacks": ["gpt-5"]}},
            r"models\.gpt-5\.fallbacks\.0: a model cannot be its own fallback",
        ),
    ],
)
def test_config_errors_name_the_field(models, match):
    with pytest.raises(ConfigError, match=match):
        settings(models)


def test_deployments_and_fallbacks_may_mix_openai_and_anthropic():
    """The proxy translates per target (gateway.translate), so mixed kinds are valid config."""
    s = settings(
        {
            "gpt-5": {
                "deployments": deployments("a", "b", b={"provider": "an"}),
                "fallbacks": ["claude"],
                "context_window_fallbacks": ["claude"],
            },
            "claude": {"provider": "an", "upstream_model": "c"},
        }
    )
    assert [d.provider for d in s.models["gpt-5"].deployments] == ["oa", "an"]
    assert s.models["gpt-5"].fallbacks == ["claude"]


def test_fallback_on_and_routing_are_validated():
    m = {"gpt-5": {"provider": "oa", "upstream_model": "m"}}
    with pytest.raises(ConfigError, match=r"projects\.p\.fallback_on\.0"):
        settings(m, projects={"p": {"models": ["gpt-5"], "fallback_on": ["sometimes"]}})
    with pytest.raises(ConfigError, match=r"routing\.cooldown_s"):
        settings(m, routing={"cooldown_s": 0})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def router(models: dict, **kw) -> tuple[Router, Clock]:
    clock = Clock()
    cfg = settings(models, **kw)
    return Router(cfg, {}, limits=Limits(cfg.projects), clock=clock, environ={}), clock


def test_all_cooling_tries_the_one_whose_cooldown_ends_first_and_cooldowns_double():
    r, clock = router({"m": {"deployments": deployments("a", "b")}}, routing={"cooldown_s": 10})
    md = r.models["m"]
    a, b = md.deployments
    a.failed("rate_limit", 50.0, r.cfg, clock())  # Retry-After 50 s
    b.failed("rate_limit", None, r.cfg, clock())  # cooldown_s
    assert md.pick(clock()) is None
    plan = r.plan("m", ProjectConfig(models=["m"]))
    assert plan.first() is b  # ends at +10, `a` at +50
    clock.now += 10
    assert md.pick(clock()) is b and b.probing  # the probe
    assert md.pick(clock()) is None  # one probe at a time
    b.failed("server_error", None, r.cfg, clock())  # a failed probe cools at once, for twice as long
    assert b.cooldown_until == clock() + 20
    clock.now += 20
    assert md.pick(clock()) is b
    b.ok()
    assert (b.cooldown_until, b.strikes, b.probing) == (0.0, 0, False)


def test_max_cooldown_bounds_retry_after():
    r, clock = router({"m": {"deployments": deployments("a")}}, routing={"max_cooldown_s": 60})
    a = r.models["m"].deployments[0]
    a.failed("rate_limit", 3600.0, r.cfg, clock())
    assert a.cooldown_until == clock() + 60


def test_context_window_errors_are_recognised():
    assert is_context_window_error("openai", b'{"error": {"code": "context_length_exceeded"}}')
    assert not is_context_window_error("openai", b'{"error": {"code": "invalid_value"}}')
    long = (
        b'{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 9"}}'
    )
    assert is_context_window_error("anthropic", long)
    assert not is_context_window_error("anthropic", long.replace(b"prompt is too long", b"bad"))
    assert not is_context_window_error("openai", b"not json") and not is_context_window_error("openai", None)


def test_pool_warnings_count_every_deployment_and_fallback_provider():
    models = {
        "gpt-5": {"deployments": deployments("a", "b", b={"provider": "oa2"}), "fallbacks": ["mini"]},
        "mini": {"provider": "oa", "upstream_model": "mini"},
    }
    s = settings(models, projects={"p": {"models": ["gpt-5"], "max_concurrency": 8}})
    (warning,) = pool_warnings(s)
    assert "provider 'oa2'" in warning and "max_concurrency: p 8" in warning
