"""Kernel families by name. A family is imported only when a spec or a worker asks for it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernels.base import Family

# name -> module holding FAMILY
FAMILIES: dict[str, str] = {
    "attention": "kernels.attention.case",
    "fp8_gemm": "kernels.fp8_gemm.case",
    "gemm": "kernels.gemm.case",
    "paged_mla": "kernels.paged_mla.case",
    "probe": "kernels.probe.case",
}


class UnknownFamily(KeyError):
    def __str__(self) -> str:
        return f"unknown kernel family {self.args[0]!r} (known: {', '.join(sorted(FAMILIES))})"


def get_family(name: str) -> Family:
    try:
        module = FAMILIES[name]
    except KeyError:
        raise UnknownFamily(name) from None
    return importlib.import_module(module).FAMILY
