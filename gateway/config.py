"""Gateway settings: one pydantic-settings object, loaded from YAML with environment overrides.

Environment variables use the prefix ``FARM_GATEWAY_`` and ``__`` for nesting, e.g.
``FARM_GATEWAY_PORT=9000`` or ``FARM_GATEWAY_PROVIDERS__OPENAI__BASE_URL=...``. Environment wins over YAML.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

log = logging.getLogger("gateway.config")

DEFAULT_DB_URL = "sqlite+aiosqlite:///.farm/gateway.db"


class ModelPrice(BaseModel):
    """One model's prices in US dollars per million tokens (``prices.<model id>`` in the config; the
    table and the defaults: gateway.core.pricing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(None, ge=0)  # a cache read; None: the input price
    cache_write_per_mtok: float | None = Field(None, ge=0)  # Anthropic's cache creation; None: input price

    def cost(
        self, input_tokens: int, output_tokens: int, cached_input: int = 0, cache_write: int = 0
    ) -> float:
        """US dollars for these counts (``input_tokens`` includes the cached and cache-write ones)."""
        cached_input = max(0, min(cached_input, input_tokens))
        cache_write = max(0, min(cache_write, input_tokens - cached_input))
        uncached = input_tokens - cached_input - cache_write
        cached_price = (
            self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        )
        write_price = self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        return (
            uncached * self.input_per_mtok
            + cached_input * cached_price
            + cache_write * write_price
            + output_tokens * self.output_per_mtok
        ) / 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    """An upstream API. ``base_url`` includes the version prefix, e.g. ``https://api.openai.com/v1``."""

    # local: the built-in offline drafter of gateway.summaries.offline (no network; base_url unused)
    kind: Literal["openai", "anthropic", "local"]
    base_url: str = ""
    api_key_env: str | None = None
    connect_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(120.0, gt=0)
    max_connections: int = Field(256, ge=1)
    # the most bytes of one response body the gateway reads (after decompression); more: a 502
    max_response_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # PEM bundle of the CAs to trust for an https base_url instead of the system's (a private CA)
    ca_file: str | None = None

    @model_validator(mode="after")
    def _needs_url(self) -> ProviderConfig:
        if self.kind == "local":
            return self
        if not self.base_url:
            raise ValueError(f"base_url: required for a provider of kind {self.kind!r}")
        u = urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url: {self.base_url!r} is not an http(s)://host[:port][/path] URL")
        _check_port("base_url", self.base_url, u)
        if self.ca_file is not None and not Path(self.ca_file).is_file():
            raise ValueError(f"ca_file: {self.ca_file!r} is not a file")
        return self


class SummariesConfig(_Strict):
    """The summary batcher (gateway.summaries.batcher): one model call per project, task and model per
    window."""

    window_ms: float = Field(50.0, ge=0, le=10_000)
    max_items: int = Field(32, ge=1, le=1000)  # anomalies per model call; a full batch goes at once
    checklist_max_tokens: int = Field(1000, ge=800, le=1200)
    log_summary_max_tokens: int = Field(2000, ge=1500, le=2500)
    temperature: float = Field(0.1, ge=0, le=1)
    cache_entries: int = Field(4096, ge=0)  # answers kept by content hash (LRU); 0: no cache
    max_anomalies_per_request: int = Field(200, ge=1)


class DeploymentConfig(_Strict):
    """One upstream serving a public model (gateway.upstream.routing): a provider, the model id there, and
    optionally
    its own upstream key (``api_key_env``; else the provider's), a weight and that key's rpm/tpm limits."""

    name: str = Field(min_length=1, max_length=64)
    provider: str
    upstream_model: str = Field(min_length=1)
    api_key_env: str | None = None
    weight: float = Field(1.0, gt=0)
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    # the model takes an effort hint in its own format (an OpenAI reasoning model's reasoning_effort, an
    # Anthropic model's output_config.effort): a client of the other provider gets its hint mapped to it;
    # without it that hint is dropped (gateway.translate.policy.EFFORT)
    effort: bool = False


