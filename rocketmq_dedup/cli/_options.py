"""What the commands share: the store options (a store named by URL, opened and checked once),
the record's element options, and how records and tables are printed."""

from __future__ import annotations

import functools
import os
import time
from typing import (
    Any,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)
from urllib.parse import parse_qs, unquote, urlsplit

import click

from rocketmq_dedup.errors import DedupError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores import make_store
from rocketmq_dedup.stores.base import Record
from rocketmq_dedup.stores.mysql import DEFAULT_TABLE_NAME
from rocketmq_dedup.stores.operations import OperatedStore
from rocketmq_dedup.stores.redis import DEFAULT_KEY_PREFIX

F = TypeVar("F", bound=Callable[..., Any])


class UsageProblem(click.ClickException):
    """Bad input or an unreachable store: one line, exit status 2."""

    exit_code = 2


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


def open_store(urls: StoreUrls, table: str, key_prefix: str) -> OperatedStore:
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
    assert isinstance(store, OperatedStore)  # the stores named by URL have the operator API
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


def print_columns(lines: Sequence[Tuple[str, ...]]) -> None:
    """Aligned columns, the first line bold."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for n, line in enumerate(lines):
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        click.echo("  " + (click.style(text.rstrip(), bold=True) if n == 0 else text.rstrip()))


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


def live_record(store: OperatedStore, element: DedupElement) -> Record:
    record = store.read(element)
    if record is None:
        raise UsageProblem(f"no live record for key {element.key!r}")
    return record
