"""FLOPs and bytes of one FP8 GEMM D[M,N] = A[M,K] x B[N,K]^T (fp8 in, bf16 out, fp32 scales).

FLOPs = 2 M N K. Bytes = each operand read once (M K + N K fp8 bytes) + their scales at the scale group
g (M ceil(K/g) + ceil(N/g) ceil(K/g), 4 bytes each; g = 128 by default, or 64) + D written once
(M N x 2): the compulsory traffic, so GB/s is a lower bound on what the kernel moved. Small-M shapes are
memory-bound: judge them in GB/s, large-M ones in TFLOPS.
"""

from __future__ import annotations

from kernels.base import Cost
from kernels.fp8_gemm.quant import GROUP, cdiv


def gemm_cost(m: int, n: int, k: int, scale_group: int = GROUP) -> Cost:
    """The Cost of one GEMM; the arguments are a shape's keys (gemm_cost(**shape) works)."""
    kg = cdiv(k, scale_group)
    scales = (m * kg + cdiv(n, scale_group) * kg) * 4
    return Cost(
        flops=2.0 * m * n * k, bytes_read=float(m * k + n * k + scales), bytes_written=float(m * n * 2)
    )
