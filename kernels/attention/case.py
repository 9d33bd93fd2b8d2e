"""The attention family as the farm runs it (see kernels.attention.shapes for the shape keys and modes).

Backends:
  sdpa       torch scaled_dot_product_attention (the baseline of the GPU spec): flash / memory-efficient
             backends on a GPU, math on a CPU (kernels.attention.sdpa); for decode_step the pages are
             gathered, then SDPA. It returns no lse, so only its output is checked.
  torch_ref  the same masked softmax as the reference, computed in fp32 (for decode_step, kernels.
             paged_mla's fp32 reference)
  triton     the Triton kernel of the mode (config: block_m, block_n, num_warps, num_stages, and
             num_splits for the split-KV decode modes)
The correctness reference is an fp64 computation (kernels.attention.reference), never a backend's own
code path at the backend's precision. Sparse modes follow FlashMLA's semantics: a position named twice in
a token's indices counts twice (softmax over index slots), and the triton backend's timed call is the
gather kernel alone (nothing to de-duplicate). Work that is not the kernel (SDPA masks) is done once when
the inputs are prepared, outside the timed call. lse is the natural log, and a row that sees no key has
out 0 and lse +inf in every backend and reference (kernels.common.lse); the check below wants the +inf
positions exactly.
A trial: for each correctness seed, build seeded inputs (unused memory NaN-poisoned, except for sdpa:
its math backend multiplies masked rows by 0), run the backend and the reference, check out and lse
by FlashMLA's rule (kernels.common.mla.check: out abs 8e-4 or rel
2.01/128 with cos diff <= 5e-6, lse abs 1e-6 or rel 8.01/65536, NaN/inf positions exact); then time the
backend on the last seed's inputs with kernels.measure, and check its call once more with the seeded
tensors it reads refilled in place from a fresh seed (kernels.harness.stale_output: a cached result is
`invalid`; `_seeded`, and for decode_step `Steps`).

Metrics: latency_us, tflops, gbps, flops, bytes; max_abs_err / max_rel_err / cos_diff of out and
lse_max_abs_err / lse_max_rel_err; for sdpa sdpa_backends (and sdpa_fallback when the fast ones were
refused); for decode modes tokens, latency_per_token_us and tokens_per_s (the decode-batch sweep
compares these across batch sizes); on a GPU with known limits, roofline_us and pct_of_roofline
(against the peak of the trial's dtype, kernels.hardware.precision_of); for triton on a GPU, occupancy
(theoretical, from the compile metadata, in `resources`), and l2_hit_rate_pct when the policy asks
for ncu and it is installed.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from kernels import harness
from kernels.attention import reference as ref
from kernels.attention.cost import AttentionCost, dense_cost, distinct_positions, sparse_cost, valid_slots
from kernels.attention.inputs import build_dense, build_sparse
from kernels.attention.sdpa import Sdpa
from kernels.attention.shapes import OPTIONAL_KEYS, REQUIRED_KEYS, Shape, parse_shape
from kernels.base import (
    Backends,
    Cost,
    KernelFamily,
    Metric,
    TrialOutcome,
    TrialRequest,
    needs_triton,
)
from kernels.hardware import precision_of
from kernels.measure.correctness import CorrectnessReport
from kernels.measure.resources import collect_ncu, triton_resources

Pair = tuple[torch.Tensor, torch.Tensor | None]  # (out, lse); lse None where a backend gives none
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_TILE_KEYS = {"block_m", "block_n", "num_warps", "num_stages"}
CONFIG_KEYS: dict[str, set[str]] = {
    "prefill": _TILE_KEYS,
    "decode": _TILE_KEYS | {"num_splits"},
    "mla_decode": _TILE_KEYS | {"num_splits"},
    "sparse_prefill": _TILE_KEYS,
    "sparse_decode": _TILE_KEYS,
    "decode_step": _TILE_KEYS | {"num_splits"},
}


Run = Callable[[list | None], Pair]  # the timed call (given a list, it appends its Triton launches)
# A backend's call on the built inputs, what it describes, and the tensors it made from the seeded inputs
# when it was built and reads in every call (SDPA's sparse mask), refilled in place with the inputs
Bound = tuple[Run, Callable[[], dict[str, Any]], tuple[torch.Tensor, ...]]


@dataclass
class BoundMode:
    """One mode's inputs bound to a backend: `run` is the timed call, `reference` the fp64 answer to the
    last `run` (decode_step changes the cache on every run), `inputs` the seeded tensors `run` reads,
    which the harness refills in place from a fresh seed's after timing (harness.Prepared.inputs)."""

    run: Run
    reference: Callable[[], Pair]
    cost: AttentionCost
    extra: Callable[[], dict[str, Any]] = field(default=lambda: {})
    inputs: tuple[torch.Tensor, ...] = ()


def elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


SEQLEN_SEED = 1234  # sequence lengths depend on the shape only: every seed and job times the same work


def _seqlens(shape: Shape) -> list[int] | None:
    if shape.seqlens == "fixed":
        return None
    gen = torch.Generator().manual_seed(SEQLEN_SEED)
    lens = torch.randint(1, shape.s_k + 1, (shape.batch,), generator=gen).tolist()
    lens[0] = shape.s_k  # the longest context is always present
    return lens


@dataclass(frozen=True)
class Built:
    """A trial's inputs as a backend's implementation gets them: the shape, the seeded tensors (dense or
    sparse: q, k, v, softmax_scale, and seqlens_k or indices), the config and the reference."""

    shape: Shape
    x: Any
    config: dict[str, Any]
    reference: Callable[..., Pair]


def prepare(
    shape: Shape, backend: str, config: dict[str, Any], dtype: torch.dtype, seed: int, device: torch.device,
    steps: Steps | None = None,
) -> BoundMode:  # fmt: skip
    """One seed's inputs bound to `backend`; `steps`: the trial's latest decode step (decode_step), shared
    by the BoundModes of all its seeds (one of its own when None)."""
    if shape.mode == "decode_step":
        return _prepare_step(shape, backend, config, dtype, seed, device, Steps() if steps is None else steps)
    impl: AttentionImpl = BACKENDS.impl(backend)
    elem = elem_size(dtype)
    x = build_dense(
        shape.batch, shape.s_q, shape.s_k, shape.h_q, shape.h_kv, shape.d, shape.d_v,
        dtype=dtype, seed=seed, device=device, shared_kv=shape.shared_kv, seqlens=_seqlens(shape),
        poison=impl.poison,
    )  # fmt: skip
    if shape.is_sparse:  # fixed lengths (shapes.py): nothing poisoned above
        x = build_sparse(x, shape.topk, seed=seed, poison=impl.poison)
        indices = x.indices
        assert indices is not None
        cost = sparse_cost(
            valid_slots(indices, shape.s_k), distinct=distinct_positions(indices, shape.s_k),
            batch=shape.batch, s_q=shape.s_q, topk=shape.topk, h_q=shape.h_q, h_kv=shape.h_kv, d=shape.d,
            d_v=shape.d_v, elem=elem, shared_kv=shape.shared_kv,
        )  # fmt: skip

        def reference(dtype: torch.dtype = torch.float64) -> Pair:
            return ref.sparse_attention_reference(
                x.q, x.k, x.v, indices, softmax_scale=x.softmax_scale, dtype=dtype
            )

    else:
        cost = dense_cost(
            x.lens, s_q=shape.s_q, h_q=shape.h_q, h_kv=shape.h_kv, d=shape.d, d_v=shape.d_v, elem=elem,
            shared_kv=shape.shared_kv,
        )  # fmt: skip

        def reference(dtype: torch.dtype = torch.float64) -> Pair:
            return ref.attention_reference(
                x.q, x.k, x.v, causal=True, softmax_scale=x.softmax_scale, seqlens_k=x.seqlens_k, dtype=dtype
            )

    run, describe, made = impl.prepare(Built(shape, x, config, reference))
    return BoundMode(run, reference, cost, describe, inputs=(*_seeded(shape, x), *made))


def _seeded(shape: Shape, x: Any) -> tuple[torch.Tensor, ...]:
    """The seeded tensors every prefill, decode or sparse call reads: q, k, v (not v when it is a view of
    k, shared_kv: refilled with k) and the top-k indices, drawn per seed (with them k's NaN poison).
    Not seqlens_k: the lengths are the shape's (SEQLEN_SEED), the same for every seed, and so is the SDPA
    mask built from them."""
    v = () if shape.shared_kv else (x.v,)
    indices = () if x.indices is None else (x.indices,)
    return (x.q, x.k, *v, *indices)


# -- the backends' implementations: what each runs on the built inputs, and in a decode step -------------


