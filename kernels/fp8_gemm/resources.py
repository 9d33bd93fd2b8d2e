"""The static resource model of one tile config on one shape: no GPU needed.

Shared memory (bytes; operands are fp8, 1 byte per element; scales fp32 at the scale group g, 128 by
default or 64):
  per stage      A tile block_m x block_k + B tile block_n x block_k
                 + A scales block_m x 4 + B scales ceil(block_n / g) x 4
  triton style   the A and B tiles are buffered in shared memory, the scales go to registers; Triton
                 keeps num_stages buffers when the dot is a wgmma (block_m >= 64) and num_stages - 1
                 with mma.sync (smaller block_m), so pipeline = buffers x (A tile + B tile);
                 epilogue = block_m x block_n x 2 (the bf16 output tile's layout-conversion scratch),
                 which Triton's liveness-based allocator overlaps with the dead pipeline buffers, so
                 total = max(pipeline, epilogue). Within 2% of sm_90a compiles of the shipped configs
                 (tests/kernels/test_compiled.py keeps it within 10%).
  deepgemm style pipeline (A, B, A scales) + the bf16 D tile block_m x block_n x 2 + all of B's K scales
                 (ceil(K / g) x 4, doubled when block_n does not divide g evenly into the scale
                 blocks) + 2 mbarriers (8 B each) per stage; all live together
  fits           total <= 227 KB (232448 B), the SM90 per-block limit
Waves (one CTA per SM, the DeepGEMM view): tiles = ceil(M/block_m) x ceil(N/block_n), waves =
  ceil(tiles / SMs), last-wave utilisation = tiles in the last wave / SMs; `waves_at_occupancy` counts
  SMs x resident CTAs per SM (from kernels.measure.resources.occupancy) instead.
Registers (an estimate, not a compiler result): the fp32 accumulator is acc = block_m x block_n /
  threads per thread; promoting a 128-wide partial sum into it keeps a second tile of that size live and
  the wgmma operands and scales add about half as much again: 3.5 x acc + REG_OVERHEAD, fitted to sm_90a
  compiles of the shipped wgmma configs (within 10%). The mma.sync tiles (block_m < 64) hold their
  operands in registers and need more than this says. Above 255 it spills ("spill_risk"): every
  shipped config over 255 here spills when compiled. kernels.compiled has the compiler's own figures.
DeepGEMM's SM90 space (`deepgemm_space`): block_m in {64, 128}, block_n 16..256 step 16, block_k 128, as
  many stages as fit in 227 KB (at least 3), cluster 1 or 2; `deepgemm_choice` applies its rule: fewest
  waves, then the best last-wave use.
Pruned (cannot run, with the reasons): a block_k that does not divide the scale group (a K step would
  straddle two scales), shared memory over 227 KB, a block over 1024 threads, or an estimate over 255
  registers per thread (it would spill).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from kernels.fp8_gemm.quant import GROUP, cdiv
from kernels.fp8_gemm.tiles import TileConfig
from kernels.hardware import HOPPER_SMS
from kernels.measure.resources import H100, SMLimits, occupancy

NUM_SMS = HOPPER_SMS
SMEM_LIMIT = H100.max_smem_per_block  # 227 KB
MAX_REGS = H100.max_regs_per_thread  # 255
REG_OVERHEAD = 16  # addresses, masks, loop counters (fitted with REG_PER_ACC, see the docstring)
REG_PER_ACC = 3.5  # registers per accumulator register: partial sum, operands, scales
BARRIER_BYTES = 8


def stage_bytes(block_m: int, block_n: int, block_k: int, scale_group: int = GROUP) -> dict[str, int]:
    """Shared memory of one pipeline stage, by part."""
    parts = {
        "a": block_m * block_k,
        "b": block_n * block_k,
        "a_scales": block_m * 4,
        "b_scales": cdiv(block_n, scale_group) * 4,
    }
    parts["stage"] = sum(parts.values())
    return parts


def deepgemm_smem(
    block_m: int, block_n: int, block_k: int, num_stages: int, k: int, *, scale_group: int = GROUP
) -> dict[str, Any]:
    """Shared memory of a DeepGEMM-style kernel (see the module docstring)."""
    g = scale_group
    per = block_m * block_k + block_n * block_k + block_m * 4
    b_scales = cdiv(k, g) * 4 * (1 if g % block_n == 0 or block_n % g == 0 else 2)
    d = block_m * block_n * 2
    barriers = num_stages * 2 * BARRIER_BYTES
    total = num_stages * per + d + b_scales + barriers
    return {
        "per_stage": per,
        "d": d,
        "b_scales": b_scales,
        "barriers": barriers,
        "total": total,
        "fits": total <= SMEM_LIMIT,
    }


def wave_stats(m: int, n: int, block_m: int, block_n: int, slots: int) -> dict[str, Any]:
    """Tiles and waves of the output over `slots` concurrent CTAs."""
    tiles_m, tiles_n = cdiv(m, block_m), cdiv(n, block_n)
    tiles = tiles_m * tiles_n
    waves = cdiv(tiles, slots)
    last = tiles - (waves - 1) * slots
    return {
        "tiles_m": tiles_m,
        "tiles_n": tiles_n,
        "tiles": tiles,
        "waves": waves,
        "last_wave_tiles": last,
        "last_wave_util": last / slots,
        "wave_efficiency": tiles / (waves * slots),  # share of the SM-waves doing useful tiles
    }


@dataclass
class ResourceEstimate:
    style: str
    config: dict[str, int]
    shape: dict[str, int]
    scale_group: int
    smem_per_stage: int
    smem_stage_parts: dict[str, int]
    smem_pipeline: int
    smem_epilogue: int
    smem_total: int
    smem_limit: int
    fits_smem: bool
    threads: int
    acc_regs_per_thread: float
    regs_estimate: int
    spill_risk: bool
    num_sms: int
    waves: dict[str, Any]
    occupancy: dict[str, Any] | None
    waves_at_occupancy: int | None
    reasons: list[str] = field(default_factory=list)

    @property
    def pruned(self) -> bool:
        return bool(self.reasons)

    def prune_message(self) -> str:
        return "pruned: " + "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pruned"] = self.pruned
        return d


def estimate(
    cfg: TileConfig,
    m: int,
    n: int,
    k: int,
    *,
    num_sms: int = NUM_SMS,
    limits: SMLimits = H100,
    style: str = "triton",
    scale_group: int = GROUP,
) -> ResourceEstimate:
    """The resource model of `cfg` on the GEMM m x n x k with scales at `scale_group` (see the module
    docstring)."""
    if style not in ("triton", "deepgemm"):
        raise ValueError(f"style must be 'triton' or 'deepgemm' (got {style!r})")
    parts = stage_bytes(cfg.block_m, cfg.block_n, cfg.block_k, scale_group)
    buffers = cfg.num_stages if cfg.block_m >= 64 else max(cfg.num_stages - 1, 1)
    pipeline = buffers * (parts["a"] + parts["b"])
    epilogue = cfg.block_m * cfg.block_n * 2
    if style == "triton":
        total = max(pipeline, epilogue)
    else:
        total = deepgemm_smem(
            cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages, k, scale_group=scale_group
        )["total"]
    threads = cfg.num_warps * limits.warp_size
    acc = cfg.block_m * cfg.block_n / threads
    regs = int(REG_PER_ACC * acc + REG_OVERHEAD)
    reasons = []
    if scale_group % cfg.block_k:
        reasons.append(
            f"block_k {cfg.block_k} does not divide the scale group {scale_group}: a K step would straddle "
            "two scales (take a block_k of at most the group)"
        )
    extra = "" if style == "triton" else " + D tile, B scales, barriers"
    if total > limits.max_smem_per_block:
        reasons.append(
            f"shared memory {total} B ({cfg.num_stages} stages of {parts['a'] + parts['b']} B tiles{extra}) "
            f"> {limits.max_smem_per_block} B (227 KB per block)"
        )
    if threads > limits.max_threads_per_block:
        reasons.append(f"{threads} threads per block > {limits.max_threads_per_block}")
    if regs > limits.max_regs_per_thread:
        reasons.append(
            f"an estimated {regs} registers per thread (a {acc:g}-register fp32 accumulator, "
            f"{cfg.block_m}x{cfg.block_n} over {threads} threads) > {limits.max_regs_per_thread}: "
            "it would spill"
        )
    occ: dict[str, Any] | None = None
    waves_occ: int | None = None
    if not reasons:
        try:
            occ = occupancy(min(regs, limits.max_regs_per_thread), total, cfg.num_warps, limits)
            waves_occ = wave_stats(m, n, cfg.block_m, cfg.block_n, num_sms * occ["blocks_per_sm"])["waves"]
        except ValueError as exc:
            reasons.append(f"occupancy: {exc}")
    return ResourceEstimate(
        style=style,
        config=cfg.to_dict(),
        shape={"m": m, "n": n, "k": k},
        scale_group=scale_group,
        smem_per_stage=parts["stage"],
        smem_stage_parts={k_: v for k_, v in parts.items() if k_ != "stage"},
        smem_pipeline=pipeline,
        smem_epilogue=epilogue,
        smem_total=total,
        smem_limit=limits.max_smem_per_block,
        fits_smem=total <= limits.max_smem_per_block,
        threads=threads,
        acc_regs_per_thread=acc,
        regs_estimate=regs,
        spill_risk=regs > limits.max_regs_per_thread,
        num_sms=num_sms,
        waves=wave_stats(m, n, cfg.block_m, cfg.block_n, num_sms),
        occupancy=occ,
        waves_at_occupancy=waves_occ,
        reasons=reasons,
    )


def prune(
    configs: list[TileConfig], m: int, n: int, k: int, **kwargs: Any
) -> tuple[list[ResourceEstimate], list[ResourceEstimate]]:
    """Split configs into (runnable, pruned) estimates; every pruned one keeps its reasons."""
    ests = [estimate(c, m, n, k, **kwargs) for c in configs]
    return [e for e in ests if not e.pruned], [e for e in ests if e.pruned]


@dataclass(frozen=True)
class DeepGemmCandidate:
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    cluster: int
    tiles: int
    waves: int
    last_wave_util: float
    smem_total: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def deepgemm_space(
    m: int,
    n: int,
    k: int,
    *,
    num_sms: int = 132,
    block_ms: Iterable[int] = (64, 128),
    block_ns: Iterable[int] = range(16, 257, 16),
    min_stages: int = 3,
    max_stages: int = 8,
) -> list[DeepGemmCandidate]:
    """DeepGEMM-like candidates for one shape, each with the most stages that fit (those with fewer than
    `min_stages` fitting are left out: DeepGEMM never runs them)."""
    out = []
    for bm, bn in itertools.product(block_ms, block_ns):
        stages = 0
        for s in range(max_stages, min_stages - 1, -1):
            if deepgemm_smem(bm, bn, GROUP, s, k)["fits"]:
                stages = s
                break
        if not stages:
            continue
        waves = wave_stats(m, n, bm, bn, num_sms)
        # TMA multicast of the shared operand across a 2-CTA cluster needs an even tile count along M.
        cluster = 2 if waves["tiles_m"] % 2 == 0 and waves["tiles"] >= num_sms else 1
        smem = deepgemm_smem(bm, bn, GROUP, stages, k)["total"]
        out.append(
            DeepGemmCandidate(
                bm, bn, GROUP, stages, cluster, waves["tiles"], waves["waves"], waves["last_wave_util"], smem
            )
        )
    return out


def deepgemm_choice(m: int, n: int, k: int, *, num_sms: int = 132) -> DeepGemmCandidate:
    """DeepGEMM's rule over `deepgemm_space`: fewest waves, then the best last-wave utilisation, then the
    larger tile (fewer tiles re-read less of A and B)."""
    space = deepgemm_space(m, n, k, num_sms=num_sms)
    if not space:
        raise ValueError(f"no DeepGEMM-like config fits for m={m} n={n} k={k}")
    return min(space, key=lambda c: (c.waves, -c.last_wave_util, -(c.block_m * c.block_n)))
