"""``rocketmq-dedup dlq``: a consumer group's dead letters with their dedup records, and their
resend (:mod:`rocketmq_dedup.dlq` says how each is read, looked up and resent). Needs the name
server's address and, for the records, the store (``--redis``/``--mysql``) and the
application name; no RocketMQ client is needed (:mod:`rocketmq_dedup.remoting`)."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, List, Optional, Tuple

import click

from rocketmq_dedup.cli import UsageProblem, duration, print_table, record_rows, store_options
from rocketmq_dedup.dlq import (
    DeadLetter,
    KeyBy,
    KeyRule,
    dlq_topic,
    element_of,
    read_dead_letters,
    resend_properties,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.remoting import RemotingClient
from rocketmq_dedup.stores.base import DedupStore, Record

DEFAULT_NAMESRV = "127.0.0.1:9876"
_BODY_PREVIEW = 200

_KEY_HELP = (
    "How the listener keys its messages: the tool cannot run your dedup_message_key, so say "
    "which part of a message it returns. message-id (default): UNIQ_KEY, else the message id, "
    "the default key; first-key: the first of the message's keys (message_keys(msg)[0]; a "
    "5.x listener sorts several keys); or --key-property NAME for a user property."
)


class Context:
    """What every dlq command reads: the dead letters, and how to find their records."""

    def __init__(
        self,
        namesrv: str,
        group: str,
        store: Optional[DedupStore],
        app: Optional[str],
        rule: KeyRule,
    ) -> None:
        if store is not None and not app:
            raise UsageProblem("--app is needed with a store: the records are per application")
        self.client = RemotingClient(namesrv)
        self.namesrv, self.group, self.store, self.app, self.rule = namesrv, group, store, app, rule

    def letters(self) -> List[DeadLetter]:
        return read_dead_letters(self.client, self.group)

    def find(self, message_id: str) -> List[DeadLetter]:
        """The dead letters with this message id (or offset id), oldest first."""
        found = [
            letter
            for letter in self.letters()
            if message_id in (letter.message_id, letter.stored.offset_msg_id)
        ]
        if not found:
            raise UsageProblem(f"no dead letter {message_id!r} in {dlq_topic(self.group)}")
        return found

    def element(self, letter: DeadLetter) -> Optional[DedupElement]:
        if self.store is None or self.app is None:
            return None
        return element_of(letter, self.app, self.rule)

    def record(self, letter: DeadLetter) -> Optional[Record]:
        element = self.element(letter)
        return self.store.read(element) if self.store is not None and element else None

    def record_cells(self, letters: List[DeadLetter]) -> List[str]:
        """Each letter's record in one cell: its status (and reason), or why there is none;
        the records read in one store call."""
        if self.store is None:
            return ["-"] * len(letters)
        elements = [self.element(letter) for letter in letters]
        wanted = [element for element in elements if element is not None]
        found = iter(self.store.read_many(wanted) if wanted else [])
        return [
            status_cell(next(found)) if element is not None else self.no_element(letter)
            for letter, element in zip(letters, elements, strict=True)
        ]

    def no_element(self, letter: DeadLetter) -> str:
        """Why ``letter`` has no element to look up."""
        return "no key" if self.rule.key_of(letter) is None else "topic unknown"


def status_cell(record: Optional[Record]) -> str:
    """A record's status (and reason, when it has one), or ``none``."""
    if record is None:
        return "none"
    status = record.status.value if record.status is not None else "unreadable"
    reason = record.reason
    return f"{status} ({reason})" if reason else status


def dlq_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--namesrv, --group, the optional store, --app and the key rule, into ``context``."""

    @functools.wraps(function)
    def with_context(
        namesrv: str,
        group: str,
        store: Optional[DedupStore],
        app: Optional[str],
        key: str,
        key_property: Optional[str],
        **kw: Any,
    ) -> Any:
        rule = KeyRule(KeyBy.PROPERTY, key_property) if key_property else KeyRule(KeyBy(key))
        context = Context(namesrv, group, store, app, rule)
        try:
            return function(context=context, **kw)
        finally:
            context.client.close()

    wrapped: Callable[..., Any] = with_context
    for option in reversed(
        [
            click.option(
                "--namesrv",
                envvar="ROCKETMQ_NAMESRV",
                default=DEFAULT_NAMESRV,
                show_default=True,
                help="Name server address(es), host:port;host:port (env ROCKETMQ_NAMESRV).",
            ),
            click.option("--group", required=True, help="The consumer group (its DLQ)."),
            click.option("--app", help="The application name of the config (for the records)."),
            click.option(
                "--key",
                type=click.Choice([KeyBy.MESSAGE_ID.value, KeyBy.FIRST_KEY.value]),
                default=KeyBy.MESSAGE_ID.value,
                show_default=True,
                help=_KEY_HELP,
            ),
            click.option("--key-property", metavar="NAME", help="The key is this user property."),
        ]
    ):
        wrapped = option(wrapped)
    return store_options(wrapped, required=False)


def when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def print_columns(lines: List[Tuple[str, ...]]) -> None:
    """Aligned columns, the first line bold."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for n, line in enumerate(lines):
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        click.echo("  " + (click.style(text.rstrip(), bold=True) if n == 0 else text.rstrip()))


@click.group()
def dlq() -> None:
    """A consumer group's dead letters (%DLQ%<group>): list, show, resend.

    Each dead letter is shown with its dedup record, looked up by the application (--app), the
    topic it came from, its tag and its key (--key / --key-property: say how your listener keys
    messages). Reading consumes nothing.
    """