class ModelRoute(_Strict):
    """A public model: either the single form ``{provider, upstream_model}`` (one deployment named after the
    provider) or ``deployments: [...]``. ``provider`` and ``upstream_model`` always hold the first
    deployment's values. ``fallbacks``: other public models tried in order when every deployment failed or
    cools down; ``context_window_fallbacks``: a longer-context model a context-window error is re-sent to
    once (both as the project's ``fallback_on`` allows)."""

    provider: str | None = None
    upstream_model: str | None = None
    deployments: list[DeploymentConfig] = Field(default_factory=list)
    fallbacks: list[str] = Field(default_factory=list)
    context_window_fallbacks: list[str] = Field(default_factory=list)
    # how its deployments share its requests (gateway.upstream.strategies): weighted (fewest in flight per
    # weight), latency (lowest recent time to first byte, exploring), least-busy (fewest in flight)
    strategy: Literal["weighted", "latency", "least-busy"] = "weighted"
    # prompt-cache breakpoints the gateway adds to a request for its anthropic deployments that carries none
    # (gateway.translate.cache_points): "auto" where the price table bills the deployment's cache reads below
    # its input price, "on", "off"; ``prompt_cache_min_tokens``: the shortest prefix worth a breakpoint
    # (None: the model family's documented minimum)
    prompt_caching: Literal["auto", "on", "off"] = "auto"
    prompt_cache_min_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_form(self) -> ModelRoute:
        if self.deployments:
            first = self.deployments[0]
            # both given (a dumped config has both): they must agree
            if self.provider not in (None, first.provider) or self.upstream_model not in (
                None,
                first.upstream_model,
            ):
                raise ValueError(
                    "give either provider/upstream_model or deployments, not both (with both, they must be "
                    "the first deployment's)"
                )
            seen: set[str] = set()
            for i, d in enumerate(self.deployments):
                if d.name in seen:
                    raise ValueError(f"deployments.{i}.name: duplicate deployment name {d.name!r}")
                seen.add(d.name)
            object.__setattr__(self, "provider", first.provider)
            object.__setattr__(self, "upstream_model", first.upstream_model)
            return self
        if self.provider is None or self.upstream_model is None:
            missing = "provider" if self.provider is None else "upstream_model"
            raise ValueError(f"{missing}: required (or give deployments)")
        only = DeploymentConfig(
            name=self.provider, provider=self.provider, upstream_model=self.upstream_model
        )
        object.__setattr__(self, "deployments", [only])
        return self


FallbackOn = Literal["rate_limit", "server_error", "timeout", "context_window"]


def _check_port(field: str, url: str, u: SplitResult) -> None:
    """The URL's port, if it has one, is a port number (urlsplit raises only when it is asked for it)."""
    try:
        u.port  # noqa: B018 (the check is the access)
    except ValueError:
        raise ValueError(f"{field}: {url!r} has a port that is not a number from 0 to 65535") from None


REDIS_FORMS = "redis://host:6379/0, rediss://host:6380/0 (TLS) or unix:///path/to/redis.sock"


def check_redis_url(url: str) -> str:
    """``url`` if the Redis client takes it as the server's address; else a ValueError naming what is wrong
    (the client's own would be a traceback at start)."""
    u = urlsplit(url)
    if u.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"redis_url {url!r}: the scheme {u.scheme!r} is not Redis': use {REDIS_FORMS}")
    if u.scheme == "unix":
        if not u.path:
            raise ValueError(f"redis_url {url!r}: no socket path: write it as {REDIS_FORMS}")
        return url
    if not u.hostname:
        raise ValueError(f"redis_url {url!r}: no host: write it as {REDIS_FORMS}")
    _check_port("redis_url", url, u)
    db = u.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"redis_url {url!r}: the database number {db!r} is not a number (e.g. /0)")
    return url


class RoutingConfig(_Strict):
    """Deployment health (gateway.upstream.routing): a deployment that fails more than ``allowed_fails``
    times in a
    row (5xx, timeout, cannot connect), or answers 429 at all, cools down for ``cooldown_s`` (a 429's
    Retry-After when it gives one), doubling for each cooldown in a row up to ``max_cooldown_s``."""

    allowed_fails: int = Field(1, ge=0)
    cooldown_s: float = Field(30.0, gt=0)
    max_cooldown_s: float = Field(300.0, gt=0)
    # strategy latency: the share of requests sent to a deployment other than the fastest (exploration),
    # and how many of a deployment's latest times to first byte its estimate is the median of
    latency_explore: float = Field(0.05, ge=0, le=1)
    latency_window: int = Field(5, ge=1, le=100)
    # a deployment idle this long (nothing begun, nothing in flight) gets the smallest model call (one output
    # token): a failure cools it down before a request meets it, an answer ends a cooldown; None: no checks
    health_check_interval_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> RoutingConfig:
        _at_least(self, "max_cooldown_s", "cooldown_s")
        return self


