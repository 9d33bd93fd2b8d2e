"""Connecting to Ray: start a local one (the embedded default) or join an existing cluster.

Joining checks the address first (a TCP connect bounded by `PROBE_S`), so an unreachable head fails in
seconds with one line naming it instead of Ray's two-minute retry loop. Ray 2.60 clusters started with
`ray start --head` use token authentication when a token exists; the farm then sends the token it can
find (`RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`), as `ray.init()` does for
a local cluster. `RAY_AUTH_MODE` set explicitly (`token` or `disabled`) always wins. Every failure to
connect is a `ClusterConnectError`, a local start that fails or times out included (the job runner turns
it into the farm's InfrastructureError: one line, exit 4).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

PROBE_S = 5.0  # the TCP check of a joined head's address
AUTH_MODE = "RAY_AUTH_MODE"
WORKER_NICENESS = "RAY_worker_niceness"  # Ray's own setting (15 by default): see start_local
TOKEN_FIX = (
    "set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) to the cluster's token "
    "(`ray get-auth-token` on the head prints it)"
)


class ClusterConnectError(RuntimeError):
    """Ray could not be started or joined; the message is one line that names the address and the fix."""


@dataclass
class ClusterPlan:
    """How many workers run where, and whether each owns a GPU."""

    address: str  # "local" or the address joined
    gpu: bool  # True: one actor per GPU (num_gpus=1). False: CPU slots.
    workers: int
    cuda: bool  # the cluster's GPUs are real devices (logical GPUs declared on a CPU box are not)
    nodes: list[dict[str, Any]]
    threads_per_worker: int | None
    note: str
    # GPUs per accelerator type as the nodes declare it (Ray's `accelerator_type:<type>`); None: nodes
    # that declare none. Empty without GPUs.
    gpu_types: dict[str | None, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["gpu_types"] = {t or "untyped": n for t, n in self.gpu_types.items()}  # JSON keys are strings
        return out


def _cuda_count() -> int:
    """CUDA devices on this host. Without a device node of NVIDIA's driver (WSL2's /dev/dxg included)
    there are none, and torch (about 1.3 s to import) stays out of a driver that never times anything."""
    if not any(Path(node).exists() for node in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg")):
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _init_kwargs() -> dict[str, Any]:
    # Ray's own RAY_TMPDIR decides where its session files go (tests point it at a folder they remove).
    return {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}


def start_local(num_gpus: int, num_cpus: int) -> None:
    """Start a local Ray (the embedded default) whose workers time at normal priority.

    Ray starts its worker processes at niceness 15 (`RAY_worker_niceness`) so that its own daemons stay
    responsive. A timing worker at 15 gets about 3% of a core beside one busy process at 0: on a shared
    machine its CPU timings would measure the neighbours, not the kernel, and a sweep that takes a
    minute when the machine is idle takes half an hour. Unless the operator set it, the farm's own local
    Ray starts its workers at 0 (a joined cluster keeps its own setting; the worker raises itself back to
    0 where the OS allows it, see cluster.worker)."""
    os.environ.setdefault(WORKER_NICENESS, "0")
    try:
        ray.init(num_gpus=num_gpus, num_cpus=num_cpus, **_init_kwargs())
    except Exception as err:  # noqa: BLE001 - whatever Ray raised (a start that timed out raises Exception)
        if isinstance(err, OSError) and err.filename:
            raise  # a session folder that cannot be made: the CLI names the file and the fix
        _stop_partial_start()
        raise ClusterConnectError(
            f"cannot start a local Ray: {first_line(err).rstrip('.')}; a loaded machine can make its "
            "start time out: run this again when the machine is quieter, or join a running cluster with "
            "--address (FARM_RAY_ADDRESS)"
        ) from err


def _stop_partial_start() -> None:
    """Stop what a failed ray.init of this process started (its GCS, raylet), if anything: only this
    process's own local Ray (never `ray stop`, which would stop every Ray on the machine)."""
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001, S110 - best effort: the start already failed and is reported
        pass