def _ref_prepare(b: Built) -> Bound:
    return (lambda _launches: b.reference(torch.float32)), dict, ()


def _sdpa_prepare(b: Built) -> Bound:
    x = b.x
    if not b.shape.is_sparse:  # its mask, if any, follows the lengths: the same for every seed
        call = Sdpa.dense(x.q, x.k, x.v, x.softmax_scale, x.seqlens_k)
        return (lambda _launches: call()), call.describe, ()
    call = Sdpa.sparse(x.q, x.k, x.v, x.softmax_scale, x.indices)
    # the mask is built from this seed's indices, so it is refilled with them: always bool here, as the
    # family's indices never name a position twice (a count mask would be q's dtype)
    return (lambda _launches: call()), call.describe, (call.mask,)


def _triton_prepare(b: Built) -> Bound:
    x, config = b.x, b.config
    if b.shape.is_sparse:
        from kernels.attention.triton_sparse import sparse_attention_triton

        def sparse(launches: list | None) -> Pair:  # the indices as built: every slot counts
            return sparse_attention_triton(
                x.q, x.k, x.v, x.indices, softmax_scale=x.softmax_scale, launches=launches, **config
            )

        return sparse, dict, ()
    if b.shape.mode == "prefill":
        from kernels.attention.triton_prefill import flash_attention_triton as kernel
    else:
        from kernels.attention.triton_decode import decode_attention_triton as kernel

    def dense(launches: list | None) -> Pair:
        return kernel(x.q, x.k, x.v, softmax_scale=x.softmax_scale, seqlens_k=x.seqlens_k, launches=launches,
                      **config)  # fmt: skip

    return dense, dict, ()


def _ref_attend(scale: float, config: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, str]]:
    from kernels.attention.decode_step import reference_attend

    return reference_attend(scale), {}


def _sdpa_attend(scale: float, config: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, str]]:
    from kernels.attention.decode_step import sdpa_attend

    return sdpa_attend(scale)


def _triton_attend(scale: float, config: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, str]]:
    from kernels.attention.decode_step import triton_attend

    return triton_attend(scale, **config), {}


@dataclass(frozen=True)
class AttentionImpl:
    """One backend: `prepare` (the built inputs -> the call and its description) for prefill, decode and
    sparse trials, `attend` (softmax scale, config -> the step's attention and what it used) for
    decode_step trials, and whether the inputs' unused memory is NaN-poisoned (SDPA's math path reads
    the padding, so its inputs are not)."""

    prepare: Callable[[Built], Bound]
    attend: Callable[[float, dict[str, Any]], tuple[Callable[..., Any], dict[str, str]]]
    poison: bool = True


@dataclass
class Steps:
    """The latest step of a decode_step trial, whichever seed's stepper took it. A step's reference is the
    exact attention over what that step read, so it is taken from here: the harness's recheck
    (harness.stale_output) refills the timed stepper's q and new-token rows from a fresh seed's, runs the
    timed seed's call and checks its result with the fresh seed's check, whose own stepper never steps.
    The cache's pages are not refilled: their layout and contents follow the steps taken so far as well
    as the seed (a fresh stepper has NaN where the timed one holds the tokens it appended)."""

    last: Any = None  # kernels.attention.decode_step.StepState


def _prepare_step(
    shape: Shape, backend: str, config: dict[str, Any], dtype: torch.dtype, seed: int, device: torch.device,
    steps: Steps,
) -> BoundMode:  # fmt: skip
    from kernels.attention.decode_step import DecodeStepper, exact_attend
    from kernels.common.mla.cost import mla_decode_cost
    from kernels.common.mla.layout import D_QK

    stepper = DecodeStepper(
        shape.batch, shape.s_k, shape.h_q, page_size=shape.page_size, dtype=dtype, device=device, seed=seed
    )
    ref_attend = exact_attend(stepper.softmax_scale)
    attend, sdpa_used = BACKENDS.impl(backend).attend(stepper.softmax_scale, config)
    kv = "bf16" if dtype == torch.bfloat16 else "fp16"
    lens = [shape.s_k + 1] * shape.batch  # the context the step attends over
    c = mla_decode_cost(lens, h_q=shape.h_q, kv_dtype=kv, q_dtype=kv, out_dtype=kv)
    append = float(shape.batch * D_QK * elem_size(dtype))  # the new token's latent, written to the cache
    cost = AttentionCost(c.flops, c.bytes_read, c.bytes_written + append, c.kv_bytes + append)

    def run(_launches: list | None) -> Pair:
        result = stepper.step(attend)
        steps.last = stepper.last
        return result

    def reference() -> Pair:
        last = steps.last
        assert last is not None, "reference() follows a step"
        return ref_attend(last.q, last.tensors)

    def extra() -> dict[str, Any]:
        st = stepper.cache.stats()
        return {
            "window": stepper.window,
            "rewinds": stepper.rewinds,
            "cache_hits": st.hits,
            "cache_pages_in_use": st.pages_in_use,
            "cache_fragmentation": st.fragmentation,
            **sdpa_used,
        }

    return BoundMode(run, reference, cost, extra, inputs=stepper.seeded())


