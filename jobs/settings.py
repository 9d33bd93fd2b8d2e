"""The farm's settings: command-line flags win, then FARM_* environment variables, then defaults."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from jobs.store import DEFAULT_DB


class FarmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FARM_", extra="ignore")

    db: str = DEFAULT_DB  # FARM_DB: an SQLAlchemy URL or an SQLite file path
    ray_address: str | None = None  # FARM_RAY_ADDRESS: join this cluster instead of starting one
    gpus: int | None = None  # FARM_GPUS
