"""The pool's driver as a Ray job (`farm pool start`): submitted through the head's job API (Ray's
JobSubmissionClient, the dashboard's HTTP port), so it runs on the cluster, not on the laptop that started
it, and outlives it; stopped and read back through the same API.

The entrypoint is the farm's own command (`farm pool serve --address auto ...`): the cluster's nodes have
the farm installed (its workers import it), and Ray sets RAY_ADDRESS for the entrypoint, which `auto`
joins. Kernel source is not sent here: each queued job carries its own (cluster.shipping).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from cluster.session import ClusterConnectError

POOL_KIND = "farm-pool"  # the metadata "kind" of the Ray jobs this module submits


@dataclass(frozen=True)
class PoolJob:
    """A pool driver submitted to a cluster: Ray's submission id, its status (PENDING, RUNNING, STOPPED,
    SUCCEEDED, FAILED) and Ray's message about it."""

    submission_id: str
    status: str
    message: str
    entrypoint: str


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")


def _client(dashboard: str):
    from ray.job_submission import JobSubmissionClient

    url = dashboard if "://" in dashboard else f"http://{dashboard}"
    try:
        return JobSubmissionClient(url)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError or a bare Exception
        raise ClusterConnectError(
            f"cannot reach the Ray job API at {url}: {_first_line(err)}; start the head with its dashboard "
            "(`ray start --head --dashboard-host 0.0.0.0`, ray[default]) and pass its URL (port 8265 by "
            "default)"
        ) from err


def start_pool(dashboard: str, serve_args: list[str], *, farm: str = "farm") -> str:
    """Submit `farm pool serve --address auto SERVE_ARGS` as a Ray job; its submission id."""
    entrypoint = shlex.join([farm, "pool", "serve", "--address", "auto", *serve_args])
    return _client(dashboard).submit_job(entrypoint=entrypoint, metadata={"kind": POOL_KIND})


def pool_jobs(dashboard: str) -> list[PoolJob]:
    """The pool drivers this cluster knows of, oldest first (finished ones included, as Ray keeps them)."""
    return _pool_jobs(_client(dashboard))


def _pool_jobs(client) -> list[PoolJob]:
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("kind") == POOL_KIND]
    jobs.sort(key=lambda j: j.start_time or 0)
    return [PoolJob(j.submission_id or "", str(j.status.value), j.message or "", j.entrypoint) for j in jobs]


def stop_pool(dashboard: str, submission_id: str) -> bool:
    """Ask Ray to stop the pool driver `submission_id` (its workers' running trials go back to the queue);
    False when it had already ended. KeyError: no such pool job on this cluster."""
    client = _client(dashboard)
    known = {j.submission_id for j in _pool_jobs(client)}
    if submission_id not in known:
        raise KeyError(submission_id)
    return bool(client.stop_job(submission_id))


def pool_logs(dashboard: str, submission_id: str) -> str:
    """What the pool driver printed so far."""
    return _client(dashboard).get_job_logs(submission_id)
