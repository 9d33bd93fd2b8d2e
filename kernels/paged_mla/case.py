"""The paged MLA family the farm runs: decode over a paged KV cache, and a trace-driven cache benchmark.

Backends
  torch_ref    fp32 torch reference over the paged layout (the baseline)
  triton       split-KV + combine Triton kernels (kernels.common.mla.triton_decode)
  flash_mla    the FlashMLA library, on a GPU host where `flash_mla` imports (bf16 cache, page 64)
  cache_trace  a synthetic multi-turn serving trace replayed through the cache manager at the trial's
               page size (kernels.paged_mla.trace_bench); no kernel runs, nothing is timed
Shape keys (one grid for every backend): batch, seqlen (the longest sequence), dist (fixed | uniform |
skewed | boundary), h_q, s_q, page_size (1 to 1024 tokens; the shipped specs measure 16 | 32 | 64 | 128,
the sizes the compiled-register tests cover), kv_dtype (bf16 | fp8 | fp8_flashmla: fp8
with one fp32 scale per token, or FlashMLA's 656 B/token layout, kernels.common.mla.layout); optional
shared_prefix (tokens every sequence shares, default 0). The spec dtype is q's and out's: bfloat16.
Config: triton takes
  num_splits   "auto" (default): FlashMLA-style balanced split plan over about one unit per SM, or a
               positive integer: that many page-aligned splits per sequence (kernels.common.mla.split_plan)
  num_warps    1 | 2 | 4 | 8 | 16 (default 8) and num_stages 1-8 (default the kernel's: 3 for the 64 x 64 bf16
               tile on sm_90a, else 2): the split kernel's launch
  maxnreg      registers per thread at most (ptxas .maxnreg), 24-255, or 0 for no cap (default the kernel's:
               240 / 208 where those compile without spills on sm_90a, kernels.common.mla.decode_kernels)
  block_m      query rows (s_q x h_q pairs) per program, a power of two >= 16; 64 and more use wgmma
               on sm_90a, tcgen05 on sm_100a
  block_n      cached tokens per step, a power of two >= 16
               (block_m / block_n default per cache and per compile target, the host's:
               kernels.common.mla.decode_kernels.default_tiles and "Default tiles" in its docstring; they
               compile without spills and within shared memory at the shipped spec's shapes)
and before it runs, where Triton compiles (a GPU host, or TRITON_INTERPRET=0 set), the trial is compiled
for the host's target as the JIT would launch it (kernels.compiled); a config that spills or needs more
shared memory than a block gets is `pruned` with the compiler's reason, and the verdict is stored as
resources.compiled_check. cache_trace takes the trace keys of trace_bench; the others no config.

A decode trial: the sequence lengths depend on the shape only (sample_seqlens with SEQLEN_SEED), so every
backend and every seed decodes the same lengths and cost() knows them. For each of policy.seeds seeds it
builds the cache through PagedKVCache (unused slots NaN, unused block-table entries out of range unless
policy.poison_unused is off), runs the backend and checks it by FlashMLA's rule (kernels.common.mla.check)
against the fp32 reference; torch_ref itself is checked against the reference over a contiguous
re-layout of the same pages. The last seed's checked call runs under kernels.measure.memory.peak_memory
(free on a GPU; on a CPU the torch profiler's first start in a process costs 1.5-5 s, mostly importing
torch._dynamo, and ~10 ms after: once per farm worker), and its inputs are then timed
(kernels.measure.measure; num_splits is fixed beforehand, so the timed call never reads cache_seqlens on
the host); then its q, pages (with fp8's scales) and block table are refilled in place from a fresh seed
and the same call is checked again (kernels.harness.stale_output: a cached result is `invalid`). Metrics:
GB/s and TFLOPS from the cost model, the cache manager's hit rate,
evictions, fragmentation and bytes per token, the splits used and the fraction of HBM bandwidth reached on
a known GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from kernels.base import (
    Backends,
    Cost,
    KernelFamily,
    Metric,
    TrialOutcome,
    TrialRequest,
    TrialStatus,
    needs_triton,
)
from kernels.common.mla.check import check_decode
from kernels.common.mla.cost import mla_decode_cost, partial_bytes
from kernels.common.mla.layout import (
    D_QK,
    FLASHMLA_FP8_BYTES,
    FLASHMLA_ROPE_OFFSET,
    FLASHMLA_SCALE_OFFSET,
    INVALID_BLOCK_ID,
    MAX_PAGE_SIZE,
    is_flashmla_fp8,
    is_fp8,
    kv_bytes_per_token,
    kv_torch_dtype,
)
from kernels.common.mla.reference import mla_decode_reference
from kernels.compiled import trial_check
from kernels.harness import Checked, Prepared, run_trial
from kernels.paged_mla import flash_mla_adapter
from kernels.paged_mla.inputs import (
    SEQLEN_DISTS,
    DecodeInputs,
    build_decode_inputs,
    pages_needed,
    sample_seqlens,
)
from kernels.paged_mla.trace_bench import (
    TRACE_CONFIG_KEYS,
    run_trace_bench,
    trace_setup,
    validate_trace_config,
)

SHAPE_KEYS = ("batch", "seqlen", "dist", "h_q", "s_q", "page_size", "kv_dtype")
OPTIONAL_SHAPE_KEYS = ("shared_prefix",)
KV_DTYPES = ("bf16", "fp8", "fp8_flashmla")
DTYPE = "bfloat16"
SEQLEN_SEED = 0
MAX_S_Q = 16

Decode = Callable[[], tuple[torch.Tensor, torch.Tensor]]
# A decode backend builds, from one set of inputs, its config and the device, the no-argument call that
# is checked and timed, and what it chose (splits). cache_trace runs a whole trial of its own.
BACKENDS = Backends("paged_mla")


def shape_seqlens(shape: dict[str, Any]) -> list[int]:
    """The sequence lengths of a decode shape (the same for every backend and seed)."""
    return sample_seqlens(
        shape["dist"], shape["batch"], shape["seqlen"], shape["page_size"], seed=SEQLEN_SEED
    )


class PagedMLAFamily(KernelFamily):
    name = "paged_mla"
    backends = BACKENDS
    shape_keys = SHAPE_KEYS
    optional_shape_keys = OPTIONAL_SHAPE_KEYS
    report_metrics = (
        Metric("num_splits", "splits"),
        Metric("hbm_gbps", "HBM GB/s", ".4g"),  # the distinct bytes (cost.py), where they differ from GB/s
        Metric("hbm_fraction", "of HBM", ".1%"),
        Metric("page_hit_rate", "hit rate", ".2f"),
        Metric("evictions", "evictions", "d"),
        Metric("fragmentation_pct", "frag %", ".1f"),
        Metric("bytes_per_token", "B/token", ".0f"),
    )
    scaling = (("seqlen", "gbps"),)

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        _validate_shape(shape)
        if dtype != DTYPE:
            raise ValueError(
                f"dtype must be {DTYPE} (q and out; the cache's type is shape.kv_dtype) (got {dtype})"
            )
        if backend not in self.backends:
            raise ValueError(f"unknown paged_mla backend {backend!r} (known: {', '.join(self.backends)})")
        declared = self.backends[backend]
        if declared.check is not None:
            declared.check(shape, config)
        allowed = declared.config_keys
        for key in config:
            if key not in allowed:
                takes = f"takes only {', '.join(allowed)}" if allowed else "takes no config"
                raise ValueError(f"config.{key} does not apply to backend {backend} ({backend} {takes})")
        if "num_splits" in config:
            n = config["num_splits"]
            if n != "auto" and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise ValueError(f"config.num_splits must be a positive integer or 'auto' (got {n!r})")
        _check_kernel_options(config)

    def meta_launch(
        self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str
    ) -> Callable[[], Any] | None:
        """The triton backend's two launches on meta tensors of the trial's shapes (no storage)."""
        if not self.backends[backend].runs_triton:
            return None
        from kernels.common.mla import triton_decode as td

        meta = torch.device("meta")
        b, page = shape["batch"], shape["page_size"]
        seqlens = shape_seqlens(shape)
        pages = pages_needed(seqlens, page, shape.get("shared_prefix", 0)) + 1
        q = torch.empty(b, shape["s_q"], shape["h_q"], D_QK, dtype=torch.bfloat16, device=meta)
        width = FLASHMLA_FP8_BYTES if shape["kv_dtype"] == "fp8_flashmla" else D_QK
        kv = torch.empty(pages, page, 1, width, dtype=kv_torch_dtype(shape["kv_dtype"]), device=meta)
        scales = (
            torch.empty(pages, page, dtype=torch.float32, device=meta) if shape["kv_dtype"] == "fp8" else None
        )
        table = torch.empty(b, -(-shape["seqlen"] // page) + 1, dtype=torch.int32, device=meta)
        lens = torch.empty(b, dtype=torch.int32, device=meta)
        rows = shape["s_q"] * shape["h_q"]

        def call() -> Any:  # the tiles are the target's being compiled for (launch_target), when called
            tiles = kernel_options(config, rows=rows, page=page, kv_format=td.kv_format_of(kv))
            plan = _plan(td, seqlens, config, tiles, rows=rows, page=page, sms=td.DEFAULT_NUM_SMS).to(meta)
            return td.mla_decode_triton(q, kv, table, lens, plan=plan, kv_scales=scales, **tiles)

        return call

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        return mla_decode_cost(
            shape_seqlens(shape), h_q=shape["h_q"], s_q=shape["s_q"], kv_dtype=shape["kv_dtype"],
            shared_prefix=shape.get("shared_prefix", 0), page_size=shape["page_size"],
        )  # fmt: skip

    def execute(self, req: TrialRequest) -> TrialOutcome:
        """A triton trial is first compiled for the host's target where Triton compiles (a GPU host, or
        TRITON_INTERPRET=0 asked for explicitly): one that spills or needs more shared memory than a
        block gets is `pruned` with the compiler's reason, without running."""
        check = trial_check(self, req.shape, req.config, req.dtype, req.backend)
        if check is not None and check.get("problems"):
            cost = self.cost(req.shape, req.dtype)
            return TrialOutcome(
                status=TrialStatus.PRUNED,
                error="pruned: " + "; ".join(check["problems"]),
                resources={"compiled_check": check},
                metrics={"flops": cost.flops, "bytes": cost.bytes},
            )
        outcome = self.backends.impl(req.backend)(req)
        if check is not None:
            outcome.resources = {**outcome.resources, "compiled_check": check}
        return outcome


