"""Helpers of the outbox's integration tests (no tests here): the databases the outbox runs on
(:class:`Backend`: MySQL/MariaDB and PostgreSQL, each a real server), a sender that records what
it would have sent (the broker's side is the e2e tests'), a listener whose handler writes an
effect row and sends through the outbox, and the tables."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from rocketmq_dedup import DedupConfig, TransactionalDedupListener
from rocketmq_dedup.outbox import Outbox, OutboxMessage
from rocketmq_dedup.outbox.senders import Sender
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.postgres import PostgresDedupStore
from tests.integration.exactly_once.support import (
    MYSQL_DB,
    POSTGRES_DB,
    Database,
    EffectTable,
    unique,
)
from tests.support import MYSQL, PG_DSN, mysql_connect, pg_connect


class Backend:
    """A database the outbox runs on, as the tests use it."""

    name: str
    db: Database
    #: The command line's store options for it.
    cli_options: Tuple[str, str]
    #: A dedup table name too long for the outbox's names, and the limit the refusal names.
    too_long: Tuple[str, str]

    def client(self) -> Callable[[], Any]:
        """A connection factory, as users pass it to DedupConfig."""
        raise NotImplementedError

    def store(self, table: str, source: Any = None) -> Any:
        """A store on ``table`` (of ``source``, or a new factory)."""
        raise NotImplementedError

    def refused(self) -> Any:
        """Connect to a closed port: the driver's real "connection refused"."""
        raise NotImplementedError

    def session(self, runner: Any) -> int:
        """The server session of one of the relays' pooled connections."""
        raise NotImplementedError

    def connect(self) -> Any:
        """A new connection with autocommit off: its statements are in a transaction until
        ``commit()``."""
        return self.client()()

    def set_autocommit(self, conn: Any, on: bool) -> None:
        conn.autocommit = on

    def kill_relay_sessions(self, outbox: Outbox) -> None:
        """Kill the sessions of the relays' connections (the server ends them, as a restart
        would; nobody else's)."""
        for session in [self.session(runner) for runner in outbox.tables.pool._live]:  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):  # gone already
                self.db.kill(session)

    def __repr__(self) -> str:
        return self.name


class MySQLBackend(Backend):
    name = "mysql"
    db = MYSQL_DB
    cli_options = ("--mysql", "mysql://{user}:{password}@{host}:{port}/{database}".format(**MYSQL))
    too_long = ("t" * 60, "52")

    def client(self) -> Callable[[], Any]:
        return mysql_connect()

    def store(self, table: str, source: Any = None) -> Any:
        return MySQLDedupStore(source or self.client(), table)

    def connect(self) -> Any:
        conn = self.client()()
        conn.autocommit(False)
        return conn

    def set_autocommit(self, conn: Any, on: bool) -> None:
        conn.autocommit(on)

    def refused(self) -> Any:
        import MySQLdb

        return MySQLdb.connect(**{**MYSQL, "port": 1, "connect_timeout": 2})

    def session(self, runner: Any) -> int:
        return int(runner.session)


class PostgresBackend(Backend):
    name = "postgres"
    db = POSTGRES_DB
    cli_options = ("--postgres", PG_DSN)
    too_long = ("t" * 50, "46")

    def client(self) -> Callable[[], Any]:
        return pg_connect(PG_DSN)

    def store(self, table: str, source: Any = None) -> Any:
        return PostgresDedupStore(source or self.client(), table)

    def refused(self) -> Any:
        import psycopg

        return psycopg.connect(PG_DSN, port=1, connect_timeout=2)

    def session(self, runner: Any) -> int:
        return int(runner.conn.info.backend_pid)


MYSQL_BACKEND, POSTGRES_BACKEND = MySQLBackend(), PostgresBackend()
#: Every database the outbox runs on.
BACKENDS = [MYSQL_BACKEND, POSTGRES_BACKEND]


def backend_of(outbox: Outbox) -> Backend:
    """The database an outbox is on."""
    postgres = type(outbox.tables).__module__.startswith("rocketmq_dedup.stores.postgres")
    return POSTGRES_BACKEND if postgres else MYSQL_BACKEND


#: What a fake send does with a message: None (acknowledged) or raise a SendFailure.
Behaviour = Callable[[OutboxMessage], None]


class RecordingSender(Sender):
    """A broker that acknowledges every message (or does what ``behaviour`` says), after
    ``delay_s``; records each acknowledged message with the time, in order, and counts every
    attempt."""

    client = "fake"

    def __init__(self, behaviour: Optional[Behaviour] = None, delay_s: float = 0.0) -> None:
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.sent: List[Tuple[OutboxMessage, float]] = []
        self.attempts: List[OutboxMessage] = []
        self.lock = threading.Lock()
        self._ids = 0

    def send(self, message: OutboxMessage) -> str:
        with self.lock:
            self.attempts.append(message)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.behaviour is not None:
            self.behaviour(message)
        with self.lock:
            self._ids += 1
            self.sent.append((message, time.monotonic()))
            return f"FAKE{self._ids:08d}"

    def message_keys(self) -> List[str]:
        with self.lock:
            return [message.message_key for message, _ in self.sent]

    def bodies(self) -> List[bytes]:
        with self.lock:
            return [message.body for message, _ in self.sent]


class SendingListener(TransactionalDedupListener):
    """Writes an effect row keyed by the message id and sends one message through ``outbox``
    (topic ``OUT``, body and key ``<id>:B``; the sharding key ``sharding(msg)``), then answers
    what ``answer(msg)`` says (True by default)."""

    def __init__(
        self,
        config: DedupConfig,
        effects: EffectTable,
        outbox: Outbox,
        answer: Optional[Callable[[Any], Any]] = None,
        sharding: Optional[Callable[[Any], Optional[str]]] = None,
    ) -> None:
        self.effects = effects
        self.outbox = outbox
        self.answer = answer
        self.sharding = sharding
        super().__init__(config)

    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        self.effects.insert(conn, msg.id)
        sharding_key = self.sharding(msg) if self.sharding is not None else None
        self.outbox.send(conn, "OUT", f"{msg.id}:B", keys=f"{msg.id}:B", sharding_key=sharding_key)
        return True if self.answer is None else self.answer(msg)


def outbox_rows(outbox: Outbox) -> Dict[str, Tuple[str, int]]:
    """message key -> (status, attempts) of every row of the outbox's table."""
    rows = backend_of(outbox).db.sql(f"SELECT message_key, status, attempts FROM {outbox.name}")
    return {str(k): (str(s), int(a)) for k, s, a in rows}


def create_tables(backend: Backend) -> str:
    """A new dedup table with its outbox tables (every table create_table() makes); its name."""
    name = unique("t_obx")
    store = backend.store(name)
    store.create_table()
    store.close()
    return name


def drop_tables(db: Database, table: str) -> None:
    for suffix in ("", "_seq", "_outbox", "_outbox_lane"):
        db.sql(f"DROP TABLE IF EXISTS {table}{suffix}")


__all__ = [
    "BACKENDS",
    "Backend",
    "RecordingSender",
    "SendingListener",
    "backend_of",
    "create_tables",
    "drop_tables",
    "outbox_rows",
]
