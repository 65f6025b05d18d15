"""The ``rocketmq-dedup`` command line (also ``python -m rocketmq_dedup``); needs the ``[cli]``
extra (click).

Stores are named by URL: ``--redis redis://[:password@]host:port/db`` (also ``rediss://`` and
``unix://``, as redis-py reads them), ``--mysql mysql://user[:password]@host[:port]/database``
(``?unix_socket=/path`` accepted) or ``--postgres postgresql://user[:password]@host[:port]/dbname``
(any libpq URL, ``?sslmode=...`` and the like included). Each may come from the environment
instead (``ROCKETMQ_DEDUP_REDIS_URL``, ``ROCKETMQ_DEDUP_MYSQL_URL``,
``ROCKETMQ_DEDUP_POSTGRES_URL``), and so may the passwords (``REDISCLI_AUTH``,
``ROCKETMQ_DEDUP_MYSQL_PASSWORD``, ``ROCKETMQ_DEDUP_POSTGRES_PASSWORD``; libpq's own
``PGPASSWORD`` and ``~/.pgpass`` work too), to keep them off the command line.

Exit status: 0 done; 1 a check failed (``check``: e.g. the table is missing or lacks a column,
or the user may not write it; a ``warn`` line, e.g. a Redis that evicts keys, is not a failure)
or ``release`` refused a CONSUMED record without ``--force``; 2 bad input (a bad URL, an
unknown table outside ``check``, a key with no live record) or an unreachable store.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import sys
import time
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)
from urllib.parse import parse_qs, unquote, urlsplit

from rocketmq_dedup.errors import DedupError, MissingExtraError
from rocketmq_dedup.horizon import DEFAULT_MAX_RECONSUME_TIMES, redelivery_horizon_ms

try:
    import click
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingExtraError("click", "cli") from exc

from rocketmq_dedup.config import DEFAULT_RECORD_RESERVE_MINUTES
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores import make_store
from rocketmq_dedup.stores.base import PROBE_APPLICATION, DedupStore, Record
from rocketmq_dedup.stores.mysql import DEFAULT_TABLE_NAME, MySQLDedupStore, schema_statements
from rocketmq_dedup.stores.postgres import PostgresDedupStore
from rocketmq_dedup.stores.postgres import schema_statements as postgres_schema_statements
from rocketmq_dedup.stores.redis import DEFAULT_KEY_PREFIX

F = TypeVar("F", bound=Callable[..., Any])


class UsageProblem(click.ClickException):
    """Bad input or an unreachable store: one line, exit status 2."""

    exit_code = 2


def _version() -> str:
    from rocketmq_dedup import __version__

    return __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="rocketmq-dedup")
def cli() -> None:
    """Look at and repair rocketmq-dedup's records in Redis, MySQL or PostgreSQL."""


# -- store options -------------------------------------------------------------------------------


