"""``farm gateway ...``: serve, keys create/list/revoke/rotate/reset-secret, usage, db upgrade, client-config,
doctor.

Mounted by the main CLI as ``gateway.ops.cli.gateway``; also runnable as ``python -m gateway.ops.cli``.
Every command takes ``--config PATH`` (or ``FARM_GATEWAY_CONFIG``); the default is the example config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from gateway.config import GatewaySettings, StartupError, load_settings
from gateway.ops.doctor import (
    DOCTOR_TOOLS,
    DoctorInput,
    DoctorTool,
    failed,
    format_checks,
    run_doctor,
    store_lookup,
)
from gateway.ops.onboarding import (
    DEFAULT_KEY_ENV,
    TOOLS,
    ConfigRequest,
    OnboardingError,
    Tool,
    default_base_url,
    project_models,
    render,
    write_config,
)
from gateway.store.db import (
    SchemaError,
    create_engine,
    database_problem,
    display_url,
    ensure_ready,
    first_line,
    upgrade_schema,
)
from gateway.store.keys import KeyStore, parse_duration
from gateway.store.ledger_queries import USAGE_DIMENSIONS, UsageQuery, usage_table
from gateway.store.secret import reset_secret, resolve_secret

DEFAULT_CONFIG = Path(__file__).parents[1] / "example-config.yaml"
T = TypeVar("T")


class Refused(click.ClickException):
    """A StartupError at the command line: ``Error: <its one line>`` and its exit status (2: the
    configuration, 4: infrastructure; gateway.config)."""

    def __init__(self, e: StartupError) -> None:
        super().__init__(str(e))
        self.exit_code = e.exit_code


def _settings(config_path: str | None) -> GatewaySettings:
    path = Path(config_path) if config_path else (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    try:
        return load_settings(path)
    except StartupError as e:
        raise Refused(e) from None


def _duration(value: str | None, what: str) -> timedelta | None:
    if value is None or value.lower() in ("never", "none", ""):
        return None
    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=what) from None


def _with_store(
    settings: GatewaySettings, fn: Callable[[KeyStore], Awaitable[T]], *, secret: bool = True
) -> T:
    """Run ``fn`` on the key store. With ``secret`` the server secret is resolved as the gateway does
    (gateway.store.secret), so a key made here works there; list and revoke need none (an emergency revocation
    must not wait for one)."""

    async def run() -> T:
        engine = create_engine(settings.database_url)
        try:
            # StartupError: the database unreachable, missing or silent, or SchemaError: run `db upgrade`
            await ensure_ready(engine, settings.database_url, settings.database_connect_timeout_s)
            store = KeyStore(engine, cache_ttl_s=0)
            if secret:
                store.set_secret(await resolve_secret(settings, engine))
            return await fn(store)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(run())
    except StartupError as e:
        raise Refused(e) from None


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200)


def _fmt(dt: datetime | None) -> str:
    return dt.strftime("%Y-%m-%d %H:%M UTC") if dt else "-"


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True),
    envvar="FARM_GATEWAY_CONFIG",
    default=None,
    help="Gateway YAML config (default: gateway/example-config.yaml; env FARM_GATEWAY_CONFIG).",
)


@click.group(name="gateway")
def gateway() -> None:
    """The agent gateway: OpenAI and Anthropic endpoints with per-project keys, limits and a ledger."""


@gateway.command()
@config_option
@click.option("--host", default=None, help="Bind address (default from config: 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default from config).")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Gateway processes on the port, supervised by this one (restarted when they die); "
    "more than 1 needs redis_url (shared limits).",
)
@click.option("--debug", is_flag=True, help="On a refused start, print the traceback after its one line.")
def serve(config_path: str | None, host: str | None, port: int | None, workers: int, debug: bool) -> None:
    """Run the gateway until interrupted (Ctrl-C stops it gracefully and flushes the ledger).

    A bad setup is refused before anything starts, in one line naming the fix: exit 2 for the
    configuration (a field, a URL, a driver, credentials), 4 for infrastructure (the database or Redis not
    answering, a schema to upgrade, the port served by another gateway)."""
    from gateway.http.workers import serve as run_server

    settings = _settings(config_path)

    def checked() -> None:  # the log from here on: a refused start is its one line alone
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        click.echo(
            f"gateway: {len(settings.projects)} projects, {len(settings.models)} models, "
            f"store {display_url(settings.database_url)}",
            err=True,
        )

    try:
        status = run_server(settings, host=host, port=port, workers=workers, on_checked=checked)
    except StartupError as e:  # e.g. the database down, or a server secret the keys were not made with
        if debug:
            traceback.print_exc()
        raise Refused(e) from None
    if status:
        sys.exit(status)


@gateway.group()
def keys() -> None:
    """Create, list, revoke and rotate project keys."""


@keys.command("create")
@config_option
@click.option("--project", required=True, help="Project the key belongs to.")
@click.option("--name", default="", help="A label for the key (who or what uses it).")
@click.option("--expires", default=None, help="Lifetime, e.g. 30d, 12h, 2w (default: never).")
def keys_create(config_path: str | None, project: str, name: str, expires: str | None) -> None:
    """Create a key; it is printed once and stored only as a keyed hash."""
    settings = _settings(config_path)
    if project not in settings.projects:
        raise click.BadParameter(
            f"unknown project {project!r} (configured: {', '.join(sorted(settings.projects))})",
            param_hint="--project",
        )
    expires_in = _duration(expires, "--expires")
    key, info = _with_store(settings, lambda s: s.create(project, name, expires_in))
    click.echo(f"key id:  {info.id}\nproject: {info.project}\nexpires: {_fmt(info.expires_at)}", err=True)
    click.echo("This key is shown once; store it now:", err=True)
    click.echo(key)


@keys.command("list")
@config_option
@click.option("--project", default=None, help="Only this project's keys.")
def keys_list(config_path: str | None, project: str | None) -> None:
    """List keys (ids and states, never the keys themselves)."""
    settings = _settings(config_path)
    infos = _with_store(settings, lambda s: s.list(project), secret=False)
    now = datetime.now(UTC)
    table = Table("id", "project", "name", "created", "expires", "state", "rotated to")
    for i in infos:
        table.add_row(
            i.id, i.project, i.name, _fmt(i.created_at), _fmt(i.expires_at), i.state(now), i.rotated_to or ""
        )
    _console().print(table)


@keys.command("revoke")
@config_option
@click.argument("key_id")
def keys_revoke(config_path: str | None, key_id: str) -> None:
    """Revoke a key at once."""
    settings = _settings(config_path)
    if not _with_store(settings, lambda s: s.revoke(key_id), secret=False):
        raise click.ClickException(f"no active key with id {key_id!r}")
    click.echo(f"revoked {key_id}")


@keys.command("rotate")
@config_option
@click.argument("key_id")
@click.option("--grace", default=None, help="How long the old key keeps working (default from config: 1h).")
def keys_rotate(config_path: str | None, key_id: str, grace: str | None) -> None:
    """Issue a replacement key; the old one keeps working for the grace period only."""
    settings = _settings(config_path)
    grace_td = _duration(grace, "--grace") if grace else timedelta(seconds=settings.key_rotation_grace_s)

    async def rotate(store: KeyStore):
        try:
            return await store.rotate(key_id, grace_td or timedelta(0))
        except KeyError:
            raise click.ClickException(f"no key with id {key_id!r}") from None
        except ValueError as e:
            raise click.ClickException(str(e)) from None

    key, info = _with_store(settings, rotate)
    click.echo(f"new key id: {info.id} (old key {key_id} works for {grace_td} more)", err=True)
    click.echo("This key is shown once; store it now:", err=True)
    click.echo(key)


@keys.command("reset-secret")
@config_option
@click.confirmation_option(
    prompt="Revoke EVERY key of this gateway and record the current secret?",
    help="Do not ask for confirmation.",
)
def keys_reset_secret(config_path: str | None) -> None:
    """Start over with the current secret: revoke every key and record this secret as the one keys use.

    For a lost secret (keys made with it can no longer be checked) or a leaked one (set the new
    FARM_GATEWAY_SECRET first). Restart running gateways afterwards, then create new keys."""
    settings = _settings(config_path)

    async def run() -> tuple[int, str]:
        engine = create_engine(settings.database_url)
        try:
            await ensure_ready(engine, settings.database_url, settings.database_connect_timeout_s)
            return await reset_secret(settings, engine)
        finally:
            await engine.dispose()

    try:
        revoked, source = asyncio.run(run())
    except StartupError as e:
        raise Refused(e) from None
    click.echo(
        f"revoked {revoked} keys; keys are now hashed with the secret from {source}. Restart running "
        "gateways, then create new keys (`farm gateway keys create`)."
    )


def _since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        day = datetime.strptime(value, "%Y-%m-%d")
        return day.replace(tzinfo=UTC)
    except ValueError:
        pass
    d = _duration(value, "--since")
    return datetime.now(UTC) - d if d else None


async def usage_rows(
    settings: GatewaySettings,
    by: str | None,
    since: datetime | None,
    *,
    task: str | None = None,
    session: str | None = None,
    top: int | None = None,
) -> tuple[list, list]:
    """(column names, rows) of the ledger grouped by date and ``by`` (default: task, model, key), or its
    ``top`` groups of ``by`` by cost (gateway.store.ledger_queries.UsageQuery)."""
    q = UsageQuery(by=by, since=since, task=task, session=session, top=top)
    engine = create_engine(settings.database_url)
    try:
        await ensure_ready(engine, settings.database_url, settings.database_connect_timeout_s)
        rows = await usage_table(engine, q)
    finally:
        await engine.dispose()
    return q.names, rows


def usage_totals(names: list[str], rows: list[list]) -> list:
    """The sum of every numeric column of ``usage_rows`` (cost: None when no row has one)."""
    first = names.index("requests")
    out: list = ["total"] + [""] * (first - 1)
    for i in range(first, len(names)):
        values = [r[i] for r in rows if r[i] is not None]
        out.append(sum(values) if values else None)
    return out


def _cell(name: str, value: object) -> str:
    if value is None:
        return "-"
    if name == "cost_usd":
        return f"{value:.4f}"
    if name == "retry_wait_s":
        return f"{value:.2f}"
    return str(value)


SESSION_WINDOW = "7d"  # what `usage --by session` covers when no window, task or session is given


@gateway.command()
@config_option
@click.option(
    "--by", type=click.Choice(sorted(USAGE_DIMENSIONS)), default=None, help="Group by one dimension."
)
@click.option("--since", default=None, help="A date (2025-06-01) or a window (24h, 7d).")
@click.option("--task", default=None, help="Only this task's requests (X-Farm-Task).")
@click.option("--session", default=None, help="Only this agent session's requests.")
@click.option("--top", type=click.IntRange(min=1), default=None, help="The N groups of --by with most cost.")
def usage(
    config_path: str | None,
    by: str | None,
    since: str | None,
    task: str | None,
    session: str | None,
    top: int | None,
) -> None:
    """The token ledger as a table: tokens, cost (US dollars, from the price table), upstream retries, the
    upstream 429s met and the seconds waited on retries, and status counts per date and task/model/key/
    project/session, with a total row. A cost of "-": no row of the group had a price. ``--top N --by
    session``: the N agent sessions that cost most over the window, one row each."""
    settings = _settings(config_path)
    if top is not None and by is None:
        raise click.BadParameter("--top ranks the groups of --by: give --by too", param_hint="--top")
    if by == "session" and since is None and task is None and session is None:
        # a year holds a session per agent run: the listing's cost is its rows (7.8 s at 20 M ledger rows,
        # benchmarks/results/scale-ledger-*), so it shows a week unless asked for more
        since = SESSION_WINDOW
        click.echo(f"sessions of the last {SESSION_WINDOW} (--since for another window)", err=True)
    try:
        names, rows = asyncio.run(
            usage_rows(settings, by, _since(since), task=task, session=session, top=top)
        )
    except StartupError as e:  # the database unreachable, or SchemaError: an out-of-date one
        raise Refused(e) from None
    table = Table(*names)
    for r in rows:
        table.add_row(*(_cell(n, v) for n, v in zip(names, r, strict=True)))
    if rows:
        table.add_section()
        table.add_row(*(_cell(n, v) for n, v in zip(names, usage_totals(names, rows), strict=True)))
    _console().print(table)


@gateway.group()
def db() -> None:
    """The gateway database's schema (Alembic migrations in gateway/store/migrations)."""