class ProjectConfig(_Strict):
    models: list[str] = Field(min_length=1)
    max_concurrency: int = Field(8, ge=1)
    queue_timeout_s: float = Field(30.0, ge=0)
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    daily_token_budget: int | None = Field(None, ge=1)
    # US dollars per UTC day, priced by gateway.core.pricing (a request of a model without a price counts 0)
    daily_cost_budget_usd: float | None = Field(None, gt=0)
    default_task: str = "default"
    # Task names that get their own metrics label; any other X-Farm-Task value is labelled "other"
    # (the ledger keeps the real name). Keeps the label set bounded.
    tasks: list[str] = Field(default_factory=list)
    default_max_tokens: int = Field(4096, ge=1)
    # which upstream failures move a request to the model's fallbacks (context_window: its
    # context_window_fallbacks); fallbacks are operator config, usable by any project allowed the primary
    fallback_on: list[FallbackOn] = Field(default_factory=lambda: ["rate_limit", "server_error", "timeout"])
    # a request field that translation does not know (or a server tool without an equivalent): "lenient"
    # drops it and reports it (header x-farm-dropped, the ledger, a metric, a log line), "strict" refuses
    # the request naming it (gateway.translate.policy)
    translation: Literal["lenient", "strict"] = "lenient"


class AlertingConfig(_Strict):
    """Where the alerts of grafana/alerts.yml go: ``make monitor`` starts Prometheus' Alertmanager with a
    route to this Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat; gateway.ops.alerting).
    None: Alertmanager holds them (its UI), sending nothing."""

    slack_webhook_url: SecretStr | None = None
    channel: str | None = None  # the channel to post in, when the webhook does not fix one

    @model_validator(mode="after")
    def _webhook_url(self) -> AlertingConfig:
        if self.slack_webhook_url is not None:
            url = self.slack_webhook_url.get_secret_value()
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ValueError("slack_webhook_url: not an http(s)://host[:port]/path URL")
            _check_port("slack_webhook_url", "(the webhook URL)", u)
        return self