# -- validation --------------------------------------------------------------------------------------------


def _int_key(shape: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = shape[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"shape.{key} must be an integer in [{lo}, {hi}] (got {v!r})")
    return v


def _validate_shape(shape: dict[str, Any]) -> None:
    missing = [k for k in SHAPE_KEYS if k not in shape]
    if missing:
        raise ValueError(f"shape is missing {', '.join(missing)} (paged_mla needs {', '.join(SHAPE_KEYS)})")
    unknown = sorted(set(shape) - set(SHAPE_KEYS) - set(OPTIONAL_SHAPE_KEYS))
    if unknown:
        raise ValueError(
            f"shape.{unknown[0]} is not a paged_mla shape key "
            f"(known: {', '.join(SHAPE_KEYS + OPTIONAL_SHAPE_KEYS)})"
        )
    _int_key(shape, "batch", 1, 65536)
    seqlen = _int_key(shape, "seqlen", 1, 1 << 20)
    _int_key(shape, "h_q", 1, 1024)
    _int_key(shape, "s_q", 1, MAX_S_Q)
    _int_key(shape, "page_size", 1, MAX_PAGE_SIZE)
    if shape["kv_dtype"] not in KV_DTYPES:
        raise ValueError(f"shape.kv_dtype must be one of {list(KV_DTYPES)} (got {shape['kv_dtype']!r})")
    if shape["dist"] not in SEQLEN_DISTS:
        raise ValueError(f"shape.dist must be one of {list(SEQLEN_DISTS)} (got {shape['dist']!r})")
    if shape["dist"] == "boundary" and seqlen <= shape["page_size"]:
        raise ValueError(
            f"shape.seqlen must exceed page_size ({shape['page_size']}) for dist boundary, which samples "
            f"page_size + 1 (got {seqlen})"
        )
    if "shared_prefix" in shape:
        _int_key(shape, "shared_prefix", 0, seqlen)


# -- decode trials -----------------------------------------------------------------------------------------


def _inputs(shape: dict[str, Any], seqlens: list[int], seed: int, device: str, poison: bool) -> DecodeInputs:
    inp = build_decode_inputs(
        seqlens,
        h_q=shape["h_q"],
        s_q=shape["s_q"],
        page_size=shape["page_size"],
        kv_dtype=shape["kv_dtype"],
        shared_prefix=shape.get("shared_prefix", 0),
        seed=seed,
        device=device,
    )
    if not poison:
        _unpoison(inp)
    return inp


def _unpoison(inp: DecodeInputs) -> None:
    """Zero the NaN slots and point unused block-table entries at page 0 (policy.poison_unused off)."""
    if is_flashmla_fp8(inp.kv_cache):  # only the fp8 NoPE bytes and the fp32 scales can be NaN
        raw = inp.kv_cache.view(torch.uint8)
        nope = raw[..., :FLASHMLA_SCALE_OFFSET]
        nope[(nope & 0x7F) == 0x7F] = 0
        raw[..., FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET].view(torch.float32).nan_to_num_(0.0)
    elif is_fp8(inp.kv_cache.dtype):
        raw = inp.kv_cache.view(torch.uint8)
        raw[(raw & 0x7F) == 0x7F] = 0  # e4m3fn's NaN is S.1111.111
    else:
        inp.kv_cache.nan_to_num_(0.0)
    if inp.kv_scales is not None:
        inp.kv_scales.nan_to_num_(0.0)
    inp.block_table[inp.block_table == INVALID_BLOCK_ID] = 0


def _num_sms(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return None


@dataclasses.dataclass(frozen=True)
class DecodeBackend:
    """A decode backend's implementation: `build(inputs, config, device)` makes its call and figures; a
    trial runs it through _run_decode. (A FARM_PLUGINS wrapper of the backend wraps `build`.)"""

    build: Callable[[DecodeInputs, dict[str, Any], torch.device], tuple[Decode, dict[str, Any]]]

    def __call__(self, req: TrialRequest) -> TrialOutcome:
        return _run_decode(req, self.build)


def _decode_backend(name: str, description: str, **declared: Any) -> Callable[[Callable], Callable]:
    """Declare a decode backend: the decorated function builds its call (DecodeBackend)."""

    def decorate(build: Callable) -> Callable:
        BACKENDS.add(name, description, impl=DecodeBackend(build), **declared)
        return build

    return decorate


@_decode_backend("torch_ref", "fp32 torch reference decode over the paged layout (baseline)", reference=True)
def _torch_ref(
    inp: DecodeInputs, config: dict[str, Any], device: torch.device
) -> tuple[Decode, dict[str, Any]]:
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    return lambda: mla_decode_reference(
        *args, softmax_scale=inp.softmax_scale, kv_scales=inp.kv_scales, d_v=inp.d_v
    ), {}


@_decode_backend(
    "triton",
    "Triton split-KV decode + combine (num_splits: int or auto)",
    config_keys=("num_splits", "num_warps", "num_stages", "maxnreg", "block_m", "block_n"),
    requires=needs_triton,
)
def _triton(inp: DecodeInputs, config: dict[str, Any], device: torch.device) -> tuple[Decode, dict[str, Any]]:
    from kernels.common.mla import triton_decode as td

    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    rows = inp.q.shape[1] * inp.q.shape[2]
    page = inp.kv_cache.shape[1]
    sms = _num_sms(device) or td.DEFAULT_NUM_SMS
    tiles = kernel_options(config, rows=rows, page=page, kv_format=td.kv_format_of(inp.kv_cache))
    plan = _plan(td, inp.seqlens, config, tiles, rows=rows, page=page, sms=sms)
    on_device = plan.to(inp.q.device)  # once, here: a copy inside the timed call would stall every sample

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return td.mla_decode_triton(
            *args,
            plan=on_device,
            softmax_scale=inp.softmax_scale,
            kv_scales=inp.kv_scales,
            d_v=inp.d_v,
            num_sms=sms,
            **tiles,
        )

    n = config.get("num_splits", "auto")
    splits = n if n != "auto" else plan.max_chunks_per_seq()  # the most partials any sequence combines
    return call, {"num_splits": splits, "num_sms": sms, **plan.describe(), **tiles}


def _plan(td: Any, seqlens: list[int], config: dict[str, Any], tiles: dict[str, Any], **at: Any) -> Any:
    """The trial's split plan, built once from the shape's lengths before anything is timed, over the
    kernel's own tiles: config num_splits an int gives the uniform plan, "auto" (the default) the
    balanced one."""
    return td.plan_for(
        seqlens,
        config.get("num_splits", "auto"),
        rows=at["rows"],
        block_m=tiles["block_m"],
        block_n=tiles["block_n"],
        page_size=at["page"],
        num_sms=at["sms"],
    )


# The split kernel's launch options a spec can sweep; block_m / block_n None take the per-cache, per-target
# defaults of kernels.common.mla.triton_decode (default_tiles), which compile without spills and within
# shared memory for every cache at every page size of the shipped spec, on sm_90a (wgmma for a bf16 cache
# with >= 64 query rows) and on sm_100a (tests/kernels/paged_mla/test_paged_mla_compiled.py); num_stages and
# maxnreg None take the kernel's (default_num_stages, default_maxnreg: at most 240 registers without spills).
KERNEL_DEFAULTS = {"num_warps": 8, "num_stages": None, "maxnreg": None, "block_m": None, "block_n": None}


def kernel_options(config: dict[str, Any], *, rows: int, page: int, kv_format: str) -> dict[str, Any]:
    """The split kernel's launch options for a trial, block sizes resolved for the target being launched
    for (kernels.compiled.launch_target: the one being compiled for, else this host's), so the split
    plan and the kernel use the same tiles."""
    from kernels.common.mla import triton_decode as td
    from kernels.compiled import launch_target

    options = {key: config.get(key, default) for key, default in KERNEL_DEFAULTS.items()}
    target = launch_target()
    if options["block_m"] is None or options["block_n"] is None:
        bm, bn = td.default_tiles(rows, page, kv_format, target)
        options["block_m"] = options["block_m"] or bm
        options["block_n"] = options["block_n"] or bn
    bm, bn = options["block_m"], options["block_n"]
    if options["num_stages"] is None:
        options["num_stages"] = td.default_num_stages(bm, bn, kv_format, target)
    if options["maxnreg"] is None:
        cap = td.default_maxnreg(bm, bn, kv_format, target, options["num_stages"], options["num_warps"])
        options["maxnreg"] = cap or 0  # 0: no cap (recorded as such)
    return options


def _check_kernel_options(config: dict[str, Any]) -> None:
    allowed = {"num_warps": (1, 2, 4, 8, 16), "num_stages": tuple(range(1, 9))}
    for key, values in allowed.items():
        if key in config and (isinstance(config[key], bool) or config[key] not in values):
            raise ValueError(
                f"config.{key} must be one of {', '.join(map(str, values))} (got {config[key]!r})"
            )
    cap = config.get("maxnreg")
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not (cap == 0 or 24 <= cap <= 255)
    ):
        raise ValueError(f"config.maxnreg must be 0 (no cap) or an integer from 24 to 255 (got {cap!r})")
    for key in ("block_m", "block_n"):
        v = config.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1)):
            raise ValueError(f"config.{key} must be a power of two >= 16 (tl.dot) (got {v!r})")


