"""The farm's settings: command-line flags win, then FARM_* environment variables, then defaults.

Every ``FARM_*`` variable the farm reads is a field here (``FARM_`` + the field name in capitals) and is
read nowhere else; README.md ("Settings") lists them. The gateway's own server settings
(``FARM_GATEWAY_DATABASE_URL``, ``FARM_GATEWAY_CONFIG``, ...) belong to gateway/config.py; the three
``FARM_GATEWAY_URL/_KEY/_MODEL`` here are what the farm, as a client, uses to reach a gateway.
``TRITON_INTERPRET`` and ``CUDA_VISIBLE_DEVICES`` are Triton's and CUDA's own, not ours.

A bad value raises ``FarmSettingsError``, one line naming the variable and what it must be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "FARM_"
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8787"
DEFAULT_DB = ".farm/farm.db"  # the results store when neither --db nor FARM_DB names one


class FarmSettingsError(ValueError):
    """A FARM_* variable has a value the farm cannot use; the message names it."""


class FarmSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", env_ignore_empty=True, str_strip_whitespace=True
    )

    # the results store and the cluster
    db: str = DEFAULT_DB  # an SQLAlchemy URL or an SQLite file path
    ray_address: str | None = None  # join this Ray cluster instead of starting one
    ray_dashboard: str | None = None  # the head's job API (`farm pool start`), e.g. http://HEAD:8265
    gpus: int | None = Field(None, ge=1)  # workers to run (GPUs, or logical slots on a CPU-only machine)
    # the Prometheus exporter of a running sweep (jobs.run.farm_metrics): off unless a port or a
    # Pushgateway is set
    metrics_port: int | None = Field(None, ge=0, le=65535)  # 0 picks a free port
    metrics_addr: str = "127.0.0.1"
    metrics_pushgateway: str | None = None  # URL of a Prometheus Pushgateway
    metrics_push_s: float = Field(10.0, gt=0)
    # the gateway, as its client (jobs.drafts.client): without a key the offline drafter runs in-process
    gateway_url: str = DEFAULT_GATEWAY_URL  # with or without /v1
    gateway_key: str | None = Field(None, repr=False)
    gateway_model: str | None = None  # None: the project's first model
    gateway_session: str | None = None  # the agent session the drafts' model calls are counted under

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise FarmSettingsError(_describe(e)) from None

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> FarmSettings:
        """The settings from the process environment, or from ``environ`` alone when given (tests, or a
        caller that passes its own environment); empty values count as unset."""
        if environ is None:
            return cls()
        values = {}
        for name in cls.model_fields:
            raw = environ.get(env_name(name))
            if raw is not None and raw.strip():
                values[name] = raw
        return _FromMapping(**values)


class _FromMapping(FarmSettings):
    """FarmSettings from the given values only (FarmSettings.load with a mapping), never os.environ."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], **sources: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (sources["init_settings"],)


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _describe(e: ValidationError) -> str:
    """One line: each bad variable, what is wrong, and the value given (never a key's)."""
    parts = []
    for err in e.errors():
        field = str(err["loc"][0]) if err["loc"] else "?"
        given = "" if "key" in field else f" (got {err.get('input')!r})"
        parts.append(f"{env_name(field)}: {err['msg']}{given}")
    return "bad farm setting: " + "; ".join(parts)
