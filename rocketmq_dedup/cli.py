"""The ``rocketmq-dedup`` command line (also ``python -m rocketmq_dedup``); needs the ``[cli]``
extra (click).

Stores are named by URL: ``--redis redis://[:password@]host:port/db`` (also ``rediss://`` and
``unix://``, as redis-py reads them) or ``--mysql mysql://user[:password]@host[:port]/database``
(``?unix_socket=/path`` accepted). Both may come from the environment instead
(``ROCKETMQ_DEDUP_REDIS_URL``, ``ROCKETMQ_DEDUP_MYSQL_URL``), and so may the passwords
(``REDISCLI_AUTH``, ``ROCKETMQ_DEDUP_MYSQL_PASSWORD``), to keep them off the command line.

Exit status: 0 done; 1 a check failed (``check``: e.g. the table is missing or lacks a column)
or ``release`` refused a CONSUMED record without ``--force``; 2 bad input (a bad URL, an
unknown table outside ``check``, a key with no live record) or an unreachable store.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from rocketmq_dedup.errors import DedupError, MissingExtraError

try:
    import click
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingExtraError("click", "cli") from exc

from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at
from rocketmq_dedup.stores import make_store
from rocketmq_dedup.stores.base import DedupStore, Record
from rocketmq_dedup.stores.mysql import DEFAULT_TABLE_NAME, MySQLDedupStore, schema_statements
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
    """Look at and repair rocketmq-dedup's records in Redis or MySQL; relay its outbox."""


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


def store_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--redis/--mysql/--table/--key-prefix, resolved into the ``store`` argument (checked
    once: an unreachable store is exit status 2)."""

    @_wraps(function)
    def with_store(
        redis_url: Optional[str], mysql_url: Optional[str], table: str, key_prefix: str, **kw: Any
    ) -> Any:
        return function(store=open_store(redis_url, mysql_url, table, key_prefix), **kw)

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
        click.option("--table", default=DEFAULT_TABLE_NAME, show_default=True, help="MySQL table."),
        click.option(
            "--key-prefix", default=DEFAULT_KEY_PREFIX, show_default=True, help="Redis prefix."
        ),
    ]
    wrapped: Callable[..., Any] = with_store
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


def open_store(
    redis_url: Optional[str], mysql_url: Optional[str], table: str, key_prefix: str
) -> DedupStore:
    """The store the options name, checked once (an unreachable store is exit status 2)."""
    if bool(redis_url) == bool(mysql_url):
        raise UsageProblem("name one store: --redis URL or --mysql URL")
    if redis_url:
        store = make_store(_redis_client(redis_url), key_prefix=key_prefix)
    else:
        store = make_store(mysql_factory(str(mysql_url)), table_name=table)
    try:
        store.check()
    except DedupError as exc:
        raise UsageProblem(f"cannot reach {store.describe()}: {exc.__cause__ or exc}") from exc
    return store


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
    return [
        ("status", click.style(status, fg=colour)),
        ("owner", record.owner or "unknown"),
        ("claimed", f"{duration((time.time() - at) * 1000)} ago" if at else "unknown"),
        ("time left", duration(record.expires_in_ms)),
    ]


# -- commands ------------------------------------------------------------------------------------


@cli.command()
@store_options
def check(store: DedupStore) -> None:
    """Check the server, its version and the features used."""
    click.echo(store.describe())
    results = store.diagnose()
    for result in results:
        mark = click.style("ok  ", fg="green") if result.ok else click.style("FAIL", fg="red")
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
    """Show the record of KEY: status, owner, age, time left."""
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


@cli.command()
@store_options
@click.option("--app", required=True, help="The application name of the config.")
@click.option("--limit", default=10, show_default=True, help="How many claims to list.")
def stats(store: DedupStore, app: str, limit: int) -> None:
    """Records of an application by status; oldest claims."""
    result = store.stats(app, limit)
    click.echo(f"{store.describe()}, application {app!r}")
    rows = [(name, f"{count:,}") for name, count in sorted(result.counts.items())]
    print_table(rows or [("records", "0")])
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
    """Delete expired MySQL rows, with progress."""
    if not isinstance(store, MySQLDedupStore):
        raise UsageProblem("Redis expires its records by itself: purge is for --mysql")
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
    """The CREATE TABLE statements of the MySQL store: the dedup table, the exactly-once
    mode's sequence table and the outbox's two tables (what create_table() creates)."""
    try:
        statements = schema_statements(table)
    except DedupError as exc:
        raise UsageProblem(str(exc)) from exc
    click.echo("\n\n".join(s + ";" for s in statements))


from rocketmq_dedup.outbox.commands import register  # noqa: E402 - needs the helpers above

register(cli)


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
        click.echo(f"Error: {exc}", err=True)
        return 2
    except Exception as exc:  # a server error mid-command: one line, not a traceback
        click.echo(f"Error: {type(exc).__name__}: {exc}", err=True)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
