"""The measurement policy: every knob of how a trial is timed. A spec's `measure:` section is this model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MeasurePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_ms: float = Field(25.0, ge=0, description="warm-up by time before the first sample")
    min_samples: int = Field(10, ge=1, description="never stop before this many samples")
    max_samples: int = Field(1000, ge=1, description="stop after this many samples")
    max_time_s: float = Field(15.0, gt=0, description="wall-clock cap on measuring one callable")

    @model_validator(mode="after")
    def _samples_ordered(self) -> MeasurePolicy:
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) is below min_samples ({self.min_samples})")
        return self
