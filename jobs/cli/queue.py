"""The farm as a team service: `farm submit` (queue a sweep and return), `farm pool serve` (the warm
workers that serve the queue), `farm jobs cancel` and `farm jobs wait` (for CI: its exit code is the
verdict). The queue and the pool are jobs.queue."""

from __future__ import annotations

import sys
import time
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

import click

from jobs.cli.common import (
    address_option,
    db_option,
    echo,
    gpus_option,
    output_option,
    require_job,
    store_for,
    writable_output,
)
from jobs.errors import EXIT_INTERRUPTED, EXIT_NO_WORKERS, BadInput, InfrastructureError
from jobs.store.schema import display_url

WAIT_POLL_S = 0.5
FINAL = {
    "completed": None,
    "failed": EXIT_NO_WORKERS,
    "interrupted": EXIT_INTERRUPTED,
    "cancelled": EXIT_INTERRUPTED,
}


@click.command("submit")
@click.argument("spec_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--priority", type=int, default=0, show_default=True, help="higher goes first (CI: e.g. 10)")
@click.option("--owner", default=None, help="who asked (default: $USER)")
@click.option(
    "--project", default=None, help="the project charged, when the pool's config places the owner in none"
)
@click.option("--notify", default=None, help="a webhook URL told the verdict (Slack-compatible JSON)")
@click.option("--yes", is_flag=True, help="accept a grid larger than --max-trials")
@click.option("--max-trials", type=click.IntRange(min=1), default=100_000, show_default=True)
@db_option
def submit(
    spec_path: Path,
    priority: int,
    owner: str | None,
    notify: str | None,
    yes: bool,
    max_trials: int,
    db: str | None,
    project: str | None,
) -> None:
    """Queue a sweep for the pool and print its job id at once (`farm jobs wait ID` for the verdict)."""
    from cluster.shipping import pack_kernels
    from jobs.cli.sweep import _load
    from jobs.queue.queue import Queue
    from jobs.run.source import kernels_source

    if notify is not None and not notify.startswith(("http://", "https://")):
        raise BadInput(f"--notify {notify!r}: expected an http(s):// URL")
    spec = _load(spec_path, yes, max_trials)
    try:
        packed = pack_kernels()
    except ValueError as e:
        raise BadInput(str(e)) from None
    store = store_for(db, create=True)
    queue = Queue(store)
    _check_gpu(spec, queue)
    job_id = queue.submit(
        spec, priority=priority, owner=owner, source=kernels_source(), packed=packed, notify=notify,
        project=project,
    )  # fmt: skip
    line = next((line for line in queue.lines() if line.job.id == job_id), None)
    click.echo(job_id)
    echo(
        f"job {job_id}: {spec.name} queued at priority {priority}, place {line and line.place} "
        f"({spec.count_trials()} trials)" + (f"; waiting: {line.waiting}" if line and line.waiting else "")
    )
    if not queue.alive_pools():
        where = display_url(store.url)
        echo(
            f"no pool serves {where} now: start one with `farm pool start --db {where}` (on the cluster) "
            f"or `farm pool serve --db {where}`"
        )


def _check_gpu(spec, queue) -> None:
    """Refuse at once a job whose GPU need no worker of the live pools can meet, naming the types there.
    With no pool alive nothing is known: the job waits, and `farm jobs list` says what it needs."""
    from jobs.queue.fairshare import JobState, fits

    served = queue.served()
    if spec.gpu is None or not served.gpu_types:
        return
    need = JobState(0, "", 0, 0.0, 1, gpu_type=spec.gpu.type, min_memory_gb=spec.gpu.min_memory_gb)
    if any(fits(need, t, served.policy) for t in served.gpu_types):
        return
    present = ", ".join(
        f"{n} x {t}" + (f" ({served.policy.memory_gb(t):g} GB)" if served.policy.memory_gb(t) else "")
        if t
        else f"{n} without a declared type"
        for t, n in sorted(served.gpu_types.items(), key=str)
    )
    wanted = " ".join(
        filter(None, [spec.gpu.type, spec.gpu.min_memory_gb and f">= {spec.gpu.min_memory_gb:g} GB"])
    )
    raise BadInput(
        f"{spec.name}: gpu needs {wanted}, which no worker of the cluster's pools has (present: {present}); "
        "change the spec's gpu: or submit where such GPUs are"
    )


