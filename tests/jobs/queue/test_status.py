"""What a shared cluster shows (issue 47): `farm pool status` (workers per owner and GPU type, shares
against targets, quota use, the waiting line) and the pool's Prometheus metrics, scraped over real HTTP
on 127.0.0.1, from the store's state."""

from __future__ import annotations

import urllib.request

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from jobs.cli import main
from jobs.queue.policy import Policy
from jobs.queue.pool_metrics import PoolMetrics
from jobs.queue.queue import Queue
from jobs.spec.sweep import loads_spec

SPEC = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {grid}}}}}
"""


def _busy_cluster(store) -> Queue:
    """A pool of 2 H100 and 2 H200 workers: ana (weight 3, quota 3 workers) holds 3, bo 1, cy waits."""
    policy = Policy.from_dict({"owners": {"ana": {"weight": 3, "quota": {"workers": 3}}}, "half_life": "1d"})
    q = Queue(store, policy)
    q.register_pool("pool-a", 4, {"H100": 2, "H200": 2})
    for owner, n in (("ana", 6), ("bo", 2), ("cy", 2)):
        q.submit(loads_spec(SPEC.format(name=owner, grid=list(range(n)))), owner=owner)
    taken = [
        q.claim("pool-a", "H100"),
        q.claim("pool-a", "H100"),
        q.claim("pool-a", "H200"),
        q.claim("pool-a", "H200"),
    ]
    q.beat(
        "pool-a",
        {
            "H100": {"workers": 2, "running": {"ana": 2}},
            "H200": {"workers": 2, "running": {"ana": 1, "bo": 1}},
        },
    )
    q.charge({"ana": 7200.0})
    assert [c.owner for c in taken].count("ana") == 3
    return q


def test_farm_pool_status_shows_owners_shares_targets_quota_and_the_line(store, tmp_path):
    _busy_cluster(store)
    out = CliRunner().invoke(main, ["pool", "status", "--db", str(tmp_path / "farm.db")])
    assert out.exit_code == 0, out.output
    assert "pool pool-a on" in out.output and "2 x H100 (2 busy), 2 x H200 (2 busy)" in out.output
    ana = next(line for line in out.output.splitlines() if line.lstrip("│ ").startswith("ana "))
    cells = [c.strip() for c in ana.strip("│ ").split("│")]
    assert cells[:5] == ["ana", "ana", "3", "2 H100, 1 H200", "75%"], cells
    assert cells[7] == "2.00" and cells[9] == "3/3 workers", cells
    assert "owner ana holds 3 workers, its quota" in out.output  # the line says why ana's job waits
    assert "preemptions: 0" in out.output


def test_the_pool_metrics_are_scraped_per_owner_with_the_wait(store):
    q = _busy_cluster(store)
    metrics = PoolMetrics(q)
    metrics.waited("cy", 42.0)
    url = metrics.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(url, timeout=30) as page:
            text = page.read().decode()
    finally:
        metrics.close()
    got = {
        (s.name, s.labels.get("owner") or s.labels.get("gpu_type")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert got[("farm_pool_running_workers", "ana")] == 3 and got[("farm_pool_running_workers", "bo")] == 1
    assert got[("farm_pool_share", "ana")] == 0.75
    assert got[("farm_pool_usage_seconds", "ana")] > 7100
    assert got[("farm_pool_queued_trials", "cy")] == 2 and got[("farm_pool_workers", "H200")] == 2
    # ana used two worker-hours: her target falls below her weight's 3/5, bo and cy share the rest
    assert got[("farm_pool_target_share", "ana")] < 0.6
    assert got[("farm_pool_target_share", "cy")] == got[("farm_pool_target_share", "bo")] > 0.2
    assert got[("farm_pool_queue_wait_seconds_count", "cy")] == 1
    assert got[("farm_pool_queue_wait_seconds_sum", "cy")] == 42.0
    assert got[("farm_pool_preemptions_total", None)] == 0