def _wraps(function: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``functools.wraps`` that gives the wrapper its own copy of the click parameters the
    wrapped function already has (sharing the list would add the wrapper's options twice)."""

    def decorate(wrapper: Callable[..., Any]) -> Callable[..., Any]:
        functools.update_wrapper(wrapper, function, updated=())
        params = list(getattr(function, "__click_params__", []))
        wrapper.__click_params__ = params  # type: ignore[attr-defined]
        return wrapper

    return decorate


def store_options(function: Callable[..., Any], required: bool = True) -> Callable[..., Any]:
    """--redis/--mysql/--postgres/--table/--key-prefix, resolved into the ``store`` argument
    (checked once: an unreachable store is exit status 2); None when not ``required`` and not
    named."""

    @_wraps(function)
    def with_store(
        redis_url: Optional[str],
        mysql_url: Optional[str],
        postgres_url: Optional[str],
        table: str,
        key_prefix: str,
        **kw: Any,
    ) -> Any:
        urls = StoreUrls(redis_url, mysql_url, postgres_url)
        if not required and not any(urls):
            return function(store=None, **kw)
        return function(store=open_store(urls, table, key_prefix), **kw)

    options = [
        click.option(
            "--redis",
            "redis_url",
            envvar="ROCKETMQ_DEDUP_REDIS_URL",
            metavar="URL",
            help="redis://, rediss:// or unix:// URL (env ROCKETMQ_DEDUP_REDIS_URL).",
        ),
        click.option(
            "--mysql",
            "mysql_url",
            envvar="ROCKETMQ_DEDUP_MYSQL_URL",
            metavar="URL",
            help="mysql://user[:password]@host[:port]/database (env ROCKETMQ_DEDUP_MYSQL_URL).",
        ),
        click.option(
            "--postgres",
            "postgres_url",
            envvar="ROCKETMQ_DEDUP_POSTGRES_URL",
            metavar="URL",
            help="postgresql://user[:password]@host[:port]/dbname "
            "(env ROCKETMQ_DEDUP_POSTGRES_URL).",
        ),
        click.option(
            "--table",
            default=DEFAULT_TABLE_NAME,
            show_default=True,
            help="MySQL or PostgreSQL table.",
        ),
        click.option(
            "--key-prefix", default=DEFAULT_KEY_PREFIX, show_default=True, help="Redis prefix."
        ),
    ]
    wrapped: Callable[..., Any] = with_store
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


class StoreUrls(NamedTuple):
    """The store URLs given (one of them names the store)."""

    redis: Optional[str]
    mysql: Optional[str]
    postgres: Optional[str]


def open_store(urls: StoreUrls, table: str, key_prefix: str) -> DedupStore:
    """The store the options name, checked once (an unreachable store is exit status 2)."""
    if sum(map(bool, urls)) != 1:
        raise UsageProblem("name one store: --redis URL, --mysql URL or --postgres URL")
    if urls.redis:
        store = make_store(_redis_client(urls.redis), key_prefix=key_prefix)
    elif urls.mysql:
        store = make_store(mysql_factory(urls.mysql), table_name=table)
    else:
        store = make_store(postgres_factory(str(urls.postgres)), table_name=table)
    try:
        store.check()
    except DedupError as exc:
        cause = one_line(exc.__cause__ or exc)
        raise UsageProblem(f"cannot reach {store.describe()}: {cause}") from exc
    return store


def one_line(exc: BaseException) -> str:
    """An error's message on one line (a server's may span several: libpq adds hints)."""
    return " ".join(str(exc).split())


def _redis_client(url: str) -> Any:
    try:
        import redis
    except ImportError as exc:
        raise UsageProblem("Redis needs redis-py: pip install 'rocketmq-dedup[redis]'") from exc
    options: Dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 10}
    password = os.environ.get("REDISCLI_AUTH")
    if password and urlsplit(url).password is None:
        options["password"] = password
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise UsageProblem(f"bad Redis URL {url!r}: {exc}") from exc


def mysql_factory(url: str) -> Callable[[], Any]:
    """A connection factory for ``mysql://user:password@host:port/database``: mysqlclient if
    installed, else PyMySQL."""
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb") or not parts.path.strip("/"):
        raise UsageProblem(
            f"bad MySQL URL {url!r}: expected mysql://user[:password]@host[:port]/database"
        )
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise UsageProblem(f"bad MySQL URL {url!r}: {exc}") from exc
    params: Dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password)
        if parts.password is not None
        else os.environ.get("ROCKETMQ_DEDUP_MYSQL_PASSWORD", ""),
        "database": unquote(parts.path.strip("/")),
        "connect_timeout": 5,
    }
    query = parse_qs(parts.query)
    if "unix_socket" in query:
        params["unix_socket"] = query["unix_socket"][0]
    try:
        import MySQLdb

        return functools.partial(MySQLdb.connect, **params)
    except ImportError:
        pass
    try:
        import pymysql
    except ImportError as exc:
        raise UsageProblem(
            "MySQL needs a driver: pip install 'rocketmq-dedup[mysql]' (or PyMySQL)"
        ) from exc
    return functools.partial(pymysql.connect, **params)


