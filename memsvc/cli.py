"""The `memsvc` command: dev, serve, worker, migrate, keys, tenants."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from memsvc.config import ConfigError, Settings
from memsvc.extraction import parser_process
from memsvc.governance.policy import PII_KINDS, PolicyError, TenantPolicies, parse_pii_overrides
from memsvc.observability import gc_pauses, log_format
from memsvc.observability.metrics_http import MetricsEndpoint
from memsvc.server.app import MemsvcServer, serve_until_signalled
from memsvc.server.processes import ServingProcesses
from memsvc.server.runtime import Runtime, pii_defaults
from memsvc.storage import api_keys, tenant_settings
from memsvc.storage.migrate import migrate
from memsvc.storage.pool import apply_migrations

log = logging.getLogger("memsvc")

_AUTH_OFF_BANNER = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!! memsvc dev: AUTHENTICATION IS OFF. Every caller is tenant {tenant!r}.
!! For local development only. Use `memsvc serve` with API keys in production.
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


_PROCESSES_HELP = (
    "serving processes sharing the port (default 1, MEMSVC_PROCESSES); the first also runs "
    "the workers"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memsvc", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text (default) or json: one object per line (MEMSVC_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser(
        "dev", help="run with embedded PostgreSQL+pgvector and valkey (data in --data-dir)"
    )
    dev.add_argument("--port", type=int, help="gRPC port (default 50051)")
    dev.add_argument("--host", help="gRPC bind address (default 127.0.0.1)")
    dev.add_argument("--data-dir", type=Path, help="data folder (default ./.memsvc)")
    dev.add_argument(
        "--auth", action="store_true", help="require API keys in dev too (default: off)"
    )
    dev.add_argument("--processes", type=int, help=_PROCESSES_HELP)

    serve = sub.add_parser(
        "serve", help="production mode against MEMSVC_PG_DSN and MEMSVC_REDIS_URL"
    )
    serve.add_argument("--port", type=int)
    serve.add_argument("--host")
    serve.add_argument("--processes", type=int, help=_PROCESSES_HELP)

    worker = sub.add_parser(
        "worker", help="run only the extraction workers against MEMSVC_PG_DSN / MEMSVC_REDIS_URL"
    )
    worker.add_argument(
        "--once",
        action="store_true",
        help="process every due job and delete what expired, then exit",
    )

    sub.add_parser("migrate", help="apply database migrations to MEMSVC_PG_DSN and exit")

    keys = sub.add_parser("keys", help="manage API keys (against MEMSVC_PG_DSN)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key for a tenant; printed once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--label", default="")
    listing = keys_sub.add_parser(
        "list", help="ids, labels, tenants, created and last used (never the keys)"
    )
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.add_argument("--all", action="store_true", help="revoked keys too")
    revoke = keys_sub.add_parser(
        "revoke", help="revoke a key (given in clear, by --id, or every key with a --label)"
    )
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("key", nargs="?", help="the key itself")
    which.add_argument("--id", dest="key_id", help="the key's id, as `keys list` shows it")
    which.add_argument("--label", help="every active key with this label")
    revoke.add_argument("--tenant", help="with --label: only this tenant's keys")

    tenants = sub.add_parser(
        "tenants", help="per-tenant governance settings (against MEMSVC_PG_DSN)"
    )
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True)
    show = tenants_sub.add_parser("show", help="print what applies to a tenant now")
    show.add_argument("--tenant", required=True)
    tset = tenants_sub.add_parser("set", help="override the server defaults for a tenant")
    tset.add_argument("--tenant", required=True)
    tset.add_argument(
        "--pii",
        help='PII screening: "redact", "email=store,phone=store", "reject,email=store" '
        f"(kinds: {', '.join(PII_KINDS)}; actions: store, redact, reject)",
    )
    ttl = tset.add_mutually_exclusive_group()
    ttl.add_argument(
        "--message-ttl-days", type=int, help="days a stored message is kept (0: never expires)"
    )
    ttl.add_argument(
        "--default-message-ttl",
        action="store_true",
        help="use the server's MEMSVC_MESSAGE_TTL_DAYS again",
    )
    tset.add_argument(
        "--human-block-chars",
        type=int,
        help="limit of the human core block: its text and core facts, in characters (0: none)",
    )
    tset.add_argument(
        "--persona-block-chars",
        type=int,
        help="limit of the persona core block in characters (0: none)",
    )
    tset.add_argument(
        "--default-block-chars",
        action="store_true",
        help="use the server's MEMSVC_HUMAN_BLOCK_MAX_CHARS and MEMSVC_PERSONA_BLOCK_MAX_CHARS "
        "again",
    )
    return parser


def _require_external(settings: Settings) -> None:
    missing = [
        name
        for name, value in (
            ("MEMSVC_PG_DSN", settings.pg_dsn),
            ("MEMSVC_REDIS_URL", settings.redis_url),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} must be set (or use `memsvc dev`)")


def _run_dev(settings: Settings, log_level: str) -> int:
    from memsvc.embedded import EmbeddedStack

    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stack = EmbeddedStack(data_dir)
    log.info("starting embedded PostgreSQL and valkey under %s", data_dir)
    dsn, url = stack.start()
    try:
        settings = settings.with_overrides(pg_dsn=dsn, redis_url=url)
        if not settings.auth_enabled:
            sys.stderr.write(_AUTH_OFF_BANNER.format(tenant=settings.default_tenant))
        # Unless the port was chosen, a second dev instance serves metrics on a free port.
        explicit = "MEMSVC_METRICS_PORT" in os.environ
        return _serve(settings, log_level, metrics_any_port_if_taken=not explicit)
    finally:
        log.info("stopping embedded servers")
        stack.stop()


def _serve(settings: Settings, log_level: str, *, metrics_any_port_if_taken: bool) -> int:
    """One serving process here, or MEMSVC_PROCESSES of them under this one."""
    if settings.processes > 1:
        return ServingProcesses(
            settings, log_level=log_level, metrics_any_port_if_taken=metrics_any_port_if_taken
        ).run()
    server = MemsvcServer(settings, metrics_any_port_if_taken=metrics_any_port_if_taken)
    asyncio.run(serve_until_signalled(server))
    return 0


async def _run_worker(settings: Settings, once: bool) -> None:
    """Workers on their own: any number of these, on any machines, share one database.
    They serve /metrics only when MEMSVC_METRICS_PORT is set (a worker beside a server on
    one host would otherwise take the server's port)."""
    runtime = Runtime(settings, with_worker=True)
    endpoint = MetricsEndpoint()
    await runtime.start()
    try:
        if not once and "MEMSVC_METRICS_PORT" in os.environ and settings.metrics_port is not None:
            port = endpoint.start(settings.metrics_host, settings.metrics_port)
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host, port)
        assert runtime.worker is not None
        if once:
            done = await runtime.worker.drain()
            print(f"processed {done} job(s)")
            expired = await runtime.expiry.run_once()
            print(
                f"expired {expired.memories} memories, {expired.episodes} episodes, "
                f"{expired.topics} topics, {expired.messages} messages"
            )
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        log.info("memsvc worker %s running", runtime.worker.worker_id)
        async with gc_pauses.frozen_and_observed():
            await stop.wait()
        log.info("draining in-flight jobs (grace %.1fs)", settings.shutdown_grace_s)
    finally:
        await endpoint.stop()
        await runtime.close()
        # The jobs had their grace: a parse still in hand must not hold the exit.
        parser_process.stop()


