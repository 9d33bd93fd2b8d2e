"""Static resources of a compiled Triton kernel, theoretical occupancy, optional Nsight Compute metrics.

`occupancy()` is the occupancy-calculator arithmetic with the SM90 (Hopper) limits: resident blocks per SM
are the minimum of what registers, shared memory, warps and the block cap allow.
  registers  a warp's registers are allocated in units of 256: ceil(regs x 32 / 256) x 256 per warp;
             warps that fit = floor(65536 / that), blocks = floor(warps that fit / warps per block);
  shared     each block takes its shared memory rounded up to 128 B plus 1 KB reserved by the system,
             out of 228 KB per SM; a block may use at most 227 KB;
  warps      64 per SM;  blocks  32 per SM;  threads per block at most 1024; regs per thread at most 255.
"""

from __future__ import annotations

import csv
import io
import math
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SMLimits:
    name: str = "sm90"
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_regs_per_block: int = 65536
    reg_alloc_unit: int = 256  # registers, allocated per warp
    smem_per_sm: int = 228 * 1024
    max_smem_per_block: int = 227 * 1024
    smem_reserved_per_block: int = 1024
    smem_alloc_unit: int = 128
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    warp_size: int = 32


H100 = SMLimits()  # H100 / H800 / H200 share the SM90 per-SM limits


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(
    regs_per_thread: int, smem_per_block: int, num_warps: int, limits: SMLimits = H100
) -> dict[str, Any]:
    """Theoretical occupancy of a kernel. Raises ValueError for a block that cannot launch at all."""
    if num_warps < 1 or regs_per_thread < 0 or smem_per_block < 0:
        raise ValueError(
            f"bad kernel resources: regs={regs_per_thread} smem={smem_per_block} warps={num_warps}"
        )
    if regs_per_thread > limits.max_regs_per_thread:
        raise ValueError(f"{regs_per_thread} registers per thread > {limits.max_regs_per_thread}")
    if num_warps * limits.warp_size > limits.max_threads_per_block:
        raise ValueError(f"{num_warps} warps = {num_warps * limits.warp_size} threads per block > 1024")
    if smem_per_block > limits.max_smem_per_block:
        raise ValueError(f"{smem_per_block} B shared memory per block > {limits.max_smem_per_block} B")

    regs_per_warp = _round_up(max(regs_per_thread, 1) * limits.warp_size, limits.reg_alloc_unit)
    if regs_per_warp * num_warps > limits.max_regs_per_block:
        raise ValueError(f"{regs_per_warp * num_warps} registers per block > {limits.max_regs_per_block}")
    smem_alloc = _round_up(smem_per_block, limits.smem_alloc_unit) + limits.smem_reserved_per_block

    by = {
        # the register file is split over 4 sub-partitions (SMSPs); a warp's registers live in one
        "registers": ((limits.regs_per_sm // 4) // regs_per_warp * 4) // num_warps,
        "shared_memory": limits.smem_per_sm // smem_alloc,
        "warps": limits.max_warps_per_sm // num_warps,
        "blocks": limits.max_blocks_per_sm,
    }
    blocks = min(by.values())
    limiter = min(by, key=lambda k: by[k])  # first of the tied ones, in the order above
    active_warps = blocks * num_warps
    return {
        "blocks_per_sm": blocks,
        "active_warps_per_sm": active_warps,
        "occupancy": active_warps / limits.max_warps_per_sm,
        "limiter": limiter,
        "blocks_by": by,
        "regs_per_thread": regs_per_thread,
        "regs_per_warp_allocated": regs_per_warp,
        "smem_per_block": smem_per_block,
        "smem_per_block_allocated": smem_alloc,
        "num_warps": num_warps,
        "limits": limits.name,
    }


def triton_resources(compiled: Any, limits: SMLimits = H100) -> dict[str, Any]:
    """Registers, spills, shared memory and warps of a compiled Triton kernel (the object a launch
    returns), with the theoretical occupancy. {"collected": False, "reason": ...} when unavailable
    (no compiled kernel, e.g. under TRITON_INTERPRET=1, or attributes not loaded)."""
    if compiled is None:
        return {"collected": False, "reason": "no compiled kernel (interpreter mode or launch returned None)"}
    n_regs = getattr(compiled, "n_regs", None)
    if n_regs is None and hasattr(compiled, "_init_handles"):
        try:  # Triton loads the binary (and learns n_regs / n_spills) lazily
            compiled._init_handles()
            n_regs = getattr(compiled, "n_regs", None)
        except Exception as exc:
            return {"collected": False, "reason": f"cannot load the compiled kernel: {exc}"}
    metadata = getattr(compiled, "metadata", None)
    shared = getattr(metadata, "shared", None)
    num_warps = getattr(metadata, "num_warps", None)
    if n_regs is None or shared is None or num_warps is None:
        return {"collected": False, "reason": "compiled kernel lacks n_regs / metadata.shared / num_warps"}
    out: dict[str, Any] = {
        "collected": True,
        "name": getattr(compiled, "name", None),
        "n_regs": int(n_regs),
        "n_spills": int(getattr(compiled, "n_spills", 0) or 0),
        "shared_bytes": int(shared),
        "num_warps": int(num_warps),
        "num_stages": getattr(metadata, "num_stages", None),
    }
    try:
        out["occupancy"] = occupancy(int(n_regs), int(shared), int(num_warps), limits)
    except ValueError as exc:
        out["occupancy"] = {"error": str(exc)}
    return out


# -- Nsight Compute ----------------------------------------------------------------------------------------

NCU_METRICS: dict[str, str] = {
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "smem_bank_conflicts_ld",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "smem_bank_conflicts_st",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
}


def ncu_command(
    target_argv: list[str],
    *,
    kernel_name: str | None = None,
    launch_skip: int = 0,
    launch_count: int = 1,
    metrics: list[str] | None = None,
    ncu: str = "ncu",
) -> list[str]:
    """The ncu command line profiling `target_argv` (a program that launches the kernel), CSV output."""
    cmd = [ncu, "--csv", "--metrics", ",".join(metrics or list(NCU_METRICS))]
    if kernel_name:
        cmd += ["--kernel-name", f"regex:{kernel_name}"]
    cmd += ["--launch-skip", str(launch_skip), "--launch-count", str(launch_count)]
    return cmd + list(target_argv)


def parse_ncu_csv(text: str) -> dict[str, Any]:
    """Parse `ncu --csv` output (one row per kernel launch and metric). Values of the same metric over
    several launches are averaged. Lines before the CSV header (==PROF== messages) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {"collected": False, "reason": "no CSV table in the ncu output"}
    values: dict[str, list[float]] = {}
    kernels: set[str] = set()
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        name, raw = row.get("Metric Name"), row.get("Metric Value")
        if not name or raw is None:
            continue
        try:
            value = float(raw.replace(",", ""))
        except ValueError:
            continue
        values.setdefault(NCU_METRICS.get(name, name), []).append(value)
        kernels.add(row.get("Kernel Name", ""))
    if not values:
        return {"collected": False, "reason": "ncu output had no metric values"}
    out: dict[str, Any] = {k: math.fsum(v) / len(v) for k, v in values.items()}
    out.update(collected=True, kernels=sorted(k for k in kernels if k))
    return out


def collect_ncu(
    target_argv: list[str],
    *,
    enabled: bool,
    kernel_name: str | None = None,
    timeout_s: float = 600.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ncu when asked (policy.ncu) and on PATH; otherwise say why it was not collected."""
    if not enabled:
        return {"collected": False, "reason": "not requested (measure policy ncu: false)"}
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"collected": False, "reason": "ncu (Nsight Compute) is not on PATH"}
    cmd = ncu_command(target_argv, kernel_name=kernel_name, ncu=ncu, **kwargs)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"collected": False, "reason": f"ncu timed out after {timeout_s} s"}
    if proc.returncode != 0:
        return {"collected": False, "reason": f"ncu exited {proc.returncode}: {proc.stderr[-500:]}"}
    return parse_ncu_csv(proc.stdout)