class RetryConfig(_Strict):
    max_retries: int = Field(3, ge=0)
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_cap_s: float = Field(8.0, ge=0)
    jitter_s: float = Field(0.75, ge=0)
    max_retry_after_s: float = Field(60.0, ge=0)
    max_total_wait_s: float = Field(60.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> RetryConfig:
        _at_least(self, "backoff_cap_s", "backoff_base_s")
        return self


def _at_least(cfg: BaseModel, upper: str, lower: str) -> None:
    """A range's upper end is not below its lower end."""
    hi, lo = getattr(cfg, upper), getattr(cfg, lower)
    if hi < lo:
        raise ValueError(f"{upper} ({hi:g}) is below {lower} ({lo:g}): it is the most {lower} may grow to")


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FARM_GATEWAY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    database_url: str = DEFAULT_DB_URL
    # how long a start or a command waits for the database to answer before it gives up, saying so
    database_connect_timeout_s: float = Field(10.0, gt=0, le=300)
    secret: SecretStr | None = None
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    models: dict[str, ModelRoute] = Field(default_factory=dict)
    projects: dict[str, ProjectConfig] = Field(default_factory=dict)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    summaries: SummariesConfig = Field(default_factory=SummariesConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)  # make monitor's Alertmanager
    # model id (upstream id or public name) -> US dollars per million tokens; overrides and extends
    # gateway.core.pricing.DEFAULT_PRICES
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    ledger_flush_interval_s: float = Field(0.25, gt=0)
    ledger_batch_size: int = Field(500, ge=1)
    # the ledger's write-ahead spool (gateway.store.spool); None: `<db stem>-spool` next to an SQLite file,
    # else .farm/gateway-spool
    ledger_spool_dir: str | None = None
    # how long an authenticated key is trusted without a store lookup: the bound on how late a revocation
    # made by another process (the CLI, another instance) bites
    key_cache_ttl_s: float = Field(1.0, ge=0, le=1.0)
    key_rotation_grace_s: float = Field(3600.0, ge=0)
    # while the database is down or hung, a key verified within this long still authenticates (the last
    # known good; a revocation seen through Redis still bites); keys not seen lately get a 503
    key_stale_ttl_s: float = Field(600.0, ge=0)
    key_lookup_timeout_s: float = Field(1.0, gt=0, le=30)  # a key lookup's deadline (a hung database)
    access_log: bool = False
    uvloop: bool = True  # use uvloop for `serve` when it is installed
    # Shared state (gateway.redis): with a Redis URL (redis://, rediss://, unix://), every gateway process
    # using that Redis and key prefix shares limits, key revocations and the summaries cache; None: each
    # process has its own, as before.
    redis_url: str | None = None
    redis_key_prefix: str = Field("kfgw", min_length=1)
    # a concurrency slot (and budget reservation) of a process that died frees after this; renewed every
    # third of it while the request runs
    redis_lease_s: float = Field(5.0, ge=0.3, le=300)
    redis_timeout_s: float = Field(0.5, gt=0, le=30)  # the longest wait for Redis before counting it down
    redis_health_interval_s: float = Field(1.0, gt=0, le=60)  # reconnect attempts while it is down
    # while Redis is down each process enforces 1/N of each limit (the number of gateway processes)
    redis_fallback_processes: int = Field(1, ge=1)
    # while Redis is down: "share" serves each process on its 1/N of each limit; "refuse" answers every
    # request that needs the project's limits 503 with Retry-After (limits that must hold fail closed)
    redis_outage: Literal["share", "refuse"] = "share"
    redis_summaries_ttl_s: float = Field(86400.0, ge=1)  # how long a summaries answer stays in Redis
    # `serve` refuses to start when nothing answers at redis_url (a mistyped URL would otherwise leave every
    # process on its share of the limits for good); true: start degraded and reconnect, as after an outage
    redis_start_degraded: bool = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides the YAML (which arrives as init kwargs).
        return (env_settings, init_settings, file_secret_settings)

    @model_validator(mode="after")
    def _check_values(self) -> GatewaySettings:
        """Values whose mistakes would surface later, in a library, as a traceback."""
        if self.redis_url is not None:
            check_redis_url(self.redis_url)
        spool = self.ledger_spool_dir
        if spool is not None and Path(spool).exists() and not Path(spool).is_dir():
            raise ValueError(f"ledger_spool_dir: {spool!r} is not a folder")
        return self

    @model_validator(mode="after")
    def _check_references(self) -> GatewaySettings:
        for name, route in self.models.items():
            self._check_route(name, route)
        for pname, project in self.projects.items():
            for i, model in enumerate(project.models):
                if model not in self.models:
                    raise ValueError(
                        f"projects.{pname}.models.{i}: unknown model {model!r} (known: {sorted(self.models)})"
                    )
        return self

    def _check_route(self, name: str, route: ModelRoute) -> None:
        """A route's providers exist. Deployments and fallbacks may mix the openai and anthropic kinds (the
        proxy translates per target, gateway.translate); the offline drafter (kind ``local``) serves only the
        summaries endpoint and cannot be mixed with either."""
        single = len(route.deployments) == 1 and route.deployments[0].name == route.provider
        kind = None
        for i, d in enumerate(route.deployments):
            where = f"models.{name}.provider" if single else f"models.{name}.deployments.{i}.provider"
            provider = self.providers.get(d.provider)
            if provider is None:
                raise ValueError(
                    f"{where}: unknown provider {d.provider!r} (known: {sorted(self.providers)})"
                )
            if kind is None:
                kind = provider.kind
            elif (provider.kind == "local") != (kind == "local"):
                raise ValueError(
                    f"{where}: provider {d.provider!r} is of kind {provider.kind}, the model's first "
                    f"deployment {kind}: the offline drafter (local) cannot share a model with an API "
                    "provider"
                )
        for field in ("fallbacks", "context_window_fallbacks"):
            for i, other in enumerate(getattr(route, field)):
                where = f"models.{name}.{field}.{i}"
                target = self.models.get(other)
                if target is None:
                    raise ValueError(f"{where}: unknown model {other!r} (known: {sorted(self.models)})")
                if other == name:
                    raise ValueError(f"{where}: a model cannot be its own fallback")
                other_provider = self.providers.get(target.deployments[0].provider)
                other_kind = other_provider.kind if other_provider is not None else None
                if other_kind is not None and (other_kind == "local") != (kind == "local"):
                    raise ValueError(
                        f"{where}: {other!r} is of kind {other_kind}, {name!r} of kind {kind}: the offline "
                        "drafter (local) cannot be a fallback of an API model, nor the other way round"
                    )

    def secret_bytes(self) -> bytes | None:
        """FARM_GATEWAY_SECRET (or ``secret:``) when set; else None, and gateway.store.secret.resolve_secret
        uses
        the secret file next to the database. There is no built-in secret."""
        if self.secret is None or not self.secret.get_secret_value():
            return None
        return self.secret.get_secret_value().encode()


# Exit statuses of a start (``farm gateway serve``) or command refused before it could run (gateway/README.md,
# "Start-up errors"); the farm's CLI uses the same two (jobs/errors.py).
EXIT_CONFIG = 2  # the configuration is wrong: fix the config file, the environment or the flags
EXIT_UNAVAILABLE = 4  # something the configuration names cannot be used: a database, Redis, the port


class StartupError(Exception):
    """The gateway cannot start (or a command run) as set up. The message is one line naming what is wrong
    and the fix; ``exit_code`` tells a bad configuration from unavailable infrastructure."""

    exit_code = 1


class ConfigError(StartupError):
    """Invalid configuration; the message names the field."""

    exit_code = EXIT_CONFIG


class UnavailableError(StartupError):
    """Something the configuration names (the database, Redis, the port) cannot be used: not reachable, not
    answering within its deadline, not ready (a schema to upgrade), or taken by another gateway."""

    exit_code = EXIT_UNAVAILABLE


def check_database_url(url: str) -> str:
    """``url`` if it is an async SQLAlchemy URL whose dialect this install has, else a ConfigError naming
    ``database_url`` and the forms that work (the driver's own module is imported when the engine is made)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    forms = "sqlite+aiosqlite:///path/to/gateway.db or postgresql+asyncpg://user:password@host:5432/name"
    try:
        # the dialect create_async_engine would pick (psycopg's async variant for postgresql+psycopg)
        dialect = make_url(url).get_dialect(_is_async=True)
    except NoSuchModuleError:  # before ArgumentError, its base class
        name = url.split("://", 1)[0]
        raise ConfigError(f"database_url: unknown database driver {name!r}: use {forms}") from None
    except ArgumentError:
        raise ConfigError(f"database_url {url!r} is not a database URL: write it as {forms}") from None
    if not getattr(dialect, "is_async", False):
        name = url.split("://", 1)[0]
        raise ConfigError(f"database_url: driver {name!r} is not an async driver: use {forms}")
    return url


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")  # a validator's own message names the field already
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def _env_problem(e: SettingsError) -> str:
    """pydantic-settings' 'error parsing value for field "x" from source "EnvSettingsSource"' as the variable
    to fix."""
    m = re.search(r'field "([^"]+)"', str(e))
    field = m.group(1) if m else "?"
    var = f"FARM_GATEWAY_{field.upper()}"
    return f"{field}: the environment variable {var} (or one under {var}__) is not valid JSON for it"


def load_settings(path: str | Path | None = None, **overrides: Any) -> GatewaySettings:
    """Load settings from a YAML file (optional) plus environment, raising ConfigError naming the field."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config {p}: {e}") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"config {p} is not valid YAML: {e}") from e
        if not isinstance(raw, dict):
            raise ConfigError(f"config {p}: top level must be a mapping")
        data.update(raw)
    data.update(overrides)
    where = f" {path}" if path else ""
    try:
        settings = GatewaySettings(**data)
    except ValidationError as e:
        raise ConfigError(f"invalid gateway config{where}: {_format_validation_error(e)}") from e
    except SettingsError as e:  # an environment value that is not the JSON its field needs
        raise ConfigError(f"invalid gateway config{where}: {_env_problem(e)}") from e
    check_database_url(settings.database_url)
    return settings