@dlq.command("list")
@dlq_options
@click.option("--limit", default=100, show_default=True, help="Show the newest N.")
def list_(context: Context, limit: int) -> None:
    """The group's dead letters, newest last, with their records."""
    letters = context.letters()
    topic = dlq_topic(context.group)
    if not letters:
        click.echo(f"{topic}: no dead letters (the topic appears with the group's first one)")
        return
    shown = letters[-limit:]
    click.echo(f"{topic} via {context.namesrv}: {len(letters)} dead letter(s)")
    lines: List[Tuple[str, ...]] = [("stored", "id", "topic", "tag", "key", "retries", "record")]
    for letter, record in zip(shown, context.record_cells(shown), strict=True):
        lines.append(
            (
                when(letter.stored.store_timestamp),
                letter.message_id,
                letter.origin or "?",
                letter.tag,
                context.rule.key_of(letter) or "-",
                str(letter.stored.reconsume_times),
                record,
            )
        )
    print_columns(lines)
    if len(shown) < len(letters):
        click.echo(f"({len(letters) - len(shown)} older not shown: --limit)")


@dlq.command()
@dlq_options
@click.argument("message_id")
def show(context: Context, message_id: str) -> None:
    """A dead letter in full: where it came from, its keys, properties, body and record."""
    for letter in context.find(message_id):
        stored = letter.stored
        body = stored.body
        preview = repr(body[:_BODY_PREVIEW]) + (" ..." if len(body) > _BODY_PREVIEW else "")
        rows = [
            ("id", letter.message_id),
            ("offset id", stored.offset_msg_id),
            ("dead-lettered", when(stored.store_timestamp)),
            ("first sent", when(stored.born_timestamp)),
            ("topic", letter.origin or "unknown (resend needs --topic)"),
            ("tag", letter.tag or "-"),
            ("keys", " ".join(letter.keys) or "-"),
            ("retries", str(stored.reconsume_times)),
            *((f"property {k}", v) for k, v in sorted(letter.user_properties.items())),
            ("body", f"{len(body):,} bytes: {preview}"),
            ("dedup key", f"{context.rule.key_of(letter) or '-'} ({context.rule.describe()})"),
        ]
        rows += record_section(context, letter)
        print_table(rows)


def record_section(context: Context, letter: DeadLetter) -> List[Tuple[str, str]]:
    """The record's rows for ``show``: status, owner, age, time left, reason."""
    if context.store is None:
        return [("record", "not looked up (no --redis/--mysql)")]
    if context.element(letter) is None:
        return [("record", context.no_element(letter))]
    record = context.record(letter)
    if record is None:
        return [("record", "none")]
    return record_rows(record)  # (a FAILED record's reason among them)


@dlq.command()
@dlq_options
@click.argument("message_id")
@click.option("--topic", help="Resend to this topic (default: the one it came from).")
@click.option(
    "--release", is_flag=True, help="Delete its dedup record first, so its handler runs again."
)
@click.option("--dry-run", is_flag=True, help="Say what would be done; release and send nothing.")
def resend(
    context: Context, message_id: str, topic: Optional[str], release: bool, dry_run: bool
) -> None:
    """Send a dead letter again to the topic it came from, with the same keys and properties.

    The newest dead letter with MESSAGE_ID is sent (the same body, UNIQ_KEY, keys, tag and user
    properties). Its UNIQ_KEY is kept, so the listener sees the same dedup key: with a CONSUMED
    record the copy is acked as a duplicate without its handler, unless --release deletes the
    record first. The dead letter stays in the DLQ (until the broker's commit log retention
    removes it), so it is still listed afterwards.
    """
    letters = context.find(message_id)
    letter = letters[-1]
    target = topic or letter.origin
    if target is None:
        raise UsageProblem(
            f"{message_id}: the topic it came from is unknown (no DLQ_ORIGIN_TOPIC or "
            "RETRY_TOPIC property): name it with --topic"
        )
    if release and context.store is None:
        raise UsageProblem("--release needs the store (--redis/--mysql) and --app")
    older = f" ({len(letters) - 1} older copies left alone)" if len(letters) > 1 else ""
    stored_at = when(letter.stored.store_timestamp)
    click.echo(f"dead letter {letter.message_id}, dead-lettered {stored_at}{older}")
    print_table(
        [
            ("to topic", target),
            ("tag, keys", f"{letter.tag or '-'}, {' '.join(letter.keys) or '-'}"),
            ("body", f"{len(letter.body):,} bytes"),
            ("record", release_plan(context, letter, release, dry_run)),
        ]
    )
    if dry_run:
        click.echo("dry run: nothing released, nothing sent")
        return
    route = context.client.route(target)
    if route is None:
        raise UsageProblem(f"topic {target!r} does not exist")
    msg_id, broker, queue = context.client.send(
        route, target, letter.body, resend_properties(letter), letter.stored.flag
    )
    click.echo(f"sent to {target} ({broker}, queue {queue}): broker message id {msg_id}")


def release_plan(context: Context, letter: DeadLetter, release: bool, dry_run: bool) -> str:
    """What happens to the dead letter's record (releasing it unless ``dry_run``)."""
    if context.store is None:
        return "not looked up (no --redis/--mysql)"
    element = context.element(letter)
    if element is None:
        return context.no_element(letter)
    record = context.store.read(element)
    if record is None:
        return "none: the handler runs for the resent copy"
    status = record.status.value if record.status is not None else "unreadable"
    if not release:
        if status == "CONSUMED":
            return (
                f"{status}, kept: the resent copy is acked as a duplicate without its "
                f"handler for {duration(record.expires_in_ms)} (--release runs it again)"
            )
        return f"{status}, kept"
    if dry_run:
        return f"{status}: would be released"
    deleted = context.store.delete(element, force=True)
    return f"{status}: released" if deleted is not None else f"{status}: gone meanwhile"
