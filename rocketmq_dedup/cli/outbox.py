"""The outbox's commands of ``rocketmq-dedup`` (the ``[cli]`` extra): ``relay`` (a standalone
relay) and ``outbox list|retry|drop|purge`` (an operator's view of the rows). The store options
are the command line's own (``--mysql URL`` or ``--postgres DSN``, ``--table``: the dedup table,
the outbox is named after it)."""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import click

from rocketmq_dedup.cli._options import (
    UsageProblem,
    duration,
    print_columns,
    print_table,
    store_options,
)
from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.outbox.outbox import Outbox
from rocketmq_dedup.status import OutboxStatus
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.stores.outbox import ListedRow

#: The classic producer's largest message: the broker's default (its client's own is 128 KiB).
CLASSIC_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d)?")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(text: str) -> float:
    """``90``, ``90s``, ``15m``/``15min``, ``12h``, ``7d``, ``500ms`` -> seconds."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise click.BadParameter(f"{text!r}: a duration such as 30s, 15m, 12h or 7d")
    return float(found.group(1)) * _UNITS[found.group(2)]


def outbox_of(store: DedupStore) -> Outbox:
    try:
        return Outbox(store)
    except DedupConfigError as exc:
        raise UsageProblem(str(exc)) from exc


# -- relay -----------------------------------------------------------------------------------------


def start_producer(namesrv: Optional[str], proxy: Optional[str], group: str) -> Any:
    """A started producer of the client the options name (``shutdown()`` stops either)."""
    if bool(namesrv) == bool(proxy):
        raise UsageProblem("name one broker: --namesrv ADDR (classic client) or --proxy ADDR (5.x)")
    if namesrv:
        try:
            from rocketmq.client import Producer
        except ImportError as exc:
            raise UsageProblem(
                "--namesrv needs the classic client: pip install 'rocketmq-dedup[rocketmq]'"
            ) from exc
        from rocketmq_dedup.adapters.classic import set_name_server

        producer = Producer(group, max_message_size=CLASSIC_MAX_MESSAGE_SIZE)
        set_name_server(producer, namesrv)
        producer.start()
        return producer
    try:
        from rocketmq import ClientConfiguration, Credentials, Producer
    except ImportError as exc:
        raise UsageProblem(
            "--proxy needs the 5.x client: pip install 'rocketmq-dedup[rocketmq5]'"
        ) from exc
    grpc_producer = Producer(ClientConfiguration(proxy, Credentials()))
    grpc_producer.startup()
    return grpc_producer


def serve_metrics(port: Optional[int]) -> Any:
    """A :class:`PrometheusMetrics` served on ``port`` (None: no metrics)."""
    if port is None:
        return None
    try:
        import prometheus_client

        from rocketmq_dedup.metrics import PrometheusMetrics
    except ImportError as exc:
        raise UsageProblem(
            "--metrics-port needs prometheus_client: pip install 'rocketmq-dedup[prometheus]'"
        ) from exc
    metrics = PrometheusMetrics()
    prometheus_client.start_http_server(port, addr="127.0.0.1")
    return metrics


@click.command()
@store_options
@click.option("--namesrv", metavar="ADDR", help="Send with the classic client (name server).")
@click.option("--proxy", metavar="ADDR", help="Send with the 5.x client (proxy's gRPC port).")
@click.option(
    "--group", default="rocketmq-dedup-relay", show_default=True, help="Classic producer group."
)
@click.option("--batch-size", default=64, show_default=True, help="Rows claimed at a time.")
@click.option("--concurrency", default=4, show_default=True, help="Sends in flight at once.")
@click.option("--poll-interval", default="1s", show_default=True, help="Longest wait for new rows.")
@click.option("--lease", default="30s", show_default=True, help="How long a claim holds its rows.")
@click.option(
    "--give-up-after",
    default="1h",
    show_default=True,
    help="Park a row whose sends keep failing (no route, unknown errors) after this long.",
)
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on 127.0.0.1:PORT.")
@click.option("--once", is_flag=True, help="Send what is due now, then exit.")
def relay(
    store: DedupStore,
    namesrv: Optional[str],
    proxy: Optional[str],
    group: str,
    batch_size: int,
    concurrency: int,
    poll_interval: str,
    lease: str,
    give_up_after: str,
    metrics_port: Optional[int],
    once: bool,
) -> None:
    """Send the outbox's rows to RocketMQ until SIGINT/SIGTERM (a standalone relay)."""
    from rocketmq_dedup.outbox.relay import OutboxRelay

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    outbox = outbox_of(store)
    metrics = serve_metrics(metrics_port)
    producer = start_producer(namesrv, proxy, group)
    try:
        try:
            runner = OutboxRelay(
                outbox,
                producer,
                batch_size=batch_size,
                concurrency=concurrency,
                poll_interval_s=seconds(poll_interval),
                lease_s=seconds(lease),
                give_up_after_s=seconds(give_up_after),
                metrics=metrics,
            )
        except DedupConfigError as exc:
            raise UsageProblem(str(exc)) from exc
        if once:
            sent = 0
            while (claimed := runner.run_once()) > 0:
                sent += claimed
            click.echo(f"relayed {sent} row(s) of {outbox.describe()}")
            return
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        with runner:
            click.echo(f"relaying {outbox.describe()}; Ctrl-C or SIGTERM to stop", err=True)
            while not stopping.wait(1.0):
                pass
    finally:
        producer.shutdown()