def connect(
    address: str | None = None,
    gpus: int | None = None,
    *,
    oversubscribe: bool = False,
    timeout_s: float = 25.0,
) -> ClusterPlan:
    """Start or join Ray and decide the worker layout.

    Local: `gpus` logical GPUs are declared (default: the CUDA devices present). With GPUs (real or
    logical) one worker is pinned to each; with none, `gpus` (default: the CPU count) CPU workers.
    Joined: one worker per GPU in the cluster, at most `gpus`; CPU workers if it has no GPUs.
    Without real GPUs the workers time on CPU cores: more workers than the cluster's cores would time
    each other's contention, so they are cut to the core count (and the note says so) unless
    `oversubscribe`. Joining a cluster that does not answer within `timeout_s` (or refuses the token)
    raises ClusterConnectError.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        where = "existing"
        cuda = _cluster_has_real_gpus() or _cuda_count() > 0
    elif address:
        _join(address, timeout_s)
        where = address
        cuda = _cluster_has_real_gpus()
    else:
        local_cuda = _cuda_count()
        start_local(
            num_gpus=local_cuda if gpus is None else (min(gpus, local_cuda) if local_cuda else gpus),
            num_cpus=os.cpu_count() or 1,
        )
        where = "local"
        cuda = local_cuda > 0
    try:
        return _plan(where, gpus, cuda, oversubscribe)
    except Exception as err:  # noqa: BLE001 - Ray's GCS did not answer the resource query
        raise ClusterConnectError(
            f"the Ray cluster ({where}) did not report its nodes and resources: {first_line(err)}; "
            "run this again, or check the cluster (`ray status`)"
        ) from err


def workers_now(plan: ClusterPlan, gpus: int | None, *, oversubscribe: bool = False) -> int:
    """The workers `plan`'s cluster has room for now, by the rule `connect` planned with: a pool that
    stays up follows nodes that joined (or came back) since. Ray must be connected."""
    return _plan(plan.address, gpus, plan.cuda, oversubscribe).workers


def gpu_types_now(
    plan: ClusterPlan, gpus: int | None, *, oversubscribe: bool = False
) -> dict[str | None, int]:
    """As `workers_now`, per GPU type."""
    return _plan(plan.address, gpus, plan.cuda, oversubscribe).gpu_types


def _plan(where: str, gpus: int | None, cuda: bool, oversubscribe: bool) -> ClusterPlan:
    resources = ray.cluster_resources()
    nodes = [
        {
            "node_id": n["NodeID"],
            "address": n["NodeManagerAddress"],
            "gpus": int(n["Resources"].get("GPU", 0)),
            "cpus": int(n["Resources"].get("CPU", 0)),
            "gpu_type": accelerator_type(n["Resources"]),
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]
    types: dict[str | None, int] = {}
    for n in nodes:
        if n["gpus"]:
            types[n["gpu_type"]] = types.get(n["gpu_type"], 0) + n["gpus"]
    total_gpus = int(resources.get("GPU", 0))
    total_cpus = int(resources.get("CPU", 0)) or (os.cpu_count() or 1)
    if total_gpus and cuda:
        workers = min(total_gpus, gpus) if gpus else total_gpus
        note = f"{workers} GPU workers (one per GPU) on {len(nodes)} node(s)"
        if any(types):
            note += " (" + ", ".join(f"{n} {t or 'untyped'}" for t, n in sorted(types.items(), key=str)) + ")"
        return ClusterPlan(where, True, workers, True, nodes, None, note, _cut(types, workers))
    wanted = (min(total_gpus, gpus) if gpus else total_gpus) if total_gpus else (gpus or total_cpus)
    workers = wanted if oversubscribe else min(wanted, total_cpus)
    threads = max(1, total_cpus // workers)
    kind = "logical GPU workers run on the CPU" if total_gpus else "CPU workers"
    why = "no CUDA device" if total_gpus else "no GPU in the cluster"
    note = (
        f"{why}: {workers} {kind}, {len(nodes)} node(s), {threads} torch thread(s) each; "
        "timings are CPU timings"
    )
    if workers < wanted:
        note += (
            f" (asked for {wanted} workers, the cluster has {total_cpus} CPU core(s): more timing "
            "workers than cores would time each other; --oversubscribe to run them all)"
        )
    elif workers > total_cpus:
        note += f" (oversubscribed: {workers} workers share {total_cpus} CPU core(s); timings are contended)"
    return ClusterPlan(where, bool(total_gpus), workers, False, nodes, threads, note, _cut(types, workers))


def accelerator_type(resources: dict[str, Any]) -> str | None:
    """The GPU type a node declares (`accelerator_type:H100` -> "H100"), or None."""
    return next((k.split(":", 1)[1] for k in sorted(resources) if k.startswith("accelerator_type:")), None)


def _cut(types: dict[str | None, int], workers: int) -> dict[str | None, int]:
    """At most `workers` in all, taken from the types in turn (so each type keeps some while it can)."""
    out: dict[str | None, int] = {}
    left = dict(types)
    while sum(out.values()) < workers and any(left.values()):
        for t in sorted(left, key=str):
            if left[t] and sum(out.values()) < workers:
                out[t], left[t] = out.get(t, 0) + 1, left[t] - 1
    return out


def _cluster_has_real_gpus() -> bool:
    """Ray declares `accelerator_type:<model>` on nodes whose GPUs it detected; `--num-gpus N` on a
    CPU-only node (logical GPUs) declares none. Decided by the cluster, not by this driver's devices."""
    return any(key.startswith("accelerator_type:") for key in ray.cluster_resources())


