"""Helpers for the exactly-once tests (no tests here): drivers (DB-API and SQLAlchemy),
tables, a business listener whose effects are rows of its own table."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from rocketmq_dedup import ConsumeStatus, DedupConfig, TransactionalDedupListener
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import MYSQL, mysql_connect

#: Every driver the exactly-once mode supports: DB-API factories and SQLAlchemy engines.
DRIVERS = [
    "mysqlclient",
    "pymysql",
    "mysql-connector",
    "sqlalchemy+mysqlclient",
    "sqlalchemy+pymysql",
]
_SA_DIALECTS = {"sqlalchemy+mysqlclient": "mysqldb", "sqlalchemy+pymysql": "pymysql"}


def make_client(driver: str, **engine_options: Any) -> Any:
    """A connection factory, or a SQLAlchemy Engine, for ``driver``."""
    if driver in _SA_DIALECTS:
        import sqlalchemy

        url = sqlalchemy.URL.create(
            f"mysql+{_SA_DIALECTS[driver]}",
            username=MYSQL["user"],
            password=MYSQL["password"],
            host=MYSQL["host"],
            port=MYSQL["port"],
            database=MYSQL["database"],
        )
        options = {"pool_size": 24, "max_overflow": 8, **engine_options}
        return sqlalchemy.create_engine(url, **options)
    return mysql_connect(driver)


def dispose(client: Any) -> None:
    if hasattr(client, "dispose"):
        client.dispose()


def admin() -> Any:
    """A mysqlclient connection in autocommit mode, for setup and checks."""
    conn = mysql_connect()()
    conn.autocommit(True)
    return conn


def sql(statement: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Run one statement on a fresh autocommit connection; its rows."""
    conn = admin()
    try:
        cur = conn.cursor()
        cur.execute(statement, params)
        return list(cur.fetchall())
    finally:
        conn.close()


def execute(conn: Any, statement: str, params: Tuple[Any, ...] = ()) -> Any:
    """Run a statement on a handler's ``conn``: a DB-API connection or a SQLAlchemy one."""
    if hasattr(conn, "exec_driver_sql"):
        return conn.exec_driver_sql(statement, params)
    cur = conn.cursor()
    cur.execute(statement, params)
    return cur


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class EffectTable:
    """A business table: one row per applied effect (no unique key, so a double application
    would show as two rows)."""

    def __init__(self) -> None:
        self.name = unique("t_eo_effect")
        sql(
            f"CREATE TABLE {self.name} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
            "k VARCHAR(191) NOT NULL, v VARCHAR(64) NULL, KEY (k)) ENGINE=InnoDB"
        )

    def insert(self, conn: Any, key: str, value: str = "") -> None:
        execute(conn, f"INSERT INTO {self.name} (k, v) VALUES (%s, %s)", (key, value))

    def counts(self) -> Dict[str, int]:
        return {str(k): int(n) for k, n in sql(f"SELECT k, COUNT(*) FROM {self.name} GROUP BY k")}

    def count(self, key: str) -> int:
        return self.counts().get(key, 0)

    def drop(self) -> None:
        sql(f"DROP TABLE IF EXISTS {self.name}")


def make_config(
    client: Any, table: str, application: Optional[str] = None, **options: Any
) -> DedupConfig:
    """A config on ``table`` of a new application (or ``application``: another consumer of
    the same one, with its own store, as another process has)."""
    options.setdefault("pool_size", 24)
    config = DedupConfig.enable_dedup_consume_config(
        application or unique("eo-app"), client, table_name=table, **options
    )
    assert isinstance(config.persist, MySQLDedupStore)
    return config


Behaviour = Callable[[Any, Any], Any]


class EffectListener(TransactionalDedupListener):
    """Inserts one effect row keyed by the message id, then does what ``behaviour`` says
    (default: return True). Counts handler calls."""

    def __init__(
        self,
        config: DedupConfig,
        effects: EffectTable,
        behaviour: Optional[Behaviour] = None,
    ) -> None:
        self.effects = effects
        self.behaviour = behaviour
        self.calls: Dict[str, int] = {}
        self.lock = threading.Lock()
        super().__init__(config)

    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        with self.lock:
            self.calls[msg.id] = self.calls.get(msg.id, 0) + 1
        self.effects.insert(conn, msg.id)
        if self.behaviour is not None:
            return self.behaviour(msg, conn)
        return True


class SequencedListener(EffectListener):
    """An EffectListener whose ``sequence_key`` is given by a function of the message."""

    def __init__(
        self,
        config: DedupConfig,
        effects: EffectTable,
        sequence: Callable[[Any], Any],
        behaviour: Optional[Behaviour] = None,
    ) -> None:
        self._sequence = sequence
        super().__init__(config, effects, behaviour)

    def sequence_key(self, msg: Any) -> Any:
        return self._sequence(msg)


def redeliver_until_acked(
    listener: Any, msgs: List[ClassicMessage], threads: int = 4
) -> Dict[str, List[ConsumeStatus]]:
    """A concurrent consumer as the broker drives it: ``threads`` threads take messages in
    order, and a RECONSUME_LATER answer puts the message back at the end of the queue, until
    every message is acked (60 s at most). Returns every answer, per message id."""
    queue: Deque[ClassicMessage] = collections.deque(msgs)
    answers: Dict[str, List[ConsumeStatus]] = collections.defaultdict(list)
    lock = threading.Lock()
    deadline = time.monotonic() + 60

    def worker() -> None:
        while time.monotonic() < deadline:
            with lock:
                if not queue:
                    return
                msg = queue.popleft()
            status = listener(msg)
            with lock:
                answers[msg.id].append(status)
                if status is ConsumeStatus.RECONSUME_LATER:
                    queue.append(msg)  # the broker's redelivery

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(70)
    assert not queue, f"{len(queue)} message(s) never acked"
    return dict(answers)
