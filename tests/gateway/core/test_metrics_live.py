"""The scrape-time collectors (gateway.core.metrics_live): each scrape reads its source as it is then,
registering one reads nothing from its source, and every family has the name and type /metrics documents.
The gateway's own /metrics is tested end to end in test_metrics.py; these pin the collectors alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from gateway.core.metrics_live import KeysCollector, LedgerCollector, SharedCollector


class Untouchable:
    """A source that fails on any read: registering a collector must not read it."""

    def __getattr__(self, name):
        raise AssertionError(f"read {name} at registration")


def _registry(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


@pytest.mark.parametrize(
    "make",
    [
        lambda src: KeysCollector(src),
        lambda src: LedgerCollector(src),
        lambda src: SharedCollector(src, src),
    ],
)
def test_registering_reads_nothing_from_the_source(make):
    _registry(make(Untouchable()))  # describe() names the families without a read


def test_the_ledger_collector_reads_the_writer_at_each_scrape():
    writer = SimpleNamespace(
        pending_rows=3, written=10, dropped=1, failed_flushes=2, spool_errors=0, replayed=5,
        oldest_pending_s=lambda: 1.5,
    )  # fmt: skip
    registry = _registry(LedgerCollector(writer))
    value = registry.get_sample_value
    assert value("gateway_ledger_pending_rows") == 3
    assert value("gateway_ledger_oldest_pending_seconds") == 1.5
    assert value("gateway_ledger_written_rows_total") == 10
    assert value("gateway_ledger_dropped_rows_total") == 1
    assert value("gateway_ledger_flush_failures_total") == 2
    assert value("gateway_ledger_replayed_rows_total") == 5
    writer.pending_rows, writer.written = 0, 13
    writer.oldest_pending_s = lambda: 0.0
    assert value("gateway_ledger_pending_rows") == 0 and value("gateway_ledger_written_rows_total") == 13
    assert value("gateway_ledger_oldest_pending_seconds") == 0.0


def test_the_keys_collector_counts_stale_and_refused_lookups():
    keys = SimpleNamespace(stale_served=0, unavailable=0)
    registry = _registry(KeysCollector(keys))
    assert registry.get_sample_value("gateway_keys_stale_served_total") == 0
    keys.stale_served, keys.unavailable = 4, 7
    assert registry.get_sample_value("gateway_keys_stale_served_total") == 4
    assert registry.get_sample_value("gateway_keys_store_unavailable_total") == 7


def test_the_shared_collector_shows_health_and_pending_usage():
    shared = SimpleNamespace(up=True, outages=0, fallback_admissions=0)
    usage = SimpleNamespace(pending_requests=0)
    registry = _registry(SharedCollector(shared, usage))
    assert registry.get_sample_value("gateway_shared_state_up") == 1
    assert registry.get_sample_value("gateway_shared_pending_requests") == 0
    shared.up, shared.outages, shared.fallback_admissions = False, 1, 9
    usage.pending_requests = 2
    assert registry.get_sample_value("gateway_shared_state_up") == 0
    assert registry.get_sample_value("gateway_shared_state_outages_total") == 1
    assert registry.get_sample_value("gateway_shared_fallback_admissions_total") == 9
    assert registry.get_sample_value("gateway_shared_pending_requests") == 2
