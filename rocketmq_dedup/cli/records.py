"""The commands on a store's records: ``check``, ``inspect``, ``release``, ``stats``, ``purge``
and ``schema``."""

from __future__ import annotations

import time
from typing import (
    List,
    Optional,
    Tuple,
)

import click

from rocketmq_dedup.cli._options import (
    UsageProblem,
    duration,
    element_options,
    live_record,
    print_columns,
    print_table,
    record_rows,
    store_options,
)
from rocketmq_dedup.config import DEFAULT_RECORD_RESERVE_MINUTES
from rocketmq_dedup.errors import DedupError
from rocketmq_dedup.horizon import DEFAULT_MAX_RECONSUME_TIMES, redelivery_horizon_ms
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at
from rocketmq_dedup.stores.base import PROBE_APPLICATION, Record
from rocketmq_dedup.stores.mysql import DEFAULT_TABLE_NAME, MySQLDedupStore, schema_statements
from rocketmq_dedup.stores.operations import OperatedStore
from rocketmq_dedup.stores.postgres import PostgresDedupStore
from rocketmq_dedup.stores.postgres import schema_statements as postgres_schema_statements


@click.command()
@store_options
@click.option(
    "--app",
    default=PROBE_APPLICATION,
    show_default=True,
    help="The application whose key space the write check's probe records use.",
)
def check(store: OperatedStore, app: str) -> None:
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


@click.command()
@store_options
@element_options
def inspect(store: OperatedStore, element: DedupElement) -> None:
    """Show the record of KEY: status, owner, age, time left (and a FAILED record's reason)."""
    print_table(record_rows(live_record(store, element)))


@click.command()
@store_options
@element_options
@click.option("--force", is_flag=True, help="Also delete a CONSUMED record (it will run again).")
def release(store: OperatedStore, element: DedupElement, force: bool) -> None:
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


@click.command()
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
    store: OperatedStore,
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
        print_columns(lines)


@click.command()
@store_options
@click.option("--batch-size", default=1000, show_default=True, help="Rows per step.")
@click.option("--dry-run", is_flag=True, help="Count the expired rows; delete nothing.")
def purge(store: OperatedStore, batch_size: int, dry_run: bool) -> None:
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


@click.group()
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
