"""Helpers for the exactly-once tests (no tests here): drivers (MySQL's DB-API drivers, psycopg
and psycopg_pool, SQLAlchemy over each), the database each one reaches (:class:`Database`:
statements, sessions and locks as a test asks about them), tables, a business listener whose
effects are rows of its own table."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from rocketmq_dedup import ConsumeStatus, DedupConfig, TransactionalDedupListener
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.postgres import PostgresDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import MYSQL, PG_DSN, mysql_connect, pg_connect

MYSQL_DRIVERS = [
    "mysqlclient",
    "pymysql",
    "mysql-connector",
    "sqlalchemy+mysqlclient",
    "sqlalchemy+pymysql",
]
#: psycopg 3: a factory (the store's own pools), an application's psycopg_pool pool, an engine.
PG_DRIVERS = ["psycopg", "psycopg_pool", "sqlalchemy+psycopg"]
#: Every driver the exactly-once mode supports.
DRIVERS = [*MYSQL_DRIVERS, *PG_DRIVERS]
_SA_DIALECTS = {"sqlalchemy+mysqlclient": "mysqldb", "sqlalchemy+pymysql": "pymysql"}
SQL_STORES = (MySQLDedupStore, PostgresDedupStore)


def is_postgres(driver: str) -> bool:
    return driver in PG_DRIVERS


def make_client(driver: str, **options: Any) -> Any:
    """A connection factory, a psycopg_pool pool or a SQLAlchemy Engine, for ``driver``
    (``options``: the engine's, the pool's, or the factory's connection options)."""
    if driver == "psycopg":
        return pg_connect(PG_DSN, **options)
    if driver == "psycopg_pool":
        import psycopg_pool

        sizes = {"min_size": 1, "max_size": 24, "timeout": 10, **options}
        return psycopg_pool.ConnectionPool(PG_DSN, open=True, **sizes)
    if driver == "sqlalchemy+psycopg":
        import sqlalchemy

        url = PG_DSN.replace("postgresql://", "postgresql+psycopg://", 1)
        return sqlalchemy.create_engine(url, **{"pool_size": 24, "max_overflow": 8, **options})
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
        return sqlalchemy.create_engine(url, **{"pool_size": 24, "max_overflow": 8, **options})
    return mysql_connect(driver, **options)


def one_connection(driver: str) -> Any:
    """A client whose transactions all share one connection (with ``pool_size=1`` for a
    factory's)."""
    if driver.startswith("sqlalchemy"):
        return make_client(driver, pool_size=1, max_overflow=0)
    if driver == "psycopg_pool":
        return make_client(driver, min_size=1, max_size=1)
    return make_client(driver)


def dispose(client: Any) -> None:
    """Close what a test's client opened (an engine's pool, a psycopg_pool pool)."""
    if hasattr(client, "dispose"):
        client.dispose()
    elif hasattr(client, "getconn"):
        client.close()


def execute(conn: Any, statement: str, params: Tuple[Any, ...] = ()) -> Any:
    """Run a statement on a handler's ``conn``: a DB-API or psycopg connection, or a
    SQLAlchemy one."""
    if hasattr(conn, "exec_driver_sql"):
        return conn.exec_driver_sql(statement, params)
    cur = conn.cursor()
    cur.execute(statement, params)
    return cur


def raw_connection(conn: Any) -> Any:
    """The driver's connection behind a handler's ``conn`` (what a handler can reach)."""
    if hasattr(conn, "exec_driver_sql"):
        return conn.connection.dbapi_connection
    return object.__getattribute__(conn, "_conn")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class Database:
    """The server a driver reaches, as the tests ask about it."""

    name: str
    #: The business table of :class:`EffectTable` (``{name}``).
    effect_table_sql: str
    #: A table of one counter row (``{name}``).
    counter_table_sql: str
    #: The session id of the connection that runs it.
    session_sql: str

    def sql(self, statement: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
        """Run one statement on a fresh autocommit connection; its rows."""
        raise NotImplementedError

    def kill(self, session: int) -> None:
        """End ``session`` from another connection (an operator's KILL)."""
        raise NotImplementedError

    def alive(self, session: int) -> bool:
        raise NotImplementedError

    def waiting_on(self, table: str) -> bool:
        """Whether another session waits for a lock in a statement naming ``table``."""
        raise NotImplementedError

    def session_of(self, conn: Any) -> int:
        """The session of a handler's ``conn``."""
        return int(execute(conn, self.session_sql).fetchall()[0][0])

    def kill_own_session(self, conn: Any) -> None:
        """End the handler's session from another connection (as the server's idle timeout
        or an operator's KILL would), and wait until it is gone."""
        session = self.session_of(conn)
        self.kill(session)
        deadline = time.monotonic() + 10
        while self.alive(session):
            assert time.monotonic() < deadline, "the killed session did not end"
            time.sleep(0.02)

    def drop(self, *tables: str) -> None:
        for table in tables:
            self.sql(f"DROP TABLE IF EXISTS {table}")


class MySQL(Database):
    name = "mysql"
    effect_table_sql = (
        "CREATE TABLE {name} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
        "k VARCHAR(191) NOT NULL, v VARCHAR(64) NULL, KEY (k)) ENGINE=InnoDB"
    )
    counter_table_sql = "CREATE TABLE {name} (k VARCHAR(64) PRIMARY KEY, v BIGINT NOT NULL)"
    session_sql = "SELECT CONNECTION_ID()"

    def sql(self, statement: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
        conn = mysql_connect()()
        conn.autocommit(True)
        try:
            cur = conn.cursor()
            cur.execute(statement, params)
            return list(cur.fetchall())
        finally:
            conn.close()

    def kill(self, session: int) -> None:
        self.sql(f"KILL {session}")

    def alive(self, session: int) -> bool:
        query = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
        return bool(self.sql(query, (session,))[0][0])

    def waiting_on(self, table: str) -> bool:
        rows = self.sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s AND ID <> "
            "CONNECTION_ID()",
            (f"%{table}%",),
        )
        return bool(rows[0][0])


class Postgres(Database):
    """The shared PostgreSQL, or the server at ``dsn`` (a private one)."""

    name = "postgres"
    effect_table_sql = (
        "CREATE TABLE {name} (id bigserial PRIMARY KEY, k varchar(191) NOT NULL, "
        "v varchar(64) NULL); CREATE INDEX ON {name} (k)"
    )
    counter_table_sql = "CREATE TABLE {name} (k varchar(64) PRIMARY KEY, v bigint NOT NULL)"
    session_sql = "SELECT pg_backend_pid()"

    def __init__(self, dsn: str = PG_DSN) -> None:
        self.dsn = dsn

    def sql(self, statement: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return list(cursor.fetchall()) if cursor.description else []

    def kill(self, session: int) -> None:
        self.sql("SELECT pg_terminate_backend(%s)", (session,))

    def alive(self, session: int) -> bool:
        return bool(
            self.sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (session,))[0][0]
        )

    def waiting_on(self, table: str) -> bool:
        rows = self.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s AND pid <> pg_backend_pid()",
            (f"%{table}%",),
        )
        return bool(rows[0][0])


MYSQL_DB, POSTGRES_DB = MySQL(), Postgres()


def database(driver: str) -> Database:
    return POSTGRES_DB if is_postgres(driver) else MYSQL_DB


def sql(statement: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Run one statement on the MariaDB (a fresh autocommit connection); its rows."""
    return MYSQL_DB.sql(statement, params)


class EffectTable:
    """A business table: one row per applied effect (no unique key, so a double application
    would show as two rows)."""

    def __init__(self, db: Database = MYSQL_DB) -> None:
        self.db = db
        self.name = unique("t_eo_effect")
        for statement in db.effect_table_sql.format(name=self.name).split("; "):
            db.sql(statement)

    def insert(self, conn: Any, key: str, value: str = "") -> None:
        execute(conn, f"INSERT INTO {self.name} (k, v) VALUES (%s, %s)", (key, value))

    def counts(self) -> Dict[str, int]:
        rows = self.db.sql(f"SELECT k, COUNT(*) FROM {self.name} GROUP BY k")
        return {str(k): int(n) for k, n in rows}

    def count(self, key: str) -> int:
        return self.counts().get(key, 0)

    def drop(self) -> None:
        self.db.drop(self.name)


def make_config(
    client: Any, table: str, application: Optional[str] = None, **options: Any
) -> DedupConfig:
    """A config on ``table`` of a new application (or ``application``: another consumer of
    the same one, with its own store, as another process has). ``pool_size`` (24 by default)
    sizes a factory's pools; a psycopg_pool pool has its own size."""
    if hasattr(client, "getconn"):
        options.pop("pool_size", None)
    else:
        options.setdefault("pool_size", 24)
    config = DedupConfig.enable_dedup_consume_config(
        application or unique("eo-app"), client, table_name=table, **options
    )
    assert isinstance(config.persist, SQL_STORES)
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