def pool_options(command):
    """The options a pool runs with, whether served here (`pool serve`) or on the cluster (`pool start`)."""
    idle_exit = click.option(
        "--idle-exit", type=float, default=None, help="stop after this many seconds with nothing to do"
    )
    oversubscribe = click.option(
        "--oversubscribe", is_flag=True, help="on CPU, more timing workers than the cluster has cores"
    )
    config = click.option(
        "--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=None,
        help="the pool's config: owners' and projects' weights, quotas, half-life, max wait (README)",
    )  # fmt: skip
    preempt = click.option(
        "--preempt",
        is_flag=True,
        help="stop a running trial of a job with less right to its worker (requeued)",
    )
    for option in (
        preempt,
        config,
        oversubscribe,
        idle_exit,
        db_option,
        gpus_option,
    ):  # applied last to first
        command = option(command)
    return command


@click.group("pool")
def pool() -> None:
    """The warm workers that serve the queue of `farm submit`."""


def read_policy(config: Path | None, preempt: bool):
    """The pool's policy from its config file (the default without one); `--preempt` turns preemption on.
    A bad file is bad input: one line per problem, naming the file and the field."""
    from jobs.queue.policy import InvalidPolicy, Policy, Preemption, load_policy

    try:
        policy = load_policy(config) if config is not None else Policy()
    except InvalidPolicy as err:
        raise BadInput(str(err)) from None
    if preempt:
        rule = policy.preempt.model_dump() | {"enabled": True}
        policy = policy.model_copy(update={"preempt": Preemption(**rule)})
    return policy


@pool.command("serve")
@address_option
@pool_options
def pool_serve(
    address: str | None,
    gpus: int | None,
    db: str | None,
    idle_exit: float | None,
    oversubscribe: bool,
    config: Path | None,
    preempt: bool,
) -> None:
    """Serve queued jobs on this cluster's workers (fair share by owner and project, priority first,
    README "Sharing the cluster") until interrupted."""
    from jobs.queue.pool import PoolOptions, serve
    from jobs.run.runner import RunOptions
    from jobs.settings import FarmSettings

    policy = read_policy(config, preempt)
    run = RunOptions(address=address or FarmSettings().ray_address, gpus=gpus, show_progress=False, echo=echo,
                     oversubscribe=oversubscribe)  # fmt: skip
    try:
        done = serve(store_for(db, create=True), PoolOptions(run=run, idle_exit_s=idle_exit, policy=policy))
    except KeyboardInterrupt:
        echo("pool stopped: the trials it had taken go back to the queue")
        sys.exit(EXIT_INTERRUPTED)
    echo(f"pool stopped after {done} completed job(s)")


@pool.command("status")
@db_option
def pool_status(db: str | None) -> None:
    """The live pools' workers per GPU type, each owner's workers against its target share and quota use,
    and the waiting line with why each job waits."""
    from rich.table import Table

    from jobs.cli.common import console
    from jobs.queue.queue import Queue
    from jobs.queue.status import status

    store = store_for(db, create=False)
    now = status(Queue(store))
    out = console()
    if not now.pools:
        out.print("no pool serves this store now (`farm pool serve` or `farm pool start`)")
    for p in now.pools:
        types = ", ".join(f"{n} x {t} ({p.busy.get(t, 0)} busy)" for t, n in sorted(p.gpu_types.items()))
        out.print(f"pool {p.pool} on {p.host}: {types}")
    table = Table(title=f"owners ({now.workers} workers; target: weights and past usage, half-life "
                        f"{now.plan.policy.half_life / 3600:g} h)")  # fmt: skip
    for col in ("owner", "project", "workers", "by GPU type", "share", "target", "target workers",
                "usage (worker-h)", "waiting trials", "quota"):  # fmt: skip
        table.add_column(col)
    for r in now.owners:
        quota = [f"{r.running}/{r.worker_quota} workers" if r.worker_quota is not None else "",
                 f"{r.queued}/{r.queued_quota} queued" if r.queued_quota is not None else ""]  # fmt: skip
        by_type = ", ".join(f"{n} {t}" for t, n in sorted(r.by_type.items())) or "-"
        table.add_row(r.owner, r.project, str(r.running), by_type, f"{r.share:.0%}", f"{r.target:.0%}",
                      f"{r.target_workers:.1f}", f"{r.usage_s / 3600:.2f}", str(r.queued),
                      ", ".join(q for q in quota if q) or "-")  # fmt: skip
    out.print(table)
    waiting = queue_table(store)
    if waiting is not None:
        out.print(waiting)
    out.print(f"preemptions: {now.preemptions} ({now.preempted_s / 3600:.2f} worker-h lost)")


