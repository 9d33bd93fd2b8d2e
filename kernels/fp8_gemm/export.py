"""The FP8 GEMM family's best-config export: the fastest correct tile config per (N, K) and M, keyed
as the Triton ports of this GEMM key their tuned configs (`farm export best-configs`).

Works on any trial records with `backend`, `shape`, `config`, `status`, `correct` and `median_ns`
(the farm passes its stored rows); nothing here reads a database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from kernels.base import TrialStatus
from kernels.fp8_gemm.tiles import TileConfig


class TrialRecord(Protocol):
    backend: str
    shape: dict[str, Any]
    config: dict[str, Any]
    status: str
    correct: bool | None
    median_ns: float | None


def best_configs(
    trials: Iterable[TrialRecord], backend: str = "triton"
) -> tuple[dict[str, dict[str, dict[str, int]]], list[str]]:
    """({"N=..,K=..": {"M": config in Triton-port keys}}, the shapes with no correct config)."""
    best: dict[tuple[int, int, int], TrialRecord] = {}
    shapes: set[tuple[int, int, int]] = set()
    for t in trials:
        if t.backend != backend:
            continue
        key = (t.shape["n"], t.shape["k"], t.shape["m"])
        shapes.add(key)
        if t.status == TrialStatus.OK and t.correct and t.median_ns is not None:
            if key not in best or t.median_ns < best[key].median_ns:  # type: ignore[operator]
                best[key] = t
    table: dict[str, dict[str, dict[str, int]]] = {}
    for n, k, m in sorted(best):
        entry = TileConfig.from_dict(best[(n, k, m)].config).to_triton_port()
        table.setdefault(f"N={n},K={k}", {})[str(m)] = entry
    missing = [f"N={n},K={k},M={m}" for n, k, m in sorted(shapes - set(best))]
    return table, missing


def port_file_name(nk: str, device_name: str) -> str:
    """The file name the Triton ports of this GEMM look their configs up by."""
    device = device_name.replace(" ", "_")
    return f"{nk},device_name={device},dtype=fp8_w8a8,block_shape=[128,128].json"