async def _run_migrate(settings: Settings) -> None:
    applied = await apply_migrations(settings)
    print(f"applied: {', '.join(applied) if applied else 'nothing (up to date)'}")


async def _run_keys(settings: Settings, args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(settings.pg_dsn, timeout=10)
    try:
        await migrate(conn, embedding_dim=settings.embedding_dim)
        if args.keys_command == "create":
            key = await api_keys.create_key(conn, args.tenant, args.label)
            print(key)
        elif args.keys_command == "list":
            _print_keys(
                await api_keys.list_keys(conn, tenant_id=args.tenant, include_revoked=args.all)
            )
        else:
            await _revoke(conn, args)
    finally:
        await conn.close()


def _print_keys(keys: list[api_keys.KeyInfo]) -> None:
    def when(at: datetime | None) -> str:
        return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")

    rows = [("id", "label", "tenant", "created", "last used", "revoked")]
    rows += [
        (
            k.key_id,
            k.label or "-",
            k.tenant_id,
            when(k.created_at),
            when(k.last_used_at),
            when(k.revoked_at),
        )
        for k in keys
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


async def _revoke(conn: asyncpg.Connection[asyncpg.Record], args: argparse.Namespace) -> None:
    """Revoke what the flags name; each revoked id is printed. Nothing matching is an error."""
    if args.tenant and not args.label:
        raise ConfigError("--tenant goes with --label")
    if args.label is not None:
        revoked = await api_keys.revoke_by_label(conn, args.label, tenant_id=args.tenant)
    elif args.key_id is not None:
        revoked = [args.key_id] if await api_keys.revoke_by_id(conn, args.key_id) else []
    else:
        revoked = ["(the key given)"] if await api_keys.revoke_key(conn, args.key) else []
    if not revoked:
        raise ConfigError("no active key matches")
    for key_id in revoked:
        print(f"revoked {key_id}")


async def _run_tenants(settings: Settings, args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(settings.pg_dsn, timeout=10)
    try:
        await migrate(conn, embedding_dim=settings.embedding_dim)
        policies = TenantPolicies(
            None,
            default_pii=pii_defaults(settings),
            default_message_ttl_s=settings.message_ttl_s,
        )
        if args.tenants_command == "set":
            try:
                pii = parse_pii_overrides(args.pii) if args.pii else None
            except PolicyError as exc:
                raise ConfigError(f"--pii: {exc}") from None
            if args.message_ttl_days is not None and args.message_ttl_days < 0:
                raise ConfigError("--message-ttl-days must be >= 0")
            for flag, value in (
                ("--human-block-chars", args.human_block_chars),
                ("--persona-block-chars", args.persona_block_chars),
            ):
                if value is not None and not 0 <= value <= settings.packet_max_chars:
                    raise ConfigError(
                        f"{flag} must be within 0..{settings.packet_max_chars} (0: no limit)"
                    )
            if args.default_block_chars and (
                args.human_block_chars is not None or args.persona_block_chars is not None
            ):
                raise ConfigError(
                    "--default-block-chars cannot be combined with --human-block-chars or "
                    "--persona-block-chars"
                )
            await tenant_settings.save(
                conn,
                args.tenant,
                pii_policy=pii,
                message_ttl_s=None
                if args.message_ttl_days is None
                else args.message_ttl_days * 86_400,
                clear_message_ttl=args.default_message_ttl,
                human_block_max_chars=args.human_block_chars,
                persona_block_max_chars=args.persona_block_chars,
                clear_block_limits=args.default_block_chars,
            )
        overrides = await tenant_settings.load(conn, args.tenant)
        policy = policies.resolve(overrides)
        ttl = policy.message_ttl_s
        print(f"tenant: {args.tenant}")
        print(f"message ttl: {'never expires' if ttl == 0 else f'{ttl / 86_400:g} days'}")
        print("pii: " + ", ".join(f"{kind}={policy.action(kind)}" for kind in PII_KINDS))
        for name, own, default in (
            ("human block", overrides.human_block_max_chars, settings.human_block_max_chars),
            ("persona block", overrides.persona_block_max_chars, settings.persona_block_max_chars),
        ):
            chars = default if own is None else own
            shown = "no limit" if chars == 0 else f"{chars} chars"
            print(f"{name}: {shown}" + (" (server default)" if own is None else ""))
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ).with_overrides(log_format=args.log_format)
        pii_defaults(settings)  # a bad governance setting fails here, before anything starts
        log_format.configure(args.log_level, settings.log_format)
        if args.command == "dev":
            auth = args.auth or ("MEMSVC_AUTH_ENABLED" in os.environ and settings.auth_enabled)
            settings = settings.with_overrides(
                grpc_port=args.port,
                grpc_host=args.host,
                data_dir=args.data_dir,
                auth_enabled=auth,
                processes=args.processes,
            )
            settings.check()
            return _run_dev(settings, args.log_level)
        elif args.command == "serve":
            settings = settings.with_overrides(
                grpc_port=args.port, grpc_host=args.host, processes=args.processes
            )
            settings.check()
            _require_external(settings)
            return _serve(settings, args.log_level, metrics_any_port_if_taken=False)
        elif args.command == "worker":
            _require_external(settings)
            asyncio.run(_run_worker(settings, args.once))
        elif args.command == "migrate":
            if not settings.pg_dsn:
                raise ConfigError("MEMSVC_PG_DSN must be set")
            asyncio.run(_run_migrate(settings))
        elif args.command in ("keys", "tenants"):
            if not settings.pg_dsn:
                raise ConfigError("MEMSVC_PG_DSN must be set")
            run = _run_keys if args.command == "keys" else _run_tenants
            asyncio.run(run(settings, args))
    except ConfigError as exc:
        print(f"memsvc: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