dashboard_option = click.option(
    "--dashboard",
    default=None,
    help="the Ray head's job API, e.g. http://HEAD:8265 (FARM_RAY_DASHBOARD)",
)


@contextmanager
def _job_api(submission_id: str | None = None):
    """A Ray job API that cannot be reached is an infrastructure error (exit 4, one line); a pool it does
    not know of, bad input (exit 2)."""
    from cluster.session import ClusterConnectError

    try:
        yield
    except ClusterConnectError as err:
        raise InfrastructureError(str(err)) from None
    except KeyError:
        raise BadInput(f"no pool {submission_id!r} on this cluster (`farm pool list` shows them)") from None


def _dashboard(dashboard: str | None) -> str:
    from jobs.settings import FarmSettings

    found = dashboard or FarmSettings().ray_dashboard
    if not found:
        raise BadInput(
            "--dashboard: the Ray head's job API is needed (e.g. http://HEAD:8265, or FARM_RAY_DASHBOARD)"
        )
    return found


@pool.command("start")
@dashboard_option
@pool_options
def pool_start(
    dashboard: str | None,
    gpus: int | None,
    db: str | None,
    idle_exit: float | None,
    oversubscribe: bool,
    config: Path | None,
    preempt: bool,
) -> None:
    """Run `farm pool serve` on the cluster as a Ray job (its driver lives on the head, not here); print
    its Ray submission id and return."""
    from cluster.submission import start_pool
    from jobs.settings import FarmSettings

    url = _dashboard(dashboard)
    store_url = db or FarmSettings().db
    if "://" not in store_url:  # an SQLite file: the head opens it by the same path, so make it absolute
        store_url = str(Path(store_url).resolve())
        echo(f"the pool on the cluster opens the SQLite store {store_url}: the head must see that path "
             "(a team uses PostgreSQL)")  # fmt: skip
    args = ["--db", store_url]
    args += [] if gpus is None else ["--gpus", str(gpus)]
    args += [] if idle_exit is None else ["--idle-exit", f"{idle_exit:g}"]
    args += ["--oversubscribe"] if oversubscribe else []
    args += ["--preempt"] if preempt else []
    if config is not None:
        read_policy(config, preempt)  # a bad config is refused here, not in the cluster's log
        args += ["--config", str(config.resolve())]  # the head opens it by this path
    with _job_api():
        submission = start_pool(url, args)
    click.echo(submission)
    echo(f"pool submitted to {url} as Ray job {submission}: `farm pool list` shows it, "
         f"`farm pool stop {submission}` stops it")  # fmt: skip


@pool.command("list")
@dashboard_option
def pool_list(dashboard: str | None) -> None:
    """The pools started on the cluster with `farm pool start`, and their Ray job status."""
    from cluster.submission import pool_jobs

    with _job_api():
        jobs = pool_jobs(_dashboard(dashboard))
    if not jobs:
        echo("no pool was started on this cluster with `farm pool start`")
    for job in jobs:
        click.echo(f"{job.submission_id}  {job.status:<9}  {job.entrypoint}")


@pool.command("stop")
@click.argument("submission_id")
@dashboard_option
def pool_stop(submission_id: str, dashboard: str | None) -> None:
    """Stop a pool started with `farm pool start`: the trials it had taken go back to the queue."""
    from cluster.submission import stop_pool

    with _job_api(submission_id):
        stopping = stop_pool(_dashboard(dashboard), submission_id)
    echo(f"pool {submission_id}: " + ("stopping" if stopping else "had already ended"))


@pool.command("logs")
@click.argument("submission_id")
@dashboard_option
def pool_logs_command(submission_id: str, dashboard: str | None) -> None:
    """What a pool started with `farm pool start` printed so far."""
    from cluster.submission import pool_logs

    with _job_api(submission_id):
        click.echo(pool_logs(_dashboard(dashboard), submission_id), nl=False)


@click.command("cancel")
@click.argument("job_id", type=int)
@db_option
def jobs_cancel(job_id: int, db: str | None) -> None:
    """Cancel a queued or running job: its trials not run leave the queue, finished results stay."""
    from jobs.queue.queue import WAITING, Queue

    store = store_for(db, create=False)
    require_job(store, job_id)
    before = Queue(store).cancel(job_id)
    if before in WAITING:
        echo(f"job {job_id}: cancelled (was {before}); a pool stops its running trials within a second")
    else:
        echo(f"job {job_id}: already {before}; left as it is")


