"""The FP8 GEMM family's best-config export: the fastest correct tile config per (N, K) and M, keyed
as the Triton ports of this GEMM key their tuned configs (`farm export best-configs`).

Works on any trial records with `backend`, `shape`, `config`, `status`, `correct` and `median_ns`
(the farm passes its stored rows); nothing here reads a database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from kernels.base import fastest_correct
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
    best, none = fastest_correct(trials, backend, lambda shape: (shape["n"], shape["k"], shape["m"]))
    table: dict[str, dict[str, dict[str, int]]] = {}
    for (n, k, m), t in best.items():
        table.setdefault(f"N={n},K={k}", {})[str(m)] = TileConfig.from_dict(t.config).to_triton_port()
    return table, [f"N={n},K={k},M={m}" for n, k, m in none]


def port_file_name(nk: str, device_name: str) -> str:
    """The file name the Triton ports of this GEMM look their configs up by."""
    device = device_name.replace(" ", "_")
    return f"{nk},device_name={device},dtype=fp8_w8a8,block_shape=[128,128].json"
