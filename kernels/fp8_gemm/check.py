"""Correctness of an FP8 GEMM output: DeepGEMM's calc_diff over the whole product, plus a per-tile check.

calc_diff is a global measure: zeroing one 128x128 tile of a 4096x7168 product moves it by only ~3e-4
(f / (2 - f) for a fraction f of zeroed elements), so a kernel that gets a tail tile wrong still passes
calc_diff < 1e-3. The tile check catches that: the output is cut into TILE x TILE tiles (the last ones
narrower) and each tile's error is

    tile_err = max |out - ref| over the tile / max(max |ref| over the tile, rms(ref) over the product)

the largest error in the tile relative to the tile's largest reference value (the product's rms floors
the denominator, so a small tail tile whose reference happens to be near zero is not judged on noise).
The fp8 quantization of both operands gives tile_err of 0.04-0.065 against the bf16 product on
standard-normal inputs (0.064 the worst tile of a 4096x7168 product); a zeroed tile gives 1, a tile
computed with a scale off by 25% gives ~0.2. A tile fails above TILE_ERR_LIMIT; NaN fails.

Stricter than DeepGEMM's own tests, by design. DeepGEMM judges its kernels by calc_diff < 1e-3 alone, and
the fp8 quantization of standard-normal operands already puts calc_diff near 6.8e-4; so a 4096x7168
product with one of its 1792 tiles zeroed scores 9.6e-4 to 9.8e-4 (by seed and tile) and passes
DeepGEMM's criterion, while the tile check here fails it (tile error 1). A result DeepGEMM's tests would
pass can thus be `incorrect` on the farm: intended (the farm judges ports of a kernel, and a wrong tail
tile is a bug), not a disagreement about the numbers (calc_diff is DeepGEMM's formula, in float64).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from kernels.measure.correctness import CorrectnessReport, check_calc_diff

TILE = 128
TILE_ERR_LIMIT = 0.15
CALC_DIFF_THRESHOLD = 1e-3


def tile_errors(out: torch.Tensor, ref: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """float64 [ceil(M/tile), ceil(N/tile)]: each tile's max error relative to its reference (see module
    docstring). NaN where the output (or reference) holds a NaN in that tile."""
    if out.shape != ref.shape or out.dim() != 2:
        raise ValueError(f"tile_errors needs two 2-D tensors of one shape (got {tuple(out.shape)} and "
                         f"{tuple(ref.shape)})")  # fmt: skip
    m, n = ref.shape
    mt, nt = -(-m // tile), -(-n // tile)
    y = ref.detach().to(torch.float64)
    err = (out.detach().to(torch.float64) - y).abs()
    pad = (0, nt * tile - n, 0, mt * tile - m)  # zero padding changes no tile's maximum

    def tile_max(t: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(t, pad).view(mt, tile, nt, tile)
        return padded.amax(dim=(1, 3))  # amax propagates NaN

    floor = math.sqrt(float((y * y).mean())) if y.numel() else 0.0
    scale = tile_max(y.abs()).clamp(min=floor if floor > 0 else torch.finfo(torch.float64).tiny)
    return tile_max(err) / scale


def check_fp8_gemm(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    threshold: float = CALC_DIFF_THRESHOLD,
    tile: int = TILE,
    tile_limit: float = TILE_ERR_LIMIT,
) -> CorrectnessReport:
    """calc_diff below `threshold` AND every tile's error at most `tile_limit`. The report is
    check_calc_diff's with method "calc_diff+tiles"; a failing tile makes it fail, `mismatches` adds the
    failing tiles, `worst_index` is then the worst tile's first element, and the message names it."""
    report = check_calc_diff(out, ref, threshold=threshold)
    if out.shape != ref.shape:
        return replace(report, method="calc_diff+tiles")
    errs = tile_errors(out, ref, tile)
    failing = ~(errs <= tile_limit)  # NaN fails
    n_failing = int(failing.sum())
    worst = float(torch.nan_to_num(errs, nan=math.inf).max()) if errs.numel() else 0.0
    summary = f"worst {tile}x{tile} tile error {worst:.3g} (limit {tile_limit:g})"
    if not n_failing:
        message = summary if report.passed else f"{report.message}; {summary}"
        return replace(report, method="calc_diff+tiles", message=message)
    flat = int(torch.argmax(torch.nan_to_num(errs, nan=math.inf)))
    ti, tj = divmod(flat, errs.shape[1])
    tiles = f"{n_failing} of {errs.numel()} tiles over the limit, worst tile ({ti}, {tj}) at rows " \
            f"{ti * tile}.. cols {tj * tile}..: error {worst:.3g} > {tile_limit:g}"  # fmt: skip
    message = tiles if report.passed else f"{report.message}; {tiles}"
    return replace(
        report,
        method="calc_diff+tiles",
        passed=False,
        mismatches=report.mismatches + n_failing,
        worst_index=(ti * tile, tj * tile),
        message=message,
    )


def worst_tile_error(out: torch.Tensor, ref: torch.Tensor, tile: int = TILE) -> float:
    """The largest tile error of the product (inf where a tile holds a NaN): the metric `tile_err`."""
    errs = tile_errors(out, ref, tile)
    return float(torch.nan_to_num(errs, nan=math.inf).max()) if errs.numel() else 0.0