def _check(out: torch.Tensor, lse: torch.Tensor | None, ref_out: torch.Tensor, ref_lse: torch.Tensor):
    """FlashMLA's rule on out and lse; a backend that returns no lse (SDPA) is checked on out only and
    its lse report says so (passed, nothing compared)."""
    from kernels.common.mla.check import check_decode

    if lse is None:
        check = check_decode(out, ref_lse.float(), ref_out, ref_lse)
        none = CorrectnessReport(True, "none", math.nan, math.nan, 0, None, 0, message="no lse returned")
        return replace(check, lse=none)
    return check_decode(out, lse, ref_out, ref_lse)


def _resources(req: TrialRequest, shape: Shape, prep: BoundMode, device: torch.device) -> dict[str, Any]:
    if not BACKENDS[req.backend].config_keys:
        return {"collected": False, "reason": "torch backend: no compiled Triton kernel"}
    if device.type != "cuda":
        return {"collected": False, "reason": "CPU run: Triton interpreter, no compile metadata"}
    launches: list = []
    prep.run(launches)
    if not launches:
        return {"collected": False, "reason": "the wrapper reports no launch handle (paged_mla decode)"}
    out: dict[str, Any] = {"collected": True, "kernels": {n: triton_resources(h) for n, h in launches}}
    out["ncu"] = collect_ncu(
        [sys.executable, "-m", "kernels.attention.profile", json.dumps(asdict(shape)), req.dtype,
         json.dumps(req.config)],
        enabled=req.policy.ncu,
        kernel_name=launches[0][0],
        launch_skip=1,  # the first launch compiles
        launch_count=1,
    )  # fmt: skip
    return out


def _attention_metrics(
    shape: Shape, backend: str, device: torch.device, outcome: TrialOutcome
) -> dict[str, Any]:
    """What attention reports beyond the harness's rates: the latency (per token for a decode), the
    errors of out and lse, the timing label and, on a GPU, the roofline percentage, the theoretical
    occupancy and (when collected) the L2 hit rate."""
    metrics, c = outcome.metrics, outcome.correctness
    ns = metrics.get("time_ns")
    lse = c.get("lse") or {}
    m: dict[str, Any] = {
        "latency_us": ns / 1e3 if ns else None,
        "max_abs_err": c.get("max_abs_err"),
        "max_rel_err": c.get("max_rel_err"),
        "cos_diff": c.get("cos_diff"),
        "lse_max_abs_err": lse.get("max_abs_err"),
        "lse_max_rel_err": lse.get("max_rel_err"),
    }
    if shape.is_decode:
        m.update(
            batch=shape.batch,
            tokens=shape.tokens,
            latency_per_token_us=ns / 1e3 / shape.tokens if ns else None,
            tokens_per_s=shape.tokens / (ns / 1e9) if ns else None,
        )
    if device.type != "cuda":
        m["timing"] = "cpu (Triton interpreter)" if BACKENDS[backend].config_keys else "cpu"
        return m
    m["timing"] = "gpu"
    if metrics.get("roofline_fraction") is not None:
        m["pct_of_roofline"] = 100.0 * metrics["roofline_fraction"]
    kernels = outcome.resources.get("kernels") or {}
    if kernels:
        first = next(iter(kernels.values()))
        occ = first.get("occupancy") if first.get("collected") else None
        if isinstance(occ, dict) and "occupancy" in occ:
            m["occupancy"] = occ["occupancy"]
            m["occupancy_limiter"] = occ["limiter"]
    ncu = outcome.resources.get("ncu") or {}
    if ncu.get("collected") and "l2_hit_rate_pct" in ncu:
        m["l2_hit_rate_pct"] = ncu["l2_hit_rate_pct"]
    return m


