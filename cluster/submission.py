"""The pool's driver as a Ray job (`farm pool start`): submitted through the head's job API (Ray's
JobSubmissionClient, the dashboard's HTTP port), so it runs on the cluster, not on the laptop that started
it, and outlives it; stopped and read back through the same API.

The entrypoint is the farm's own command (`farm pool serve --address auto ...`): the cluster's nodes have
the farm installed (its workers import it), and Ray sets RAY_ADDRESS for the entrypoint, which `auto`
joins. Kernel source is not sent here: each queued job carries its own (cluster.shipping).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from cluster.session import ClusterConnectError, first_line

POOL_KIND = "farm-pool"  # the metadata "kind" of the Ray jobs this module submits
# A head that has just started may not have its job agent up yet: Ray answers 500 "No available agent to
# submit job, please try again later". Submitting is retried that long, with backoff.
AGENT_WAIT_S = 60.0


@dataclass(frozen=True)
class PoolJob:
    """A pool driver submitted to a cluster: Ray's submission id, its status (PENDING, RUNNING, STOPPED,
    SUCCEEDED, FAILED) and Ray's message about it."""

    submission_id: str
    status: str
    message: str
    entrypoint: str


def _client(dashboard: str):
    from ray.job_submission import JobSubmissionClient

    url = dashboard if "://" in dashboard else f"http://{dashboard}"
    try:
        return JobSubmissionClient(url)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError or a bare Exception
        raise ClusterConnectError(
            f"cannot reach the Ray job API at {url}: {first_line(err).rstrip('.')}; start the head with its "
            "dashboard (`ray start --head --dashboard-host 0.0.0.0`, ray[default]) and pass its URL "
            "(port 8265 by default)"
        ) from err


def start_pool(dashboard: str, serve_args: list[str], *, farm: str = "farm") -> str:
    """Submit `farm pool serve --address auto SERVE_ARGS` as a Ray job; its submission id."""
    entrypoint = shlex.join([farm, "pool", "serve", "--address", "auto", *serve_args])
    client = _client(dashboard)
    deadline, pause = time.monotonic() + AGENT_WAIT_S, 0.25
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint, metadata={"kind": POOL_KIND})
        except RuntimeError as err:  # Ray's job API answered with an error status
            no_agent = "No available agent" in str(err)
            if no_agent and time.monotonic() + pause <= deadline:
                time.sleep(pause)
                pause = min(2 * pause, 2.0)
                continue
            hint = ""
            if no_agent:
                hint = (
                    f" (for {AGENT_WAIT_S:g} s: is the head's job agent port, --dashboard-agent-listen-port, "
                    "held by another Ray on that host?)"
                )
            raise ClusterConnectError(
                f"the Ray job API at {dashboard} did not take the pool: {first_line(err)}{hint}"
            ) from err


def pool_jobs(dashboard: str) -> list[PoolJob]:
    """The pool drivers this cluster knows of, oldest first (finished ones included, as Ray keeps them)."""
    return _pool_jobs(_client(dashboard))


def _pool_jobs(client) -> list[PoolJob]:
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("kind") == POOL_KIND]
    jobs.sort(key=lambda j: j.start_time or 0)
    return [PoolJob(j.submission_id or "", str(j.status.value), j.message or "", j.entrypoint) for j in jobs]


def _known(client, submission_id: str) -> None:
    """KeyError unless `submission_id` is a pool job of this cluster."""
    if submission_id not in {j.submission_id for j in _pool_jobs(client)}:
        raise KeyError(submission_id)


def stop_pool(dashboard: str, submission_id: str) -> bool:
    """Ask Ray to stop the pool driver `submission_id` (its workers' running trials go back to the queue);
    False when it had already ended. KeyError: no such pool job on this cluster."""
    client = _client(dashboard)
    _known(client, submission_id)
    return bool(client.stop_job(submission_id))


def pool_logs(dashboard: str, submission_id: str) -> str:
    """What the pool driver printed so far. KeyError: no such pool job on this cluster."""
    client = _client(dashboard)
    _known(client, submission_id)
    return client.get_job_logs(submission_id)
