"""The gateway's values that are read live at scrape time, not counted on the request path: the ledger
writer's backlog, the key store's outages, the shared state's health and the usage waiting for it. Each is a
collector over a small view of its source (gateway.core.metrics binds them)."""

from __future__ import annotations

from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class LedgerView(Protocol):
    pending_rows: int
    written: int
    dropped: int
    failed_flushes: int
    spool_errors: int
    replayed: int

    def oldest_pending_s(self) -> float: ...


class KeysView(Protocol):
    stale_served: int
    unavailable: int


class SharedView(Protocol):
    up: bool
    outages: int
    fallback_admissions: int


class PendingUsageView(Protocol):
    @property
    def pending_requests(self) -> int: ...


class SharedCollector:
    def __init__(self, shared: SharedView, usage: PendingUsageView) -> None:
        self._s = shared
        self._u = usage

    def describe(self):
        return self._families(0, 0, 0, 0)

    def collect(self):
        s = self._s
        return self._families(1 if s.up else 0, s.outages, s.fallback_admissions, self._u.pending_requests)

    @staticmethod
    def _families(up, outages, fallback, pending):
        return [
            GaugeMetricFamily(
                "gateway_shared_pending_requests",
                "Requests whose tokens and cost are still to be added to the shared budget counters (Redis "
                "was away when they settled)",
                value=pending,
            ),
            GaugeMetricFamily(
                "gateway_shared_state_up",
                "1 while the shared state (Redis) is reachable; 0: each process enforces its own share",
                value=up,
            ),
            CounterMetricFamily(
                "gateway_shared_state_outages",
                "Times the shared state (Redis) became unreachable",
                value=outages,
            ),
            CounterMetricFamily(
                "gateway_shared_fallback_admissions",
                "Requests admitted by this process's own limits while the shared state was unreachable",
                value=fallback,
            ),
        ]


class KeysCollector:
    def __init__(self, keys: KeysView) -> None:
        self._k = keys

    def describe(self):
        return self._families(0, 0)

    def collect(self):
        return self._families(self._k.stale_served, self._k.unavailable)

    @staticmethod
    def _families(stale, unavailable):
        return [
            CounterMetricFamily(
                "gateway_keys_stale_served",
                "Keys authenticated from the last known good while the key store could not answer",
                value=stale,
            ),
            CounterMetricFamily(
                "gateway_keys_store_unavailable",
                "Requests refused with a 503 because the key store could not answer",
                value=unavailable,
            ),
        ]


class LedgerCollector:
    def __init__(self, writer: LedgerView) -> None:
        self._w = writer

    def describe(self):
        return self._families(0, 0.0, 0, 0, 0, 0, 0)

    def collect(self):
        w = self._w
        return self._families(
            w.pending_rows, w.oldest_pending_s(), w.written, w.dropped, w.failed_flushes, w.spool_errors,
            w.replayed,
        )  # fmt: skip

    @staticmethod
    def _families(pending, oldest, written, dropped, failures, spool_errors, replayed):
        return [
            GaugeMetricFamily("gateway_ledger_pending_rows", "Ledger rows not yet written", value=pending),
            GaugeMetricFamily(
                "gateway_ledger_oldest_pending_seconds",
                "Age of the oldest unwritten ledger row",
                value=oldest,
            ),
            CounterMetricFamily("gateway_ledger_written_rows", "Ledger rows written", value=written),
            CounterMetricFamily(
                "gateway_ledger_dropped_rows", "Ledger rows refused for their data and dropped", value=dropped
            ),
            CounterMetricFamily(
                "gateway_ledger_flush_failures", "Ledger flushes that failed (rows kept)", value=failures
            ),
            CounterMetricFamily(
                "gateway_ledger_spool_errors", "Ledger rows the spool could not write", value=spool_errors
            ),
            CounterMetricFamily(
                "gateway_ledger_replayed_rows",
                "Rows of a previous process written from the spool",
                value=replayed,
            ),
        ]