@db.command("upgrade")
@config_option
def db_upgrade(config_path: str | None) -> None:
    """Create or migrate the gateway's tables to the newest schema.

    Run it once per database before starting gateways of a release that changes the schema (they refuse
    an out-of-date database, naming this command); it adopts a database made before migrations. Safe to
    re-run, and from several hosts at once. A new, empty database needs no command: the first start
    creates its tables."""
    settings = _settings(config_path)
    where = display_url(settings.database_url)

    async def run():
        engine = create_engine(settings.database_url)
        try:
            return await upgrade_schema(engine)
        finally:
            await engine.dispose()

    try:
        before, after = asyncio.run(run())
    except SchemaError as e:
        raise Refused(e) from None
    except (OSError, SQLAlchemyError) as e:
        problem = database_problem(e, settings.database_url)
        if problem is not None:
            raise Refused(problem) from None
        raise click.ClickException(f"cannot upgrade the gateway database {where}: {first_line(e)}") from None
    if before.up_to_date:
        click.echo(f"{where}: schema already at the newest revision, {after.current}")
        return
    was = "empty" if before.empty else (before.current or "tables from before migrations")
    click.echo(f"{where}: schema upgraded from {was} to {after.current}")


@gateway.command("client-config")
@config_option
@click.option("--tool", type=click.Choice(TOOLS), required=True, help="The client to configure.")
@click.option("--project", required=True, help="The project whose models the client uses.")
@click.option(
    "--key-env",
    default=DEFAULT_KEY_ENV,
    show_default=True,
    help="Variable that holds the key (Codex env_key; read by --reveal).",
)
@click.option("--base-url", default=None, help="Gateway address (default: http://<host>:<port> from config).")
@click.option("--write", "write_path", type=click.Path(dir_okay=False), default=None, help="Write here.")
@click.option("--force", is_flag=True, help="Update an existing file (a .bak copy is kept).")
@click.option(
    "--reveal", is_flag=True, help="Put the real key (from $KEY_ENV) in the file, not a placeholder."
)
def client_config(
    config_path: str | None,
    tool: Tool,
    project: str,
    key_env: str,
    base_url: str | None,
    write_path: str | None,
    force: bool,
    reveal: bool,
) -> None:
    """Print (or --write) a client's config for a project: Claude Code, Codex, CC Switch or shell exports."""
    settings = _settings(config_path)
    key = None
    if reveal:
        raw = os.environ.get(key_env)
        if not raw or not raw.strip():
            raise click.ClickException(f"--reveal reads the key from ${key_env}, which is not set here")
        key = raw.strip()
        if any(c.isspace() for c in key):
            raise click.ClickException(f"${key_env} contains whitespace inside the key; fix the variable")
    try:
        req = ConfigRequest(
            tool, project_models(settings, project), base_url or default_base_url(settings), key_env, key
        )
        if write_path is None:
            click.echo(render(req), nl=False)
            if tool == "codex" and reveal:
                click.echo(f"note: Codex reads the key from ${key_env}; config.toml never holds it", err=True)
            return
        backup, notes = write_config(req, Path(write_path), force=force)
    except OnboardingError as e:
        raise click.ClickException(str(e)) from None
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {write_path}" + (f" (previous version in {backup})" if backup else ""), err=True)


