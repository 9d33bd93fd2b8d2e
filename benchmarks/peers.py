"""`make gpu-check`'s peer step: FlashMLA and DeepGEMM, where installed, against the project's kernels.

On a GPU host where `flash_mla` or `deep_gemm` imports, a few shapes run through the library and through
the project's Triton kernel on the same inputs, and the project's output is judged against the library's
by the peer's own rule, beside both timings (the farm's measurement core, kernels.measure, under the
gpu-check spec's policy):
  flash_mla bf16     dense decode, bf16 cache, page 64: out and lse by FlashMLA's test tolerances
                     (kernels.common.mla.check.check_decode, the library's output in the reference's place)
  flash_mla fp8      FlashMLA's sparse decode over its 656-byte fp8 cache with every cached token indexed
                     (s_q 1, so it is the dense decode the project's fp8_flashmla path computes): the
                     same bytes, the same tolerances
  deep_gemm          fp8_gemm_nt with 1x128 / 128x128 scales: calc_diff(project, DeepGEMM) below 1e-3,
                     DeepGEMM's own rule, and each against the bf16 product
A library that does not import is one row saying why (`skipped`); a comparison that raises is a row with
the error (`error`), so one refusal does not hide the others. `FAIL` rows fail the check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FLASH_MLA_SHAPES = (  # (batch, seqlen, h_q, s_q): FlashMLA's decode shapes, small enough for the check
    (64, 4096, 128, 1),
    (64, 4096, 128, 2),
    (64, 1024, 16, 1),
)
FLASH_MLA_FP8_SHAPES = ((64, 2048, 128),)  # (batch, seqlen = topk, h_q); FlashMLA's sparse h_q: 64, 128
DEEP_GEMM_SHAPES = ((128, 2112, 7168), (4096, 7168, 2048))  # (m, n, k), DeepSeek-V3 shapes
PAGE = 64


def judge_decode(out: Any, lse: Any, peer_out: Any, peer_lse: Any) -> tuple[bool, str]:
    """The project's decode output against a peer's, by FlashMLA's tolerances (the peer as reference)."""
    from kernels.common.mla.check import check_decode

    report = check_decode(out, lse, peer_out.float(), peer_lse.float())
    return report.passed, report.message


def judge_gemm(d: Any, peer_d: Any, bf16_ref: Any) -> tuple[bool, str]:
    """The project's D against DeepGEMM's by calc_diff (< 1e-3), with each one's calc_diff to the bf16
    product beside it."""
    from kernels.fp8_gemm.check import CALC_DIFF_THRESHOLD
    from kernels.measure.correctness import calc_diff

    between = calc_diff(d, peer_d)
    ours, theirs = calc_diff(d, bf16_ref), calc_diff(peer_d, bf16_ref)
    passed = between < CALC_DIFF_THRESHOLD
    return passed, f"calc_diff to DeepGEMM {between:.2e}; to bf16: project {ours:.2e}, DeepGEMM {theirs:.2e}"


def _time_us(fn: Callable[[], object], policy: Any) -> float:
    from kernels.measure.timing import measure

    return measure(fn, policy, device="cuda").summary.median / 1e3


def _judged(verdict: tuple[bool, str], peer: Callable[[], object], ours: Callable[[], object], policy: Any):
    """A comparison's row fields: the verdict, then both calls timed (after the outputs were judged)."""
    passed, detail = verdict
    return {
        "passed": passed,
        "detail": detail,
        "peer_us": _time_us(peer, policy),
        "ours_us": _time_us(ours, policy),
    }


