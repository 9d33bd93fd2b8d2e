"""The farm's one measurement core: timing, stopping rule, correctness, memory, resources, comparisons.

Pure compute: nothing here imports Ray, a database or HTTP.
"""

import importlib
from typing import Any

# Each name from the submodule that defines it, imported on first use (PEP 562): `kernels.base` needs
# only the policy, and a `farm` command that judges or reports nothing should not pay for torch and
# SciPy (2 s of every CLI start here) because the package's door re-exports them.
_WHERE = {
    "kernels.measure.correctness": (
        "CorrectnessReport", "calc_diff", "check_allclose", "check_calc_diff", "check_flashmla",
        "combine_seeds", "fill_nan", "poison_like", "seed_list",
    ),
    "kernels.measure.memory": ("MemoryReport", "peak_memory"),
    "kernels.measure.policy": ("MeasurePolicy",),
    "kernels.measure.resources": ("H100", "SMLimits", "collect_ncu", "occupancy", "triton_resources"),
    "kernels.measure.stats": ("Comparison", "Step", "compare_samples", "detect_step"),
    "kernels.measure.stopping": ("StoppingRule", "run_stream"),
    "kernels.measure.summary": ("SampleStats", "summarize"),
    "kernels.measure.timing": ("Measurement", "measure"),
}  # fmt: skip
# What the modules above import inside a function, only when it is called (stats: SciPy's stats, for
# compare_samples' exact rank test of a side of 8 samples or fewer); load_all imports them too.
_IMPORTED_ON_USE = ("scipy.stats",)
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def load_all() -> None:
    """Import the whole measurement core now (torch, SciPy): a worker calls it before it reports ready, so
    that no trial's time or timeout pays for the first import (seen: under load every trial of a
    1.5 s timeout timed out, each fresh worker importing SciPy inside its first trial)."""
    for module in (*_WHERE, *_IMPORTED_ON_USE):
        importlib.import_module(module)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels.measure' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = sorted(_MODULE_OF)  # the names _WHERE lists
