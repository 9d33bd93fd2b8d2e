"""The farm's one measurement core: timing, stopping rule, correctness, memory, resources, comparisons.

Pure compute: nothing here imports Ray, a database or HTTP.
"""

from kernels.measure.correctness import (
    CorrectnessReport,
    calc_diff,
    check_allclose,
    check_calc_diff,
    check_flashmla,
    combine_seeds,
    fill_nan,
    poison_like,
    seed_list,
)
from kernels.measure.memory import MemoryReport, peak_memory
from kernels.measure.policy import MeasurePolicy
from kernels.measure.resources import H100, SMLimits, collect_ncu, occupancy, triton_resources
from kernels.measure.stats import Comparison, Step, compare_samples, detect_step
from kernels.measure.stopping import StoppingRule, run_stream
from kernels.measure.summary import SampleStats, summarize
from kernels.measure.timing import Measurement, measure

__all__ = [
    "Comparison",
    "CorrectnessReport",
    "H100",
    "MeasurePolicy",
    "Measurement",
    "MemoryReport",
    "SMLimits",
    "Step",
    "StoppingRule",
    "SampleStats",
    "calc_diff",
    "check_allclose",
    "check_calc_diff",
    "check_flashmla",
    "collect_ncu",
    "combine_seeds",
    "compare_samples",
    "detect_step",
    "fill_nan",
    "measure",
    "occupancy",
    "peak_memory",
    "poison_like",
    "run_stream",
    "seed_list",
    "summarize",
    "triton_resources",
]
