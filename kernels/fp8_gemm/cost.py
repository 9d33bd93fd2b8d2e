"""FLOPs and bytes of one FP8 GEMM D[M,N] = A[M,K] x B[N,K]^T (fp8 in, bf16 out, fp32 scales).

FLOPs = 2 M N K. Bytes = each operand read once (M K + N K fp8 bytes) + their scales
(M ceil(K/128) + ceil(N/128) ceil(K/128), 4 bytes each) + D written once (M N x 2): the compulsory
traffic, so GB/s is a lower bound on what the kernel moved. Small-M shapes are memory-bound: judge them
in GB/s, large-M ones in TFLOPS.
"""

from __future__ import annotations

from kernels.base import Cost
from kernels.fp8_gemm.quant import GROUP, cdiv


def gemm_cost(m: int, n: int, k: int) -> Cost:
    kg = cdiv(k, GROUP)
    scales = (m * kg + cdiv(n, GROUP) * kg) * 4
    return Cost(
        flops=2.0 * m * n * k, bytes_read=float(m * k + n * k + scales), bytes_written=float(m * n * 2)
    )