@gateway.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Gateway config: its address is the default base URL, and on the gateway host its key "
    "store tells why a key is refused (env FARM_GATEWAY_CONFIG).",
)
@click.option(
    "--tool",
    type=click.Choice(DOCTOR_TOOLS),
    default="openai-env",
    show_default=True,
    help="Check the settings this client reads.",
)
@click.option("--base-url", default=None, help="Gateway address to probe (default: what the tool reads).")
@click.option("--key-env", default=None, help="Variable holding the key (default: what the tool reads).")
@click.option(
    "--model", default=None, help="Model to probe (default: the tool's model, else the first allowed)."
)
@click.option(
    "--codex-config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Codex config.toml (default: $CODEX_HOME/config.toml or ~/.codex/config.toml).",
)
@click.option(
    "--claude-settings",
    type=click.Path(dir_okay=False),
    default=None,
    help="Claude Code settings.json (default: ~/.claude/settings.json).",
)
@click.option("--connect-timeout", type=float, default=3.0, show_default=True, help="Seconds to connect.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for an answer.")
def doctor(
    config_path: str | None,
    tool: DoctorTool,
    base_url: str | None,
    key_env: str | None,
    model: str | None,
    codex_config: str | None,
    claude_settings: str | None,
    connect_timeout: float,
    timeout: float,
) -> None:
    """Probe the gateway as a client would; explain each failure and its fix (exit 1 on any FAIL)."""
    explicit = config_path or os.environ.get("FARM_GATEWAY_CONFIG")
    settings = _settings(explicit)
    inp = DoctorInput(
        tool=tool,
        env=dict(os.environ),
        base_url=base_url,
        default_base_url=default_base_url(settings),
        key_env=key_env,
        model=model,
        codex_config=Path(codex_config) if codex_config else None,
        claude_settings=Path(claude_settings) if claude_settings else None,
        connect_timeout_s=connect_timeout,
        read_timeout_s=timeout,
        key_lookup=store_lookup(settings) if explicit else None,
    )
    checks = asyncio.run(run_doctor(inp))
    click.echo(format_checks(checks))
    if failed(checks):
        sys.exit(1)


if __name__ == "__main__":
    gateway()