@click.command("logs")
@click.argument("job_id", type=int)
@click.option("--follow", is_flag=True, help="keep printing until the job ends")
@db_option
def jobs_logs(job_id: int, follow: bool, db: str | None) -> None:
    """What happened to a queued job: taken, finished (status, worker, median), cancelled, completed."""
    from jobs.queue.queue import Queue

    store = store_for(db, create=False)
    require_job(store, job_id)
    queue, last = Queue(store), 0
    while True:
        ended = require_job(store, job_id).status in FINAL  # read first: the lines before it are all in
        for event in queue.events(job_id, after=last):
            click.echo(f"{event.at:%H:%M:%S} {event.line}")
            last = event.id
        if not follow or ended:
            return
        time.sleep(WAIT_POLL_S)  # the pool writes the store from another process: polled


@click.command("wait")
@click.argument("job_id", type=int)
@output_option("--junit", help="write the trials as a JUnit XML report (CI)")
@click.option("--timeout", type=float, default=None, help="give up after this many seconds (exit 4)")
@db_option
def jobs_wait(job_id: int, junit: Path | None, timeout: float | None, db: str | None) -> None:
    """Wait for a job to end; exit 0 passed, 1 a trial failed, 3 no worker, 130 interrupted or cancelled."""
    from jobs.run.verdict import exit_code_of

    if junit is not None:
        writable_output(junit)
    store = store_for(db, create=False)
    job = require_job(store, job_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    while job.status not in FINAL:
        if deadline is not None and time.monotonic() > deadline:
            raise InfrastructureError(f"job {job_id} is still {job.status} after {timeout:g} s")
        time.sleep(WAIT_POLL_S)  # another process writes the store: nothing here to wait on but it
        job = require_job(store, job_id)
    counts = store.status_counts(job_id)
    code = FINAL[job.status]
    code = exit_code_of(counts) if code is None else code
    if junit is not None:
        _write_junit(store, job_id, junit)
        echo(f"wrote {junit}")
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    echo(f"job {job_id}: {job.status} ({summary}); exit {code}")
    sys.exit(code)


def _write_junit(store, job_id: int, path: Path) -> None:
    """One testcase per trial: a failure for a trial that failed, skipped for one not run."""
    from kernels.base import TrialStatus, trial_label

    trials = store.trials(job_id)
    suite = ET.Element("testsuite", name=f"farm job {job_id}", tests=str(len(trials)))
    failures = skipped = 0
    for t in trials:
        case = ET.SubElement(suite, "testcase", classname=f"{t.family}.{t.backend}",
                             name=trial_label(t.backend, t.shape, t.config, t.dtype, seq=t.seq))  # fmt: skip
        status = TrialStatus(t.status)
        if status.failed or status is TrialStatus.PENDING:
            failures += 1
            first = (t.error or "").strip().splitlines()[:1]
            ET.SubElement(case, "failure", message=f"{t.status}: {first[0] if first else 'no result'}")
        elif status.not_run:
            skipped += 1
            ET.SubElement(case, "skipped", message=t.error or str(t.status))
        if t.median_ns is not None:
            case.set("time", f"{t.median_ns / 1e9:.9f}")
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def queue_table(store, counted=None):
    """The queued and running jobs of the queue in the order they are served (`farm jobs list`), or None
    when the queue is empty; `counted`: job -> its trials by status, read already (not counted again)."""
    from rich.table import Table

    from jobs.queue.queue import Queue

    lines = Queue(store).lines(counted)
    if not lines:
        return None
    table = Table(title="queue (served by priority, then fair share by project and owner)")
    for col in (
        "job",
        "name",
        "owner",
        "project",
        "priority",
        "place",
        "progress",
        "running",
        "ETA",
        "waiting",
    ):
        table.add_column(col)
    for q in lines:
        eta = "-" if q.eta_s is None else f"{q.eta_s:.0f} s"
        place = "running" if q.place is None else str(q.place)
        table.add_row(str(q.job.id), q.job.name, q.owner, q.project or "-", str(q.priority), place,
                      f"{q.finished}/{q.total}", str(q.taken), eta, q.waiting or "-")  # fmt: skip
    return table
