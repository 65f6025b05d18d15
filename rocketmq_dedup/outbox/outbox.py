"""The :class:`Outbox`: messages a handler sends, written as rows in its transaction.

``outbox.send(conn, topic, body, ...)`` validates the message (:mod:`.message`) and INSERTs it
through ``conn`` into ``<table>_outbox`` beside the dedup table: the row commits with the
handler's writes and the message's dedup record, or never. A relay (:mod:`.relay`) sends it
after the commit. In a :class:`~rocketmq_dedup.TransactionalDedupListener`'s handler, the send
also asks the transaction to wake this process's relays once it has committed (no wait for a
poll); elsewhere (a transaction of your own), call :meth:`Outbox.wake` after your commit, or let
the relays' polling find the row.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, List, NamedTuple, Optional

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import DedupConfigError, OutboxMessageError
from rocketmq_dedup.metrics import DedupMetrics
from rocketmq_dedup.outbox.message import MAX_BODY_BYTES, make_message
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.stores.outbox import OutboxTables
from rocketmq_dedup.stores.transaction import current_transaction

if TYPE_CHECKING:
    from rocketmq_dedup.outbox.relay import OutboxRelay


class OutboxReceipt(NamedTuple):
    """What :meth:`Outbox.send` wrote."""

    id: int
    """The row's id (``rocketmq-dedup outbox list`` shows it)."""
    message_key: str
    """The key the message is sent with, every time (:mod:`.message`)."""


def outbox_tables_of(store: Any) -> Optional[OutboxTables]:
    """The store's outbox port, if it has one."""
    tables = getattr(store, "outbox", None)
    return tables if isinstance(tables, OutboxTables) else None


def unsupported_store(store: Any, source: Any) -> str:
    """Why ``store`` (of ``source``) cannot hold an outbox: only a SQL database's store (MySQL/
    MariaDB, PostgreSQL) writes rows in the handler's transaction."""
    what = store.describe() if isinstance(store, DedupStore) else repr(source)
    return (
        "the outbox needs a DedupConfig (or a store) on MySQL/MariaDB or PostgreSQL, the "
        f"database the handlers write to; got {what}"
    )


class Outbox:
    """Messages sent through the handler's transaction (module docstring).

    :param source: the :class:`~rocketmq_dedup.DedupConfig` of the listener whose handlers
        send (its MySQL or PostgreSQL store: the outbox is ``<table>_outbox`` in the same
        database, created by ``create_table()``), or such a store itself (a producer-side
        application without a listener: ``Outbox(MySQLDedupStore(connect))``,
        ``Outbox(PostgresDedupStore(connect))``).
    :raises DedupConfigError: the store is not a SQL database's (a Redis or memory store
        cannot write rows in the handler's transaction).
    :param max_body_bytes: the largest body :meth:`send` takes (default 4 MiB, the broker's
        default limit).
    """

    def __init__(self, source: Any, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        config = source if isinstance(source, DedupConfig) else None
        store = source.persist if config is not None else source
        tables = outbox_tables_of(store)
        if tables is None:
            raise DedupConfigError(unsupported_store(store, source))
        if type(max_body_bytes) is not int or max_body_bytes < 1:
            raise DedupConfigError(f"max_body_bytes must be a positive int; got {max_body_bytes!r}")
        self.tables: OutboxTables = tables
        self.config = config
        self.max_body_bytes = max_body_bytes
        self._relays: List[OutboxRelay] = []
        self._relays_lock = threading.Lock()

    @property
    def name(self) -> str:
        """The outbox table's name."""
        return self.tables.name

    @property
    def metrics(self) -> Optional[DedupMetrics]:
        """The config's metrics object, if any (the relays report through it by default)."""
        return self.config.metrics if self.config is not None else None

    def describe(self) -> str:
        return self.tables.describe()

    def send(
        self,
        conn: Any,
        topic: str,
        body: Any,
        *,
        keys: Any = None,
        tag: Optional[str] = None,
        properties: Optional[dict[str, str]] = None,
        sharding_key: Optional[str] = None,
    ) -> OutboxReceipt:
        """Write a message to send after ``conn``'s transaction commits.

        :param conn: the handler's ``conn`` (or any connection of that database in a
            transaction: a DB-API connection with autocommit off, or a SQLAlchemy
            ``Connection`` in ``begin()``); the row commits or rolls back with it.
        :param body: bytes, or str (sent as UTF-8).
        :param keys: the message's key (a str) or keys (the first is its message key, sent on
            every attempt: make it identify the message, e.g. ``f"{order_id}:shipped"``); None:
            a key is generated.
        :param tag: the message's tag.
        :param properties: user properties, str to str.
        :param sharding_key: messages of one sharding key are sent in the order their
            transactions committed, to one queue (classic ``send_orderly_with_sharding_key``;
            5.x: the message group, on a FIFO topic).
        :raises OutboxMessageError: a message the brokers would refuse, or a ``conn`` in
            autocommit mode; nothing was written.
        :raises StoreError: the INSERT failed (the driver's error chained); let it propagate so
            the message's transaction rolls back.
        """
        message = make_message(
            topic, body, keys, tag, properties, sharding_key, max_body_bytes=self.max_body_bytes
        )
        if self.tables.in_transaction(conn) is False:
            raise OutboxMessageError(
                "conn is in autocommit mode: the row would commit on its own, whatever becomes "
                "of the rest; send through the handler's conn (or a connection in a transaction)"
            )
        row_id = self.tables.write(conn, message)
        tx = current_transaction()
        if tx is not None and tx.conn is conn and self._relays:
            tx.call_after_commit(self.wake)
        return OutboxReceipt(row_id, message.message_key)

    def wake(self) -> None:
        """Tell this process's running relays that rows committed (done for you after a
        :class:`~rocketmq_dedup.TransactionalDedupListener` transaction that sent)."""
        for relay in self._relays:
            relay.wake()

    def relay(self, producer: Any, **options: Any) -> OutboxRelay:
        """An :class:`~rocketmq_dedup.outbox.OutboxRelay` of this outbox sending through
        ``producer`` (not started)."""
        from rocketmq_dedup.outbox.relay import OutboxRelay

        return OutboxRelay(self, producer, **options)

    def _attach(self, relay: OutboxRelay) -> None:
        with self._relays_lock:  # copy on write: wake() iterates without the lock
            self._relays = [*self._relays, relay]

    def _detach(self, relay: OutboxRelay) -> None:
        with self._relays_lock:
            self._relays = [r for r in self._relays if r is not relay]

    def __repr__(self) -> str:
        return f"<Outbox {self.describe()}>"


__all__ = ["Outbox", "OutboxReceipt", "outbox_tables_of"]