def _flash_mla_shape(shape: dict[str, Any], config: dict[str, Any]) -> None:
    if shape["page_size"] != 64:
        raise ValueError(f"shape.page_size must be 64 for flash_mla (got {shape['page_size']})")
    if shape["kv_dtype"] != "bf16":
        raise ValueError(f"shape.kv_dtype must be bf16 for flash_mla (got {shape['kv_dtype']!r})")


@_decode_backend(
    "flash_mla",
    "FlashMLA library decode (GPU host with flash_mla installed; bf16, page 64)",
    requires=flash_mla_adapter.unavailable_reason,
    check=_flash_mla_shape,
)
def _flash_mla(
    inp: DecodeInputs, config: dict[str, Any], device: torch.device
) -> tuple[Decode, dict[str, Any]]:
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    return flash_mla_adapter.flash_mla_decode_fn(*args, d_v=inp.d_v, softmax_scale=inp.softmax_scale), {}


def contiguous_layout(inp: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The same sequences copied into a fresh pool, page after page in order, no sharing: (kv_cache,
    block_table, kv_scales). The reference over it must agree with the reference over the paged layout."""
    page = inp.kv_cache.shape[1]
    counts = [-(-n // page) for n in inp.seqlens]
    width = max(max(counts, default=0), 1)
    table = torch.full((len(counts), width), INVALID_BLOCK_ID, dtype=torch.int32)
    src: list[int] = []
    for i, c in enumerate(counts):
        table[i, :c] = torch.arange(len(src), len(src) + c, dtype=torch.int32)
        src.extend(inp.block_table[i, :c].tolist())
    idx = torch.tensor(src, dtype=torch.long, device=inp.kv_cache.device)
    kv = inp.kv_cache[idx] if src else inp.kv_cache[:1]
    scales = None if inp.kv_scales is None else (inp.kv_scales[idx] if src else inp.kv_scales[:1])
    return kv, table.to(inp.kv_cache.device), scales


def _reference_for(backend: str, inp: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    if BACKENDS[backend].reference:  # the reference itself is checked over a re-laid-out cache
        kv, table, scales = contiguous_layout(inp)
        return mla_decode_reference(
            inp.q,
            kv,
            table,
            inp.cache_seqlens,
            softmax_scale=inp.softmax_scale,
            kv_scales=scales,
            d_v=inp.d_v,
        )
    return mla_decode_reference(
        inp.q,
        inp.kv_cache,
        inp.block_table,
        inp.cache_seqlens,
        softmax_scale=inp.softmax_scale,
        kv_scales=inp.kv_scales,
        d_v=inp.d_v,
    )


def _cache_metrics(inp: DecodeInputs, kv_dtype: str) -> dict[str, Any]:
    s = inp.cache.stats()
    return {
        "page_hit_rate": s.hit_rate,
        "page_hits": s.hits,
        "page_misses": s.misses,
        "evictions": s.evictions,
        "pages_in_use": s.pages_in_use,
        "fragmentation_slots": s.fragmentation,
        "fragmentation_pct": 100.0 * s.fragmentation / s.allocated_slots if s.allocated_slots else 0.0,
        "cache_bytes_in_use": s.bytes_in_use,
        "bytes_per_token": s.bytes_per_token,
        "bytes_per_token_raw": kv_bytes_per_token(kv_dtype),
    }


def _seeded(inp: DecodeInputs) -> tuple[torch.Tensor, ...]:
    """What every decode backend's call reads that follows the seed, refilled in place from a fresh seed
    after timing (kernels.harness.stale_output): q, the pages (fp8_flashmla: its scales are in the page
    bytes) with fp8's per-token scales, and the block table (the pool's page order is shuffled per seed;
    its unused entries and the pool's size follow the lengths). Not cache_seqlens: the lengths are the
    shape's (SEQLEN_SEED), the same for every seed, so the split plan (triton) and the scheduler
    metadata (flash_mla) built from them when the call was built are right for any seed's tensors."""
    scales = () if inp.kv_scales is None else (inp.kv_scales,)
    return (inp.q, inp.kv_cache, inp.block_table, *scales)


def _run_decode(req: TrialRequest, build: Callable) -> TrialOutcome:
    shape = req.shape
    seqlens = shape_seqlens(shape)
    base = FAMILY.cost(shape, req.dtype)

    def prepare(seed: int, device: torch.device) -> Prepared:
        inp = _inputs(shape, seqlens, seed, req.device, req.policy.poison_unused)
        call, chosen = build(inp, req.config, device)
        ref_out, ref_lse = _reference_for(req.backend, inp)

        def check(result: tuple[torch.Tensor, torch.Tensor]) -> Checked:
            c = check_decode(*result, ref_out, ref_lse)
            return Checked(c.out, also={"lse": c.lse})

        # the split partials are this trial's plan's: HBM traffic FlashMLA's GB/s leaves out (cost.py)
        chunks = chosen.get("plan_chunks")
        partials = partial_bytes(chunks, shape["s_q"] * shape["h_q"]) if chunks is not None else 0.0
        cost = dataclasses.replace(base, hbm_bytes_moved=base.hbm_bytes + partials) if partials else base

        def figures() -> dict[str, Any]:
            return {
                "kv_bytes": cost.kv_bytes,
                "hbm_bytes": cost.hbm_bytes,
                "partial_bytes": partials,
                "total_tokens": sum(seqlens),
                "mean_seqlen": sum(seqlens) / len(seqlens),
                "max_seqlen": max(seqlens),
                **chosen,
                **_cache_metrics(inp, shape["kv_dtype"]),
            }

        return Prepared(call, check, cost, figures=figures, inputs=_seeded(inp))

    checked = {"checked": "out (headline) and lse", "poisoned": req.policy.poison_unused}
    return run_trial(req, prepare, memory=True, correctness=checked)


# -- cache trace trials ------------------------------------------------------------------------------------


def _check_trace_config(shape: dict[str, Any], config: dict[str, Any]) -> None:
    validate_trace_config(config)


@BACKENDS.register(
    "cache_trace",
    "multi-turn trace replayed through the KV cache manager (hit rate, evictions, memory)",
    config_keys=TRACE_CONFIG_KEYS,
    check=_check_trace_config,
)
def _run_trace(req: TrialRequest) -> TrialOutcome:
    setup = trace_setup(req.shape, req.config)
    metrics, correctness = run_trace_bench(setup)
    return TrialOutcome(
        status=TrialStatus.passed(correctness["passed"]),
        correctness=correctness,
        metrics=metrics,  # the pool's bytes over time are metrics; outcome.memory is a kernel call's
    )


FAMILY = PagedMLAFamily()