def _meta_launch(s: Shape, config: dict[str, Any], dtype: torch.dtype) -> Callable[[], Any]:
    """What `prepare` launches for the triton backend, on meta tensors: same shapes, strides, dtypes and
    keyword arguments, so kernels.compiled sees the JIT's specialisation. K and V are carved out of one
    meta buffer so that their addresses differ, as two allocations' do (the kernels tell "V inside K"
    from the pointers)."""
    meta = torch.device("meta")
    b, s_q, s_k = s.batch, s.s_q, s.s_k
    if s.mode == "decode_step":
        return _meta_step(s, config, dtype)
    q = torch.empty(b, s_q, s.h_q, s.d, dtype=dtype, device=meta)
    k_shape, v_shape = (b, s_k, s.h_kv, s.d), (b, s_k, s.h_kv, s.d_v)
    if s.shared_kv:
        k = torch.empty(k_shape, dtype=dtype, device=meta)
        v = k[..., : s.d_v]
    else:
        nk = math.prod(k_shape)
        buf = torch.empty(nk + math.prod(v_shape), dtype=dtype, device=meta)
        k, v = buf[:nk].view(k_shape), buf[nk:].view(v_shape)
    scale = 1.0 / math.sqrt(s.d)
    if s.is_sparse:
        from kernels.attention.triton_sparse import sparse_attention_triton

        idx = torch.empty(b, s_q, s.topk, dtype=torch.int32, device=meta)
        return lambda: sparse_attention_triton(q, k, v, idx, softmax_scale=scale, **config)
    lens = torch.empty(b, dtype=torch.int32, device=meta) if s.seqlens != "fixed" else None
    if s.mode == "prefill":
        from kernels.attention.triton_prefill import flash_attention_triton as fn
    else:
        from kernels.attention.triton_decode import decode_attention_triton as fn
    return lambda: fn(q, k, v, softmax_scale=scale, seqlens_k=lens, **config)


