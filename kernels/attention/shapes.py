"""Shape points of the attention family: the keys a spec writes, their per-mode defaults, validation.

Every point has `mode`, `batch`, `s_q`, `s_k`, `h_q`. Optional keys (defaults by mode):
  h_kv       KV heads (GQA; h_q must be a multiple). Default h_q; the MLA modes have exactly 1.
  d, d_v     QK and V head dims. Default 128 / d; the MLA modes are fixed at 576 / 512.
  topk       positions per query token: required by the sparse modes, refused by the others.
  shared_kv  V is the first d_v channels of K (the MLA latent cache). Default false; true for MLA.
  seqlens    "fixed" (every sequence has s_k keys) or "uniform" (seeded lengths in [1, s_k]);
             dense decode modes only. Default "fixed".
  page_size  decode_step only: the paged cache's page size (default 64).
Modes:
  prefill        causal dense attention, s_q == s_k usually          (Triton: flash-attention forward)
  decode         causal dense attention, few query tokens, GQA      (Triton: split-KV decode)
  mla_decode     the MLA latent form: 1 KV head, d 576, V inside K  (Triton: split-KV decode)
  sparse_prefill top-k sparse attention, many query tokens          (Triton: sparse gather kernel)
  sparse_decode  top-k sparse attention, few query tokens           (Triton: sparse gather kernel)
  decode_step    paged MLA: KV append into kernels.common.mla's cache + decode, timed as one step;
                 s_k is the context before the step, s_q must be 1   (Triton: paged_mla split-KV decode)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels.common.mla.layout import MAX_PAGE_SIZE

MODES = ("prefill", "decode", "mla_decode", "sparse_prefill", "sparse_decode", "decode_step")
DECODE_MODES = frozenset({"decode", "mla_decode", "sparse_decode", "decode_step"})
SPARSE_MODES = frozenset({"sparse_prefill", "sparse_decode"})
MLA_MODES = frozenset({"mla_decode", "decode_step"})
REQUIRED_KEYS = ("mode", "batch", "s_q", "s_k", "h_q")
OPTIONAL_KEYS = ("h_kv", "d", "d_v", "topk", "shared_kv", "seqlens", "page_size")
SEQLEN_DISTS = ("fixed", "uniform")


@dataclass(frozen=True)
class Shape:
    mode: str
    batch: int
    s_q: int
    s_k: int
    h_q: int
    h_kv: int
    d: int
    d_v: int
    topk: int = 0
    shared_kv: bool = False
    seqlens: str = "fixed"
    page_size: int = 64

    @property
    def tokens(self) -> int:
        """Query tokens one call produces (the per-token latency divides by this)."""
        return self.batch * self.s_q

    @property
    def is_decode(self) -> bool:
        return self.mode in DECODE_MODES

    @property
    def is_sparse(self) -> bool:
        return self.mode in SPARSE_MODES


def _pos_int(shape: dict[str, Any], key: str) -> int:
    value = shape[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"shape.{key} must be a positive integer (got {value!r})")
    return value


def parse_shape(shape: dict[str, Any]) -> Shape:
    """A validated Shape with the mode's defaults filled in; ValueError names the bad key."""
    missing = [k for k in REQUIRED_KEYS if k not in shape]
    if missing:
        raise ValueError(f"shape needs the keys {', '.join(missing)} (got {sorted(shape)})")
    unknown = sorted(set(shape) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ValueError(f"shape has unknown keys {unknown} (known: {REQUIRED_KEYS + OPTIONAL_KEYS})")
    mode = shape["mode"]
    if mode not in MODES:
        raise ValueError(f"shape.mode must be one of {', '.join(MODES)} (got {mode!r})")
    ints = {
        k: _pos_int(shape, k)
        for k in ("batch", "s_q", "s_k", "h_q") + OPTIONAL_KEYS
        if k in shape and k not in ("shared_kv", "seqlens")
    }
    mla = mode in MLA_MODES
    h_kv = ints.get("h_kv", 1 if mla else ints["h_q"])
    d = ints.get("d", 576 if mla else 128)
    d_v = ints.get("d_v", 512 if mla else d)
    shared = shape.get("shared_kv", mla)
    if not isinstance(shared, bool):
        raise ValueError(f"shape.shared_kv must be true or false (got {shared!r})")
    if mla and (h_kv, d, d_v, shared) != (1, 576, 512, True):
        raise ValueError(f"mode {mode} is the MLA latent form: h_kv 1, d 576, d_v 512, shared_kv true")
    if ints["h_q"] % h_kv:
        raise ValueError(f"shape.h_q ({ints['h_q']}) must be a multiple of shape.h_kv ({h_kv})")
    if d < 16:
        raise ValueError(f"shape.d must be >= 16 (got {d})")
    if shared and d_v > d:
        raise ValueError(f"shape.d_v ({d_v}) must be <= shape.d ({d}) when shared_kv is true")
    sparse = mode in SPARSE_MODES
    if sparse != ("topk" in shape):
        raise ValueError(
            f"shape.topk is {'required' if sparse else 'only for the sparse modes'} (mode {mode})"
        )
    seqlens = shape.get("seqlens", "fixed")
    if seqlens not in SEQLEN_DISTS:
        raise ValueError(f"shape.seqlens must be one of {SEQLEN_DISTS} (got {seqlens!r})")
    if seqlens != "fixed" and mode not in ("decode", "mla_decode"):
        raise ValueError(f"shape.seqlens {seqlens!r} applies to the decode and mla_decode modes only")
    if "page_size" in shape and mode != "decode_step":
        raise ValueError("shape.page_size applies to mode decode_step only")
    if ints.get("page_size", 1) > MAX_PAGE_SIZE:
        raise ValueError(f"shape.page_size must be at most {MAX_PAGE_SIZE} tokens (got {ints['page_size']})")
    if mode == "decode_step" and ints["s_q"] != 1:
        raise ValueError(
            f"decode_step appends and attends one token per sequence: shape.s_q must be 1 (got {ints['s_q']})"
        )
    if mode == "prefill" and ints["s_q"] > ints["s_k"]:
        raise ValueError(f"prefill needs s_q <= s_k (got s_q {ints['s_q']}, s_k {ints['s_k']})")
    return Shape(
        mode=mode,
        batch=ints["batch"],
        s_q=ints["s_q"],
        s_k=ints["s_k"],
        h_q=ints["h_q"],
        h_kv=h_kv,
        d=d,
        d_v=d_v,
        topk=ints.get("topk", 0),
        shared_kv=shared,
        seqlens=seqlens,
        page_size=ints.get("page_size", 64),
    )
