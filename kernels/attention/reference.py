"""Torch references for the attention family. They run anywhere (CPU included).

Precision: the correctness reference computes in fp64 (`dtype=torch.float64`, the default), so no
backend is ever checked against itself: the `torch_ref` backend runs the same code in fp32 and is
checked against the fp64 answer like every other backend.

Causal rule (bottom-right aligned, as in decode and FlashMLA): with s_q queries over s_k keys, query i
sees keys 0 .. s_k - s_q + i. For s_q == s_k this is the usual lower triangle; for s_q == 1 the query
sees every key. `seqlens_k [b]` (optional) gives each sequence its own key count s_k_b <= s_k; keys at
or past s_k_b do not exist and the causal rule uses s_k_b in place of s_k.

GQA: query head h reads KV head h // (h_q // h_kv). The MLA latent form is GQA with one KV head, a
576-channel key (512 latent + 64 rope) and V = the first 512 channels of the same cached row.

Top-k sparse attention (DeepSeek sparse attention), FlashMLA's semantics: `indices [b, s_q, topk]` int,
shared by all heads of a query token. The query attends to its index SLOTS:
  - each valid slot gathers its key once, so a position named twice enters the softmax twice (its weight
    doubles): there is no de-duplication, as in FlashMLA's sparse references. The reference counts how
    many valid slots name each position (`sparse_counts`) and adds log(count) to its score, which is
    the softmax over slots; the Triton kernel walks the slots as they are;
  - an index outside [0, s_k_b) (in particular -1) is padding: an invalid slot, nothing read;
  - no causal mask is applied on top: the indexer only proposes visible keys.

lse is the natural logarithm of the softmax denominator (scale applied to the scores). Empty rows (a query
that sees no key: a zero-length sequence, causal with s_q > s_k_b, or only padding indices) have
out = EMPTY_ROW_OUT (0) and lse = EMPTY_ROW_LSE (+inf), the convention of kernels.common.lse (FlashMLA's).
"""

from __future__ import annotations

import torch

from kernels.common.lse import finish_empty_rows, scale_of

MLA_D_QK = 576
MLA_D_V = 512


def causal_mask(s_q: int, s_k: int, seqlens_k: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """[b, s_q, s_k] bool: key j visible to query i iff j < s_k_b and j <= s_k_b - s_q + i."""
    lens = _lens(seqlens_k, s_k, batch, device)
    j = torch.arange(s_k, device=device)[None, None, :]
    i = torch.arange(s_q, device=device)[None, :, None]
    last = lens[:, None, None] - s_q + i
    return (j <= last) & (j < lens[:, None, None])


def length_mask(s_q: int, s_k: int, seqlens_k: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """[b, s_q, s_k] bool: key j exists (j < s_k_b), no causal rule."""
    lens = _lens(seqlens_k, s_k, batch, device)
    j = torch.arange(s_k, device=device)[None, None, :]
    return (j < lens[:, None, None]).expand(batch, s_q, s_k)


def sparse_counts(indices: torch.Tensor, s_k: int, seqlens_k: torch.Tensor | None = None) -> torch.Tensor:
    """[b, s_q, s_k] int32: how many valid slots of query i's indices name position j (0: not selected;
    2: named twice, counted twice). Padding (outside [0, s_k_b)) counts nowhere."""
    b, s_q, _ = indices.shape
    lens = _lens(seqlens_k, s_k, b, indices.device)
    idx = indices.long()
    ok = (idx >= 0) & (idx < lens[:, None, None])
    counts = torch.zeros(b, s_q, s_k + 1, dtype=torch.int32, device=indices.device)
    counts.scatter_add_(-1, torch.where(ok, idx, s_k), torch.ones_like(idx, dtype=torch.int32))
    return counts[..., :s_k]  # padding landed in the extra column


def _lens(seqlens_k: torch.Tensor | None, s_k: int, batch: int, device) -> torch.Tensor:
    if seqlens_k is None:
        return torch.full((batch,), s_k, dtype=torch.long, device=device)
    lens = seqlens_k.to(device=device, dtype=torch.long)
    if lens.shape != (batch,) or bool((lens < 0).any()) or bool((lens > s_k).any()):
        raise ValueError(f"seqlens_k must be [{batch}] in [0, {s_k}], got {seqlens_k.tolist()}")
    return lens


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    softmax_scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention restricted to `mask [b, s_q, s_k]`, math in `dtype`, GQA without expanding K/V.

    `mask` is bool (key visible or not) or an integer multiplicity (`sparse_counts`: a key counted c
    times enters the softmax c times, i.e. its score gets + log c; 0 hides it). Keys no query may see are
    zeroed first, so NaN poison in unused K/V memory cannot leak through a 0 x NaN product. Returns
    out [b, s_q, h_q, d_v] and lse [b, h_q, s_q] (natural log), both in `dtype`; a row that sees no key
    gets out 0 and lse +inf (kernels.common.lse).
    """
    b, s_q, h_q, d = q.shape
    _, s_k, h_kv, d_k = k.shape
    if d_k != d or v.shape[:3] != (b, s_k, h_kv) or k.shape[0] != b:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if h_q % h_kv:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    group = h_q // h_kv
    scale = scale_of(d, softmax_scale)
    weight = mask.to(dtype)  # 1 / 0, or the multiplicity
    used = (weight > 0).any(dim=1)[:, :, None, None]  # [b, s_k, 1, 1]: keys some query sees
    kf = torch.where(used, k.to(dtype), 0.0)
    vf = torch.where(used, v.to(dtype), 0.0)
    qf = q.to(dtype).reshape(b, s_q, h_kv, group, d)
    scores = torch.einsum("bqhgd,bkhd->bhgqk", qf, kf) * scale
    scores = scores + torch.log(weight)[:, None, None]  # log 1 = 0, log 0 = -inf (hidden)
    lse = torch.logsumexp(scores, dim=-1)  # [b, h_kv, group, s_q], -inf for empty rows
    empty = torch.isneginf(lse)
    p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])  # 0 everywhere in an empty row
    out = torch.einsum("bhgqk,bkhv->bqhgv", p, vf).reshape(b, s_q, h_q, v.shape[-1])
    return out, finish_empty_rows(lse.reshape(b, h_q, s_q))


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    seqlens_k: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention (prefill or decode), causal bottom-right aligned, GQA."""
    b, s_q = q.shape[:2]
    make = causal_mask if causal else length_mask
    return masked_attention(q, k, v, make(s_q, k.shape[1], seqlens_k, b, q.device), softmax_scale, dtype)


def sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    seqlens_k: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k sparse attention: each query token attends to the valid slots of indices[b, i], a position
    named twice counted twice (FlashMLA's semantics, see the module docstring)."""
    if indices.shape[:2] != q.shape[:2]:
        raise ValueError(f"indices {tuple(indices.shape)} must be [b, s_q, topk] for q {tuple(q.shape)}")
    counts = sparse_counts(indices, k.shape[1], seqlens_k)
    return masked_attention(q, k, v, counts, softmax_scale, dtype)


def mla_decode_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    *,
    d_v: int = MLA_D_V,
    softmax_scale: float | None = None,
    seqlens_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLA latent decode form over a contiguous latent cache: q [b, s_q, h_q, 576], kv [b, s_k, 1, 576],
    V = kv[..., :512]. (The paged form is kernels.common.mla.reference.mla_decode_reference.)"""
    return attention_reference(
        q, kv, kv[..., :d_v], causal=True, softmax_scale=softmax_scale, seqlens_k=seqlens_k
    )
