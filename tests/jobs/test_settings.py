"""The farm's settings: every FARM_* variable is a field of jobs.settings.FarmSettings, honoured where it is
used, read nowhere else, listed in the README; a bad value is named in one line."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs.cli import main
from jobs.drafts.client import GatewayTarget
from jobs.run.farm_metrics import FarmMetrics
from jobs.settings import DEFAULT_GATEWAY_URL, FarmSettings, FarmSettingsError, env_name
from jobs.store import DEFAULT_DB

REPO = Path(__file__).resolve().parents[2]
VARIABLES = [env_name(f) for f in FarmSettings.model_fields]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No FARM_* variable of the machine running the tests leaks in."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_defaults_without_any_variable():
    s = FarmSettings.load()
    assert s.db == DEFAULT_DB and s.ray_address is None and s.gpus is None
    assert s.metrics_port is None and s.metrics_pushgateway is None and s.metrics_push_s == 10.0
    assert s.gateway_url == DEFAULT_GATEWAY_URL and s.gateway_key is None and s.gateway_model is None
    assert FarmMetrics.from_env() is None and GatewayTarget.from_settings() is None  # both off


def test_each_variable_is_read_from_the_environment(monkeypatch):
    given = {
        "FARM_DB": "postgresql+psycopg://farm@db/farm",
        "FARM_RAY_ADDRESS": "10.0.0.5:6379",
        "FARM_RAY_DASHBOARD": "http://10.0.0.5:8265",
        "FARM_GPUS": "4",
        "FARM_METRICS_PORT": "9464",
        "FARM_METRICS_ADDR": "0.0.0.0",
        "FARM_METRICS_PUSHGATEWAY": "http://127.0.0.1:9091",
        "FARM_METRICS_PUSH_S": "2.5",
        "FARM_GATEWAY_URL": "http://gw:8787/v1",
        "FARM_GATEWAY_KEY": " kf_abc ",
        "FARM_GATEWAY_MODEL": "gpt-fake",
        "FARM_GATEWAY_SESSION": " claude-1 ",
    }
    assert set(given) == set(VARIABLES)  # a new field gets a line here
    for k, v in given.items():
        monkeypatch.setenv(k, v)
    s = FarmSettings.load()
    assert (s.db, s.ray_address, s.gpus) == ("postgresql+psycopg://farm@db/farm", "10.0.0.5:6379", 4)
    assert s.ray_dashboard == "http://10.0.0.5:8265"
    assert (s.metrics_port, s.metrics_addr, s.metrics_push_s) == (9464, "0.0.0.0", 2.5)
    assert s.metrics_pushgateway == "http://127.0.0.1:9091"
    assert (s.gateway_url, s.gateway_key, s.gateway_model) == ("http://gw:8787/v1", "kf_abc", "gpt-fake")
    assert s.gateway_session == "claude-1" and GatewayTarget.from_settings(s).session == "claude-1"
    assert "kf_abc" not in repr(s)
    assert FarmSettings.load({}) == FarmSettings.load({"FARM_GPUS": ""})  # a mapping alone, empty = unset


def test_farm_db_names_the_store_of_every_command(monkeypatch, tmp_path):
    db = tmp_path / "from-env.db"
    monkeypatch.setenv("FARM_DB", str(db))
    res = CliRunner().invoke(main, ["db", "upgrade"])  # a command that writes creates the store there
    assert res.exit_code == 0, res.output
    assert db.exists()
    res = CliRunner().invoke(main, ["jobs", "list"])  # and one that reads reads it
    assert res.exit_code == 0, res.output


def test_the_metrics_variables_start_the_exporter(monkeypatch):
    monkeypatch.setenv("FARM_METRICS_PORT", "0")
    monkeypatch.setenv("FARM_METRICS_ADDR", "127.0.0.1")
    monkeypatch.setenv("FARM_METRICS_PUSH_S", "7")
    m = FarmMetrics.from_env()
    assert m is not None
    try:
        assert m.push_interval_s == 7.0 and m.url == f"http://127.0.0.1:{m.port}/metrics"
        with urllib.request.urlopen(m.url, timeout=10) as r:
            assert b"farm_trials_total" in r.read()
    finally:
        m.close()


def test_the_gateway_variables_name_the_drafts_target(monkeypatch):
    monkeypatch.setenv("FARM_GATEWAY_KEY", "kf_0123")
    target = GatewayTarget.from_settings()
    assert target == GatewayTarget(DEFAULT_GATEWAY_URL, "kf_0123", None)
    monkeypatch.setenv("FARM_GATEWAY_URL", "http://gw.example:8787/v1/")
    monkeypatch.setenv("FARM_GATEWAY_MODEL", "gpt-fake")
    target = GatewayTarget.from_settings()
    assert target.model == "gpt-fake" and target.root == "http://gw.example:8787"


@pytest.mark.parametrize(
    "name,value,says",
    [
        ("FARM_GPUS", "0", "greater than or equal to 1"),
        ("FARM_GPUS", "four", "valid integer"),
        ("FARM_METRICS_PORT", "nine", "valid integer"),
        ("FARM_METRICS_PORT", "70000", "less than or equal to 65535"),
        ("FARM_METRICS_PUSH_S", "-1", "greater than 0"),
    ],
)
def test_a_bad_value_is_named(monkeypatch, tmp_path, name, value, says):
    monkeypatch.chdir(tmp_path)  # the default store, .farm/farm.db, would be here
    monkeypatch.setenv(name, value)
    with pytest.raises(FarmSettingsError) as ei:
        FarmSettings.load()
    message = str(ei.value)
    assert f"{name}: " in message and says in message and repr(value) in message and "\n" not in message
    with pytest.raises(FarmSettingsError, match=name):
        FarmSettings.load({name: value})
    res = CliRunner().invoke(main, ["jobs", "list"])  # a command reading its settings: one line, exit 2
    assert res.exit_code == 2 and name in res.output and "Traceback" not in res.output, res.output


# a read of an environment variable whose name starts with FARM_ (os.environ.get, os.environ[...], getenv)
_READ = re.compile(r"""(environ\.get|environ\[|getenv)\(?\s*["']FARM_""")


def test_no_farm_variable_is_read_outside_the_settings():
    found = []
    for folder in ("jobs", "cluster", "kernels", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            if path == REPO / "jobs" / "settings.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _READ.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert found == []


def test_the_readme_lists_every_variable():
    readme = (REPO / "README.md").read_text()
    missing = [name for name in VARIABLES if f"| `{name}` |" not in readme]
    assert missing == []