# ---- joining a cluster ------------------------------------------------------------------------------
def _join(address: str, timeout_s: float) -> None:
    if address != "auto" and not address.startswith("ray://"):
        _probe(address)
    token = _use_token_if_available()
    box: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(address=address, **_init_kwargs())
            box["error"] = None
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread (SystemExit included)
            box["error"] = err

    # ray.init retries in C++ for minutes and prints a line per retry: it runs in a thread so that this
    # one stays free to take SIGTERM and to give up at the deadline, with its output kept aside.
    deadline = time.monotonic() + timeout_s
    refused = False
    with _stderr_kept() as kept:
        thread = threading.Thread(target=init, name="ray-join", daemon=True)
        thread.start()
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.2)
            refused = "InvalidAuthToken" in kept.text()  # Ray would retry it for 20 s: no need
            if refused:
                break
    if refused:
        box["error"] = ConnectionError("InvalidAuthToken")
    elif thread.is_alive():
        raise ClusterConnectError(
            f"cannot join the Ray cluster at {address}: no answer within {timeout_s:g} s; "
            "check the address and that the head's GCS port is open"
        )
    error = box.get("error")
    if error is None:
        return
    text = kept.text()
    if "InvalidAuthToken" in text or "uthenticat" in type(error).__name__ + str(error):
        tried = f"the token from {token} was refused" if token else "no token found"
        raise ClusterConnectError(
            f"cannot join the Ray cluster at {address}: it requires token authentication and {tried}; "
            f"{TOKEN_FIX}"
        )
    raise ClusterConnectError(f"cannot join the Ray cluster at {address}: {first_line(error)}")


def _probe(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterConnectError(
            f"bad Ray address {address!r}: expected HOST:PORT (e.g. 10.0.0.5:6379) or auto"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S):
            pass
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise ClusterConnectError(
            f"cannot reach the Ray cluster at {address}: {reason}; "
            "check the address and that `ray start --head` runs there"
        ) from None


def _use_token_if_available() -> str | None:
    """Where the token comes from, when one is found and RAY_AUTH_MODE is unset (then set to `token`, as
    Ray does for a local cluster); None when there is no token or the mode is set explicitly."""
    if os.environ.get(AUTH_MODE) is not None:
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        source = "RAY_AUTH_TOKEN"
    elif os.environ.get("RAY_AUTH_TOKEN_PATH") and Path(os.environ["RAY_AUTH_TOKEN_PATH"]).is_file():
        source = os.environ["RAY_AUTH_TOKEN_PATH"]
    elif (Path.home() / ".ray" / "auth_token").is_file():
        source = str(Path.home() / ".ray" / "auth_token")
    else:
        return None
    os.environ[AUTH_MODE] = "token"
    from ray._raylet import Config  # Ray caches its config: re-read it so this process sees token mode

    Config.initialize("")
    return source


class _stderr_kept:
    """Send file descriptor 2 (Ray's C++ logging and Python's alike) to a temp file while inside."""

    def __enter__(self) -> _stderr_kept:
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc: Any) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)

    def text(self) -> str:
        """What was written so far (the file stays open: a thread may still write to it)."""
        with open(self.file.fileno(), "rb", closefd=False) as f:
            f.seek(0)
            return f.read().decode(errors="replace")


def first_line(err: BaseException) -> str:
    """An error's first line (its type's name when it says nothing): what a one-line message quotes."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()
