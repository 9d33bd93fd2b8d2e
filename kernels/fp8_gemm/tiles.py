"""Tile configurations of the FP8 GEMM and the two config spaces of REFERENCE.md.

TileConfig is what the Triton kernel takes (the trial's config dict, lower-case keys). Triton ports of
this GEMM key their tuned configs by M with upper-case names (BLOCK_SIZE_M, ..., num_stages):
`to_triton_port` / `from_triton_port` convert, `nearest_m` picks the entry a port would use for an M.

Spaces:
  triton_port_space()   the product the Triton ports tune over (powers of two; the kernel needs them)
DeepGEMM's SM90 space (`deepgemm_space`, `deepgemm_choice`) is built on the resource model and lives
with it in kernels.fp8_gemm.resources.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kernels.fp8_gemm.quant import GROUP, SCALE_GROUPS

CONFIG_KEYS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")
TRITON_PORT_KEYS = {
    "block_m": "BLOCK_SIZE_M",
    "block_n": "BLOCK_SIZE_N",
    "block_k": "BLOCK_SIZE_K",
    "group_m": "GROUP_SIZE_M",
    "num_warps": "num_warps",
    "num_stages": "num_stages",
}


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int = GROUP
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TileConfig:
        """Build from a trial's config dict; ValueError naming the field for a bad or missing value."""
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"unknown config keys {unknown} (known: {', '.join(CONFIG_KEYS)})")
        missing = [k for k in ("block_m", "block_n") if k not in config]
        if missing:
            raise ValueError(f"config needs {', '.join(missing)}")
        for key, value in config.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"config.{key} must be an integer (got {value!r})")
        cfg = cls(**dict(config))
        cfg.check()
        return cfg

    def check(self) -> None:
        """What the kernel itself needs at some scale group (the resource model judges the rest, the
        trial's scale group included: a block_k of 128 at scale_group 64 is pruned there)."""
        for key in ("block_m", "block_n", "block_k"):
            v = getattr(self, key)
            if not _is_pow2(v) or v < 16:
                raise ValueError(f"config.{key} must be a power of two >= 16 (tl.arange, tl.dot) (got {v})")
        if self.block_k < 32:
            raise ValueError(
                f"config.block_k must be >= 32: an fp8 tl.dot needs K >= 32 and fails to compile below "
                f"(got {self.block_k})"
            )
        if max(SCALE_GROUPS) % self.block_k:
            raise ValueError(
                f"config.block_k must divide the scale group ({', '.join(map(str, SCALE_GROUPS))}) so one K "
                f"step has one scale (got {self.block_k})"
            )
        if self.group_m < 1:
            raise ValueError(f"config.group_m must be >= 1 (got {self.group_m})")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"config.num_warps must be one of 1, 2, 4, 8, 16 (got {self.num_warps})")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"config.num_stages must be in 1..8 (got {self.num_stages})")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def to_triton_port(self) -> dict[str, int]:
        return {TRITON_PORT_KEYS[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_triton_port(cls, entry: Mapping[str, int]) -> TileConfig:
        back = {v: k for k, v in TRITON_PORT_KEYS.items()}
        return cls.from_dict({back[k]: v for k, v in entry.items() if k in back})

    def label(self) -> str:
        tile = f"{self.block_m}x{self.block_n}x{self.block_k}"
        return f"{tile} g{self.group_m} w{self.num_warps} s{self.num_stages}"


def triton_port_space(
    block_m: Iterable[int] = (16, 32, 64, 128, 256),
    block_n: Iterable[int] = (32, 64, 128, 256),
    block_k: Iterable[int] = (128,),
    group_m: Iterable[int] = (1, 16, 32, 64),
    num_warps: Iterable[int] = (4, 8),
    num_stages: Iterable[int] = (2, 3, 4, 5),
) -> list[TileConfig]:
    """Every combination (unpruned: run it through resources.estimate to prune)."""
    axes = (block_m, block_n, block_k, group_m, num_warps, num_stages)
    return [TileConfig(*combo) for combo in itertools.product(*axes)]


def nearest_m(keys: Iterable[int | str], m: int) -> int:
    """The M key a Triton port uses for a GEMM with `m` rows: the one nearest to m (lower on a tie)."""
    ms = sorted(int(k) for k in keys)
    if not ms:
        raise ValueError("no M keys to choose from")
    return min(ms, key=lambda key: (abs(key - m), key))
