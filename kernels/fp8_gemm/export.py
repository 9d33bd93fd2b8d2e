"""The FP8 GEMM family's best-config export: the fastest correct tile config per (N, K) and M, keyed
as the Triton ports of this GEMM key their tuned configs (`farm export best-configs`).

A port's file names the weights' scale block (block_shape=[128,128]): trials at scale_group 64 go to
their own entries, "N=..,K=..,block_shape=[64,64]", and files (`port_file_name`), never into the 128 ones.

Works on any trial records with `backend`, `shape`, `config`, `status`, `correct` and `median_ns`
(the farm passes its stored rows); nothing here reads a database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from kernels.base import fastest_correct
from kernels.fp8_gemm.quant import GROUP
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
    """({"N=..,K=..": {"M": config in Triton-port keys}}, the shapes with no correct config); a scale
    group other than 128 adds ",block_shape=[g,g]" to the N, K key."""

    def key(shape: dict[str, Any]) -> tuple[int, int, int, int]:
        return shape.get("scale_group", GROUP), shape["n"], shape["k"], shape["m"]

    best, none = fastest_correct(trials, backend, key)
    table: dict[str, dict[str, dict[str, int]]] = {}
    for (g, n, k, m), t in best.items():
        table.setdefault(_nk(n, k, g), {})[str(m)] = TileConfig.from_dict(t.config).to_triton_port()
    return table, [f"{_nk(n, k, g)},M={m}" for g, n, k, m in none]


def _nk(n: int, k: int, group: int) -> str:
    return f"N={n},K={k}" + ("" if group == GROUP else f",block_shape=[{group},{group}]")


def port_file_name(nk: str, device_name: str) -> str:
    """The file name the Triton ports of this GEMM look their configs up by (a key of `best_configs`;
    its block_shape, [128,128] where it names none, goes last)."""
    device = device_name.replace(" ", "_")
    nk, _, block = nk.partition(",block_shape=")
    return f"{nk},device_name={device},dtype=fp8_w8a8,block_shape={block or f'[{GROUP},{GROUP}]'}.json"
