"""gateway.http.targets: the step before the exchange that the proxy endpoints and the summaries' model calls
share (model checks, each target's request, where the request went, an upstream's error answer), with no
server: deployments are stand-ins with the fields routing gives them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.core.record import Record
from gateway.errors import BadRequest, Forbidden, NotFound, UpstreamCredentialRejected
from gateway.http.targets import TargetRequests, check_model, translated_headers, upstream_error


def _target(kind: str, upstream: str, model: str = "m", effort: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        kind=kind, upstream_model=upstream, effort=effort, model=model, name=f"{kind}-{upstream}",
        provider=kind,
    )  # fmt: skip


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_check_model_refuses_an_unknown_model_and_one_the_project_may_not_use():
    router = SimpleNamespace(models={"m": "deployments of m", "other": "deployments of other"})
    project = SimpleNamespace(models=["m"])
    assert check_model(router, project, "p", "m") == "deployments of m"
    with pytest.raises(NotFound, match="does not exist"):
        check_model(router, project, "p", "nope")
    with pytest.raises(Forbidden, match="project 'p' is not allowed to use model 'other'"):
        check_model(router, project, "p", "other")


def test_a_target_of_the_clients_kind_gets_the_body_with_its_model_once_per_id():
    targets = TargetRequests(
        dict(BODY), "chat", "openai", {"Content-Type": "application/json"}, model="m", default_max_tokens=9,
        native_fields={"response_format": {"type": "json_object"}}, encoded={"m": b"raw"},
    )  # fmt: skip
    assert targets(_target("openai", "m")) == b"raw"  # encoded already: sent as it came
    out = targets(_target("openai", "up-1"))
    assert json.loads(out) == {**BODY, "model": "up-1", "response_format": {"type": "json_object"}}
    assert targets(_target("openai", "up-1")) is out
    assert targets.request(_target("openai", "up-1"), "/chat/completions")[0] == "/chat/completions"
    assert (
        targets.translation(_target("openai", "m")) is None and targets.dropped(_target("openai", "m")) == []
    )


def test_a_target_of_another_kind_gets_the_translated_request_on_its_path_and_headers():
    headers = {"Content-Type": "application/json", "openai-beta": "x"}
    targets = TargetRequests(dict(BODY), "chat", "openai", headers, model="m", default_max_tokens=9)
    target = _target("anthropic", "claude")
    path, body, sent = targets(target)
    assert path == "/messages" and json.loads(body)["model"] == "claude"
    assert sent == translated_headers(headers, "anthropic") and "openai-beta" not in sent
    assert targets.translation(target) == "chat->messages" and targets.upstream_format(target) == "messages"
    rec, plan = Record("chat"), SimpleNamespace(target=target, fallback_from="asked")
    targets.note(rec, plan)
    assert (rec.deployment, rec.upstream_model, rec.fallback_from, rec.translation) == (
        "anthropic-claude", "claude", "asked", "chat->messages",
    )  # fmt: skip


def test_an_untranslatable_field_of_a_fallback_model_names_it():
    body = {**BODY, "n": 2}  # several choices: Anthropic has no equivalent
    targets = TargetRequests(body, "chat", "openai", {}, model="m", default_max_tokens=9)
    with pytest.raises(BadRequest) as e:
        targets.translated(_target("anthropic", "claude", model="fb"))
    assert e.value.message.startswith("fallback model 'fb' (anthropic): n: 2 choices")


def test_an_upstream_error_keeps_its_status_and_a_refused_provider_key_is_a_502():
    headers = CIMultiDictProxy(CIMultiDict({"Retry-After": "3"}))
    rec = Record("chat")
    rec.provider = "up"
    err = upstream_error(rec, SimpleNamespace(status=429, body=b"slow down", headers=headers))
    assert (err.status, err.retry_after, err.error_class) == (429, "3", "upstream_429")
    assert "upstream 'up' returned HTTP 429: slow down" == err.message
    assert (rec.status, rec.http_status, rec.error_class) == ("error", 429, "upstream_429")
    err = upstream_error(rec, SimpleNamespace(status=401, body=b"", headers=headers))
    assert isinstance(err, UpstreamCredentialRejected) and err.status == 502 and rec.http_status == 502
