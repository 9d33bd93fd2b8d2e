from kernels.measure.policy import MeasurePolicy

__all__ = ["MeasurePolicy"]
