"""Every configuration value is checked when the config loads (issue 48): a URL with a scheme its client does
not take, a port out of range, a folder that is a file, a malformed environment value are one line naming the
field (ConfigError; exit 2 at the command line), never a traceback from the library that would have used the
value. Seen: ``redis_url: http://...`` was a ValueError traceback from the Redis client at ``serve``."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, load_settings
from tests.gateway.http.test_startup import _one_line, _refused, _with
from tests.gateway.http.test_workers import Serve, _config

BASE = {
    "providers": {"oa": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
    "models": {"m": {"provider": "oa", "upstream_model": "m"}},
    "projects": {"p": {"models": ["m"]}},
}


def _load(**changes):
    return load_settings(None, **(BASE | changes))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        (
            {"redis_url": "http://127.0.0.1:6379/0"},
            ["redis_url", "'http'", "redis://", "rediss://", "unix://"],
        ),
        ({"redis_url": "redis://127.0.0.1:99999/0"}, ["redis_url", "port"]),
        ({"redis_url": "redis:///0"}, ["redis_url", "host"]),
        ({"redis_url": "unix://"}, ["redis_url", "socket path"]),
        ({"redis_url": "redis://127.0.0.1:6379/abc"}, ["redis_url", "database number"]),
        (
            {"providers": {"oa": {"kind": "openai", "base_url": "http://127.0.0.1:99999/v1"}}},
            ["providers.oa", "base_url", "port"],
        ),
        (
            {"providers": {"oa": {"kind": "openai", "base_url": "ftp://127.0.0.1/v1"}}},
            ["providers.oa", "base_url", "http(s)"],
        ),
        ({"retry": {"backoff_base_s": 10, "backoff_cap_s": 1}}, ["retry", "backoff_cap_s", "backoff_base_s"]),
        ({"routing": {"cooldown_s": 100, "max_cooldown_s": 1}}, ["routing", "max_cooldown_s", "cooldown_s"]),
        ({"ledger_spool_dir": "/etc/hostname"}, ["ledger_spool_dir", "not a folder"]),
        (
            {"projects": {"p": {"models": ["m"], "translation": "loose"}}},
            ["projects.p.translation", "strict"],
        ),
        ({"port": 70000}, ["port", "65535"]),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_a_bad_value_is_one_line_naming_the_field(changes, words):
    with pytest.raises(ConfigError) as e:
        _load(**changes)
    line = str(e.value)
    assert "\n" not in line
    for w in words:
        assert w in line, line


def test_a_malformed_environment_value_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv("FARM_GATEWAY_PROVIDERS", "{not json")
    want = r"^invalid gateway config: providers: the environment variable FARM_GATEWAY_PROVIDERS "
    with pytest.raises(ConfigError, match=want):
        _load()


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://h.example:6380/2", "unix:///run/redis.sock", "redis://h"]
)
def test_the_redis_urls_that_work_are_taken(url):
    assert _load(redis_url=url).redis_url == url


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "status", "words"),
    [
        ({"redis_url": "http://127.0.0.1:6379/0"}, 2, ["redis_url", "'http'"]),  # the seen case
        ({"providers": {"oa": {"kind": "openai", "base_url": "http://127.0.0.1:99999/v1"}}}, 2, ["port"]),
        ({"ledger_spool_dir": "/etc/hostname"}, 2, ["ledger_spool_dir"]),
        # a folder that cannot be made is the machine's (as a database's missing folder): exit 4
        ({"ledger_spool_dir": "/proc/no-such/spool"}, 4, ["ledger_spool_dir", "/proc/no-such/spool"]),
    ],
    ids=["redis_url http", "base_url port", "spool dir a file", "spool dir cannot be made"],
)
def test_serve_refuses_a_bad_value_in_one_line_with_its_status(tmp_path, changes, status, words):
    cfg = _with(_config(tmp_path, "http://127.0.0.1:9/v1", None), **changes)
    code, out = _refused(Serve(cfg, tmp_path, "bad-value"))
    line = _one_line(out)
    assert code == status, out
    for w in words:
        assert w in line, line