def postgres_factory(url: str) -> Callable[[], Any]:
    """A psycopg connection factory for ``postgresql://user:password@host:port/dbname`` (a
    ``functools.partial`` of ``psycopg.connect``, as make_store recognises it)."""
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as exc:
        raise UsageProblem(
            "PostgreSQL needs psycopg: pip install 'rocketmq-dedup[postgres]'"
        ) from exc
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise UsageProblem(
            f"bad PostgreSQL URL {url!r}: expected postgresql://user[:password]@host[:port]/dbname"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        params = conninfo_to_dict(url)
    except (ValueError, psycopg.Error) as exc:
        raise UsageProblem(f"bad PostgreSQL URL {url!r}: {one_line(exc)}") from exc
    options: Dict[str, Any] = {"connect_timeout": 5}
    password = os.environ.get("ROCKETMQ_DEDUP_POSTGRES_PASSWORD")
    if password and "password" not in params:
        options["password"] = password
    return functools.partial(psycopg.connect, url, **options)


def element_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--app/--topic/--tag and the KEY argument, resolved into the ``element`` argument."""

    @_wraps(function)
    def with_element(app: str, topic: str, tag: str, key: str, **kw: Any) -> Any:
        return function(element=DedupElement(app, topic, tag, key), **kw)

    wrapped: Callable[..., Any] = with_element
    for option in reversed(
        [
            click.option("--app", required=True, help="The application name of the config."),
            click.option("--topic", required=True, help="The message's topic."),
            click.option("--tag", default="", help="The message's tag (default: none)."),
            click.argument("key"),
        ]
    ):
        wrapped = option(wrapped)
    return wrapped


# -- output --------------------------------------------------------------------------------------


def print_table(rows: Sequence[Tuple[str, str]]) -> None:
    """Two aligned columns."""
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        click.echo(f"  {click.style(name.ljust(width), bold=True)}  {value}")


def duration(ms: Optional[float]) -> str:
    """A human duration from milliseconds."""
    if ms is None:
        return "never"
    seconds = ms / 1000
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def record_rows(record: Record) -> List[Tuple[str, str]]:
    at = claimed_at(record.owner or "")
    status = record.status.value if record.status is not None else "unreadable"
    colour = {"CONSUMED": "green", "CONSUMING": "yellow"}.get(status, "red")
    rows = [
        ("status", click.style(status, fg=colour)),
        ("owner", record.owner or "unknown"),
        ("claimed", f"{duration((time.time() - at) * 1000)} ago" if at else "unknown"),
        ("time left", duration(record.expires_in_ms)),
    ]
    if record.status is DedupStatus.FAILED:  # why it can never succeed
        rows.append(("reason", record.reason or "unknown (a table without failure_reason)"))
    return rows


# -- commands ------------------------------------------------------------------------------------


@cli.command()
@store_options
@click.option(
    "--app",
    default=PROBE_APPLICATION,
    show_default=True,
    help="The application whose key space the write check's probe records use.",
)
def check(store: DedupStore, app: str) -> None:
    """Check the server, its version, the features used, and that the store can claim and
    release (probe records, claimed and released)."""
    click.echo(store.describe())
    results = store.diagnose(app)
    for result in results:
        if not result.ok:
            mark = click.style("FAIL", fg="red")
        elif result.warning:
            mark = click.style("warn", fg="yellow")
        else:
            mark = click.style("ok  ", fg="green")
        click.echo(f"  {mark} {result.name}: {result.detail}")
    if not all(r.ok for r in results):
        raise click.ClickException("some checks failed")


def live_record(store: DedupStore, element: DedupElement) -> Record:
    record = store.read(element)
    if record is None:
        raise UsageProblem(f"no live record for key {element.key!r}")
    return record


@cli.command()
@store_options
@element_options
def inspect(store: DedupStore, element: DedupElement) -> None:
    """Show the record of KEY: status, owner, age, time left (and a FAILED record's reason)."""
    print_table(record_rows(live_record(store, element)))


@cli.command()
@store_options
@element_options
@click.option("--force", is_flag=True, help="Also delete a CONSUMED record (it will run again).")
def release(store: DedupStore, element: DedupElement, force: bool) -> None:
    """Remove a stuck CONSUMING claim of KEY.

    Its next delivery then runs the handler. A CONSUMED record is left alone unless --force.
    """
    record = live_record(store, element)
    deleted = store.delete(element, force=force)
    if deleted is None:
        raise click.ClickException(
            f"key {element.key!r} is {record.status.value if record.status else 'unreadable'}: "
            "left as it is (--force deletes it, and its next delivery runs the handler again)"
        )
    click.echo(f"deleted the {deleted.value} record of {element.key!r}")


def retention_rows(
    record: Record, retention_minutes: Optional[float], max_reconsume_times: int
) -> List[Tuple[str, str]]:
    """The oldest CONSUMED record's age against the retention and the redelivery horizon. Its
    age comes from its owner token's time (then the retention is about age + time left), else
    from the retention given (age = retention - time left)."""
    left = record.expires_in_ms or 0
    at = claimed_at(record.owner or "")
    given = None if retention_minutes is None else retention_minutes * 60_000
    if at is not None:
        age = max(0.0, (time.time() - at) * 1000)
        retention, how = (given, "given") if given is not None else (age + left, "about")
    else:
        retention = given if given is not None else DEFAULT_RECORD_RESERVE_MINUTES * 60_000
        age, how = max(0.0, retention - left), "given" if given is not None else "the default"
    horizon = redelivery_horizon_ms(max_reconsume_times)
    horizon_text = f"{duration(horizon)} ({max_reconsume_times} retries)"
    if retention < horizon:
        horizon_text += click.style(
            " LONGER than the retention: a late redelivery runs again", fg="red"
        )
    element = record.element
    return [
        ("age", f"{duration(age)} ({element.topic} {element.key})" if element else duration(age)),
        ("time left", duration(left)),
        ("retention", f"{duration(retention)} ({how})"),
        ("redelivery horizon", horizon_text),
    ]


@cli.command()
@store_options
@click.option("--app", required=True, help="The application name of the config.")
@click.option("--limit", default=10, show_default=True, help="How many claims to list.")
@click.option(
    "--retention-minutes",
    type=float,
    help="The config's dedup_record_reserve_minutes (default: read from the oldest record's "
    "owner token, else 1440).",
)
@click.option(
    "--max-reconsume-times",
    default=DEFAULT_MAX_RECONSUME_TIMES,
    show_default=True,
    help="The group's retries before the DLQ, for the redelivery horizon.",
)
def stats(
    store: DedupStore,
    app: str,
    limit: int,
    retention_minutes: Optional[float],
    max_reconsume_times: int,
) -> None:
    """Records of an application by status; oldest claims; the oldest CONSUMED record's age
    against the retention."""
    result = store.stats(app, limit)
    click.echo(f"{store.describe()}, application {app!r}")
    rows = [(name, f"{count:,}") for name, count in sorted(result.counts.items())]
    print_table(rows or [("records", "0")])
    if result.oldest_consumed is not None:
        click.echo("oldest CONSUMED record:")
        print_table(retention_rows(result.oldest_consumed, retention_minutes, max_reconsume_times))
    if result.oldest_claims:
        click.echo("longest-held CONSUMING claims:")
        now = time.time()
        header = ("held", "left", "topic", "tag", "key", "owner")
        lines = [header]
        for record in result.oldest_claims:
            at = claimed_at(record.owner or "")
            element = record.element or DedupElement(app, "?", "?", "?")
            lines.append(
                (
                    duration((now - at) * 1000) if at else "?",
                    duration(record.expires_in_ms),
                    element.topic,
                    element.tag,
                    element.key,
                    record.owner or "?",
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        for n, line in enumerate(lines):
            text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
            click.echo("  " + (click.style(text.rstrip(), bold=True) if n == 0 else text.rstrip()))


@cli.command()
@store_options
@click.option("--batch-size", default=1000, show_default=True, help="Rows per step.")
@click.option("--dry-run", is_flag=True, help="Count the expired rows; delete nothing.")
def purge(store: DedupStore, batch_size: int, dry_run: bool) -> None:
    """Delete expired MySQL or PostgreSQL rows, with progress."""
    if not isinstance(store, (MySQLDedupStore, PostgresDedupStore)):
        raise UsageProblem(
            "Redis expires its records by itself: purge is for --mysql and --postgres"
        )
    with click.progressbar(length=0, label="scanning", show_pos=True) as bar:

        def progress(scanned: int, expired: int) -> None:
            bar.length = max(bar.length or 0, scanned)
            bar.update(scanned - bar.pos)

        begin = time.monotonic()
        result = store.purge_expired(batch_size, dry_run=dry_run, progress=progress)
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {result:,} expired row(s) in {time.monotonic() - begin:.1f} s")


@cli.group()
def schema() -> None:
    """Print the DDL of a record store."""


@schema.command("mysql")
@click.option("--table", default=DEFAULT_TABLE_NAME, show_default=True, help="Table name.")
def schema_mysql(table: str) -> None:
    """The CREATE TABLE statements of the MySQL store: the dedup table and the exactly-once
    mode's sequence table (what create_table() creates)."""
    try:
        statements = schema_statements(table)
    except DedupError as exc:
        raise UsageProblem(str(exc)) from exc
    click.echo("\n\n".join(s + ";" for s in statements))


@schema.command("postgres")
@click.option("--table", default=DEFAULT_TABLE_NAME, show_default=True, help="Table name.")
def schema_postgres(table: str) -> None:
    """The statements of the PostgreSQL store's table: CREATE TABLE and its column comments
    (what create_table() runs)."""
    try:
        statements = postgres_schema_statements(table)
    except DedupError as exc:
        raise UsageProblem(str(exc)) from exc
    click.echo(";\n".join(statements) + ";")


def kit_files() -> Iterator[Tuple[str, Traversable]]:
    """The operator kit shipped in the package (``rocketmq_dedup/ops``): each file's path in
    the kit (``prometheus/rocketmq-dedup.rules.yml``...) and the file."""

    def walk(folder: Traversable, prefix: str) -> Iterator[Tuple[str, Traversable]]:
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_dir():
                yield from walk(entry, f"{prefix}{entry.name}/")
            elif not entry.name.startswith((".", "__")):
                yield f"{prefix}{entry.name}", entry

    return walk(importlib.resources.files("rocketmq_dedup").joinpath("ops"), "")


@cli.group()
def ops() -> None:
    """The operator kit: Prometheus alerting rules, their promtool tests, a Grafana
    dashboard."""


@ops.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
def ops_export(directory: Path, force: bool) -> None:
    """Write the kit's files into DIRECTORY (prometheus/, grafana/), as shipped with this
    version; files that exist are left alone unless --force."""
    files = list(kit_files())
    existing = [name for name, _ in files if (directory / name).exists()]
    if existing and not force:
        raise UsageProblem(
            f"{', '.join(str(directory / n) for n in existing)} exist(s): --force overwrites"
        )
    for name, source in files:
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        click.echo(str(target))


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the process exit status. Errors are one line, never a
    traceback."""
    try:
        cli.main(args=argv, prog_name="rocketmq-dedup", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("aborted", err=True)
        return 130
    except (DedupError, NotImplementedError) as exc:
        click.echo(f"Error: {one_line(exc)}", err=True)
        return 2
    except Exception as exc:  # a server error mid-command: one line, not a traceback
        click.echo(f"Error: {type(exc).__name__}: {one_line(exc)}", err=True)
        return 2
    return 0


from rocketmq_dedup.cli_dlq import dlq  # noqa: E402 - its commands use the helpers above

cli.add_command(dlq)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