# -- outbox ----------------------------------------------------------------------------------------


@click.group()
def outbox() -> None:
    """Look at and repair the outbox's rows (MySQL or PostgreSQL)."""


def listed_lines(rows: Sequence[ListedRow]) -> List[Tuple[str, ...]]:
    lines: List[Tuple[str, ...]] = [
        ("id", "status", "age", "tries", "due", "topic", "key", "sharding key", "last error")
    ]
    for row in rows:
        due = "-"
        if row.status is OutboxStatus.PENDING:
            due = "now" if row.due_in_ms <= 0 else f"in {duration(row.due_in_ms)}"
            if row.claimed_by:
                due = f"claimed ({duration(max(row.due_in_ms, 0))} left)"
        lines.append(
            (
                str(row.id),
                row.status.value,
                duration(row.age_ms),
                str(row.attempts),
                due,
                row.topic,
                row.message_key,
                row.sharding_key or "",
                (row.last_error or "")[:80],
            )
        )
    return lines


@outbox.command("list")
@store_options
@click.option(
    "--status",
    type=click.Choice([s.value for s in OutboxStatus], case_sensitive=False),
    help="Only rows of this status (default: every status).",
)
@click.option("--limit", default=20, show_default=True, help="How many rows.")
@click.option("--after", "after_id", default=0, show_default=True, help="Rows after this id.")
def list_rows(store: DedupStore, status: Optional[str], limit: int, after_id: int) -> None:
    """The backlog, and the rows oldest first."""
    box = outbox_of(store)
    backlog = box.tables.backlog()
    click.echo(box.describe())
    oldest = "-" if backlog.oldest_pending_ms is None else duration(backlog.oldest_pending_ms)
    print_table(
        [
            ("pending", f"{backlog.pending:,} (oldest {oldest})"),
            ("parked", f"{backlog.parked:,}"),
        ]
    )
    wanted = None if status is None else OutboxStatus(status.upper())
    rows = box.tables.rows(wanted, limit, after_id)
    if rows:
        print_columns(listed_lines(rows))


def ids_or_usage(ids: Sequence[int], every: bool, every_flag: str) -> Optional[List[int]]:
    if bool(ids) == every:
        raise UsageProblem(f"name the rows: ID... or {every_flag}")
    return None if every else list(ids)


@outbox.command()
@store_options
@click.argument("ids", nargs=-1, type=int)
@click.option("--all-parked", "every", is_flag=True, help="Every PARKED row.")
def retry(store: DedupStore, ids: Sequence[int], every: bool) -> None:
    """Send PARKED rows again (and PENDING ones in their backoff, now)."""
    box = outbox_of(store)
    count = box.tables.retry(ids_or_usage(ids, every, "--all-parked"))
    click.echo(f"{count} row(s) back to PENDING, due now")


@outbox.command()
@store_options
@click.argument("ids", nargs=-1, type=int, required=True)
def drop(store: DedupStore, ids: Sequence[int]) -> None:
    """Give up PARKED rows (never sent): the rows of their sharding key behind them go on."""
    count = outbox_of(store).tables.drop(list(ids))
    click.echo(f"{count} row(s) DROPPED")
    if count < len(set(ids)):
        raise click.ClickException(
            f"{len(set(ids)) - count} of the ids are not PARKED (or PENDING and unclaimed): left"
        )


@outbox.command()
@store_options
@click.option(
    "--older-than",
    default="7d",
    show_default=True,
    help="Retention: rows sent (or dropped) longer ago than this.",
)
@click.option("--batch-size", default=1000, show_default=True, help="Rows per DELETE.")
def purge(store: DedupStore, older_than: str, batch_size: int) -> None:
    """Delete SENT and DROPPED rows past the retention, with progress."""
    box = outbox_of(store)
    retention_ms = int(seconds(older_than) * 1000)
    begin = time.monotonic()
    report: Callable[[int], None] = lambda n: click.echo(f"\r  deleted {n:,}", nl=False)  # noqa: E731
    deleted = box.tables.purge(retention_ms, batch_size, report)
    click.echo(
        f"\rdeleted {deleted:,} row(s) older than {older_than} in {time.monotonic() - begin:.1f} s"
    )


__all__ = ["outbox", "relay", "seconds"]