def _row(peer: str, case: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": peer, "case": case}
    try:
        row.update(fn())
        row["verdict"] = "pass" if row.pop("passed") else "FAIL"
    except Exception as e:  # noqa: BLE001 - a refusal is a row of the summary, not the end of the check
        row.update(verdict="error", detail=f"{type(e).__name__}: {e}")
    return row


def _decode_backend(name: str, x: Any) -> Callable[[], Any]:
    """The paged MLA family's registered backend `name` on these inputs, as a trial builds it (its split
    plan built once, before anything is timed)."""
    import torch

    from kernels.paged_mla.case import FAMILY

    call, _info = FAMILY.backends.impl(name)(x, {}, torch.device("cuda"))
    return call


def _flash_mla_dense(shape: tuple[int, int, int, int], policy: Any) -> dict[str, Any]:
    from kernels.paged_mla.inputs import build_decode_inputs

    batch, seqlen, h_q, s_q = shape
    x = build_decode_inputs([seqlen] * batch, h_q=h_q, s_q=s_q, page_size=PAGE, device="cuda")
    peer, ours = _decode_backend("flash_mla", x), _decode_backend("triton", x)
    return _judged(judge_decode(*ours(), *peer()), peer, ours, policy)


def _flash_mla_fp8(shape: tuple[int, int, int], policy: Any) -> dict[str, Any]:
    import torch

    from kernels.paged_mla import flash_mla_adapter
    from kernels.paged_mla.inputs import build_decode_inputs

    batch, seqlen, h_q = shape
    x = build_decode_inputs([seqlen] * batch, h_q=h_q, page_size=PAGE, kv_dtype="fp8_flashmla", device="cuda")
    fm = flash_mla_adapter.load_flash_mla()
    # every cached token of each sequence, as FlashMLA's sparse indices: page id x page size + slot
    slots = torch.arange(seqlen, device="cuda")
    pages = x.block_table[:, slots // PAGE].long()
    indices = (pages * PAGE + slots % PAGE).to(torch.int32)[:, None, :].contiguous()  # [b, 1, topk]
    meta, _ = fm.get_mla_metadata()

    def peer() -> Any:
        return fm.flash_mla_with_kvcache(
            x.q, x.kv_cache, None, None, x.d_v, meta, None, softmax_scale=x.softmax_scale,
            is_fp8_kvcache=True, indices=indices,
        )  # fmt: skip

    ours = _decode_backend("triton", x)
    return _judged(judge_decode(*ours(), *peer()), peer, ours, policy)


TRITON_GEMM_TILE = dict(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3)


def _deep_gemm(shape: tuple[int, int, int], policy: Any) -> dict[str, Any]:
    from kernels.fp8_gemm.case import BACKENDS
    from kernels.fp8_gemm.inputs import build_inputs
    from kernels.fp8_gemm.reference import gemm_bf16
    from kernels.fp8_gemm.tiles import TileConfig

    m, n, k = shape
    x = build_inputs(m, n, k, seed=0, device="cuda")
    peer = BACKENDS.impl("deep_gemm")(x, None)[0]
    ours = BACKENDS.impl("triton")(x, TileConfig.from_dict(TRITON_GEMM_TILE))[0]
    return _judged(judge_gemm(ours(), peer(), gemm_bf16(x.a, x.b)), peer, ours, policy)


def peer_rows(policy: Any) -> list[dict[str, Any]]:
    """Every peer comparison this host can run; one `skipped` row per library that is not there."""
    from kernels.fp8_gemm import deep_gemm_adapter
    from kernels.paged_mla import flash_mla_adapter

    rows: list[dict[str, Any]] = []
    reason = flash_mla_adapter.unavailable_reason()
    if reason:
        rows.append({"peer": "flash_mla", "case": "-", "verdict": "skipped", "detail": reason})
    else:
        for s in FLASH_MLA_SHAPES:
            case = f"bf16 batch={s[0]} seqlen={s[1]} h_q={s[2]} s_q={s[3]}"
            rows.append(_row("flash_mla", case, lambda s=s: _flash_mla_dense(s, policy)))
        for s in FLASH_MLA_FP8_SHAPES:
            case = f"fp8_flashmla batch={s[0]} seqlen={s[1]} h_q={s[2]} s_q=1"
            rows.append(_row("flash_mla", case, lambda s=s: _flash_mla_fp8(s, policy)))
    reason = deep_gemm_adapter.unavailable_reason()
    if reason:
        rows.append({"peer": "deep_gemm", "case": "-", "verdict": "skipped", "detail": reason})
    else:
        for s in DEEP_GEMM_SHAPES:
            rows.append(_row("deep_gemm", f"m={s[0]} n={s[1]} k={s[2]}", lambda s=s: _deep_gemm(s, policy)))
    return rows


def render_peers(rows: list[dict[str, Any]]) -> list[str]:
    """summary.txt's peer section: one line per comparison, timings beside the verdict."""
    lines = ["", "== peers (the project's Triton kernels against FlashMLA / DeepGEMM on the same inputs)"]
    for r in rows:
        times = ""
        if r.get("peer_us") is not None and r.get("ours_us") is not None:
            ratio = r["peer_us"] / r["ours_us"]
            times = f"  peer {r['peer_us']:.1f} us, project {r['ours_us']:.1f} us ({ratio:.2f}x)"
        lines.append(f"  {r['peer']:<9} {r['case']:<42} {r['verdict']:<7}{times}  {r.get('detail', '')}")
    return lines


def failed_peers(rows: list[dict[str, Any]]) -> list[str]:
    return [f"peer {r['peer']} {r['case']}: {r.get('detail', '')}" for r in rows if r["verdict"] == "FAIL"]