def _meta_step(s: Shape, config: dict[str, Any], dtype: torch.dtype) -> Callable[[], Any]:
    """decode_step's attention (kernels.common.mla's kernel) on meta tensors laid out as DecodeStepper's
    cache; the split count is chosen from the step's lengths as the kernel would on the host."""
    from kernels.attention.decode_step import DEFAULT_WINDOW
    from kernels.common.mla import triton_decode as td
    from kernels.common.mla.decode_kernels import default_block_m
    from kernels.common.mla.layout import D_QK, D_V

    meta = torch.device("meta")
    b, page = s.batch, s.page_size
    per_seq = -(-(s.s_k + DEFAULT_WINDOW) // page) + 1
    q = torch.empty(b, 1, s.h_q, D_QK, dtype=dtype, device=meta)
    kv = torch.empty(2 * b * per_seq, page, 1, D_QK, dtype=dtype, device=meta)
    table = torch.empty(b, per_seq, dtype=torch.int32, device=meta)
    lens = torch.empty(b, dtype=torch.int32, device=meta)
    tiles = {k: v for k, v in config.items() if k != "num_splits"}
    n = config.get("num_splits")
    if n is None:
        bm = tiles.get("block_m") or default_block_m(s.h_q)
        n = td.choose_num_splits([s.s_k + 1] * b, rows=s.h_q, block_m=bm, page_size=page)
    scale = 1.0 / math.sqrt(D_QK)
    return lambda: td.mla_decode_triton(
        q, kv, table, lens, softmax_scale=scale, d_v=D_V, num_splits=n, **tiles
    )


# The mode's Triton kernel takes the tile keys of CONFIG_KEYS[mode]; the reference takes none.
BACKENDS = Backends("attention")
BACKENDS.add(
    "torch_ref", "fp32-math torch reference (checked against the fp64 one)", reference=True,
    impl=AttentionImpl(_ref_prepare, _ref_attend),
)  # fmt: skip
BACKENDS.add(
    "sdpa", "torch scaled_dot_product_attention (flash/efficient on a GPU, math on a CPU)",
    impl=AttentionImpl(_sdpa_prepare, _sdpa_attend, poison=False),
)  # fmt: skip
BACKENDS.add(
    "triton",
    "Triton kernels: flash-attention forward, split-KV decode, top-k sparse gather",
    config_keys=tuple(sorted(set().union(*CONFIG_KEYS.values()))),
    requires=needs_triton,
    impl=AttentionImpl(_triton_prepare, _triton_attend),
)


class AttentionFamily(KernelFamily):
    name = "attention"
    backends = BACKENDS
    shape_keys = REQUIRED_KEYS
    report_metrics = (
        Metric("latency_per_token_us", "us/token", ".2f"),
        Metric("cos_diff", "cos diff", ".1e"),
        Metric("lse_max_abs_err", "lse err", ".1e"),
        Metric("occupancy", "occupancy", ".2f"),
        Metric("l2_hit_rate_pct", "L2 hit %", ".1f"),
    )
    scaling = (("batch", "latency_per_token_us"),)
    optional_shape_keys = OPTIONAL_KEYS

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        s = parse_shape(shape)
        if backend not in self.backends:
            raise ValueError(f"backend must be one of {sorted(self.backends)} (got {backend!r})")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} (got {dtype!r})")
        if s.mode == "decode_step" and dtype == "float32":
            raise ValueError("decode_step: the paged cache holds bf16 or fp16 (got float32)")
        allowed = CONFIG_KEYS[s.mode] if self.backends[backend].config_keys else set()
        bad = sorted(set(config) - allowed)
        if bad:
            raise ValueError(
                f"config keys {bad} do not apply to {backend} in mode {s.mode} (allowed: {sorted(allowed)})"
            )
        for key, value in config.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config.{key} must be a positive integer (got {value!r})")
            if key in ("block_m", "block_n", "num_warps") and value & (value - 1):
                raise ValueError(f"config.{key} must be a power of two (got {value})")
        if config.get("block_m", 16) < 16 or config.get("block_n", 16) < 16:
            raise ValueError("config.block_m and config.block_n must be >= 16 (tl.dot tiles)")

    def meta_launch(
        self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str
    ) -> Callable[[], Any] | None:
        """The triton backend's launches on meta tensors of the trial's shapes and layouts (no storage),
        for kernels.compiled; None for the torch backends."""
        if not BACKENDS[backend].runs_triton:
            return None
        return _meta_launch(parse_shape(shape), dict(config), DTYPES[dtype])

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        s = parse_shape(shape)
        elem = elem_size(DTYPES[dtype])
        if s.is_sparse:
            sel = s.batch * s.s_q * min(s.topk, s.s_k)
            c = sparse_cost(
                sel,
                distinct=s.batch * min(s.s_k, s.s_q * s.topk),
                batch=s.batch,
                s_q=s.s_q,
                topk=s.topk,
                h_q=s.h_q,
                h_kv=s.h_kv,
                d=s.d,
                d_v=s.d_v,
                elem=elem,
                shared_kv=s.shared_kv,
            )
        else:
            lens = _seqlens(s) or [s.s_k] * s.batch
            if s.mode == "decode_step":
                lens = [n + 1 for n in lens]
            c = dense_cost(
                lens, s_q=s.s_q, h_q=s.h_q, h_kv=s.h_kv, d=s.d, d_v=s.d_v, elem=elem, shared_kv=s.shared_kv
            )
        return c

    def execute(self, req: TrialRequest) -> TrialOutcome:
        self.validate(req.shape, req.config, req.dtype, req.backend)
        shape = parse_shape(req.shape)
        dtype = DTYPES[req.dtype]

        steps = Steps()  # decode_step: the trial's latest step, which every seed's check judges

        def build(seed: int, device: torch.device) -> harness.Prepared:
            prep = prepare(shape, req.backend, req.config, dtype, seed, device, steps)

            def check(result: Pair) -> harness.Checked:
                c = _check(*result, *prep.reference())
                return harness.Checked(c.out, also={"lse": c.lse})

            def figures() -> dict[str, Any]:
                return {"mode": shape.mode, **prep.extra()}

            def resources() -> dict[str, Any]:
                return _resources(req, shape, prep, device)

            return harness.Prepared(
                lambda: prep.run(None), check, prep.cost, figures=figures, resources=resources,
                inputs=prep.inputs,
            )  # fmt: skip

        outcome = harness.run_trial(req, build, precision=precision_of(req.dtype))
        outcome.metrics.update(_attention_metrics(shape, req.backend, torch.device(req.device), outcome))
        return outcome


FAMILY = AttentionFamily()
