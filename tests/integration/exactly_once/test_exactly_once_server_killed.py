"""The exactly-once mode on PostgreSQL when the server dies under load: a private server (never
the shared one) SIGKILLed and started again while 6 threads consume, on each kind of source;
every key is applied once, whatever transactions were in flight (issue 34)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Deque, Dict, Iterator, List

import pytest

from rocketmq_dedup import ConsumeStatus, DedupStatus
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    EffectListener,
    EffectTable,
    Postgres,
    dispose,
    make_config,
    unique,
)
from tests.support import PrivatePostgres, pg_connect

pytestmark = pytest.mark.postgres

KEYS = 240
THREADS = 6


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres("eo-killed").create()
    yield server
    server.destroy()


def client_of(kind: str, dsn: str) -> Any:
    """A source of ``kind`` on ``dsn`` whose connection attempts give up within 2 s."""
    if kind == "psycopg":
        return pg_connect(dsn, connect_timeout=2)
    if kind == "psycopg_pool":
        import psycopg_pool

        return psycopg_pool.ConnectionPool(
            dsn, min_size=1, max_size=THREADS * 2, timeout=5, kwargs={"connect_timeout": 2},
            open=True,
        )  # fmt: skip
    import sqlalchemy

    url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    return sqlalchemy.create_engine(url, pool_size=THREADS * 2, pool_pre_ping=True)


def consume_while_the_server_is_killed(
    listener: EffectListener, server: PrivatePostgres, keys: List[str]
) -> Dict[str, List[ConsumeStatus]]:
    """``THREADS`` threads consume ``keys``, a RECONSUME_LATER answer redelivering the message
    at the end of the queue; once a third of the keys are acked the server is SIGKILLed, and
    started again. Returns every answer per key."""
    queue: Deque[str] = collections.deque(keys)
    answers: Dict[str, List[ConsumeStatus]] = collections.defaultdict(list)
    lock = threading.Lock()
    acked = [0]
    deadline = time.monotonic() + 180

    def worker() -> None:
        while time.monotonic() < deadline:
            with lock:
                if not queue:
                    return
                key = queue.popleft()
                again = bool(answers[key])
            status = listener(ClassicMessage(key, reconsume_times=int(again)))
            with lock:
                answers[key].append(status)
                if status is ConsumeStatus.RECONSUME_LATER:
                    queue.append(key)
                else:
                    acked[0] += 1
            if status is ConsumeStatus.RECONSUME_LATER:
                time.sleep(0.05)  # the broker's retry backoff

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    while acked[0] < len(keys) // 3:
        assert time.monotonic() < deadline, "the consumers never got going"
        time.sleep(0.01)
    server.kill()
    server.start()
    for thread in threads:
        thread.join(200)
    assert not queue, f"{len(queue)} key(s) never acked"
    return dict(answers)


@pytest.mark.parametrize("kind", ["psycopg", "psycopg_pool", "sqlalchemy+psycopg"])
def test_the_server_killed_under_six_threads_applies_every_key_once(
    server: PrivatePostgres, kind: str
) -> None:
    """SIGKILL of the server (and its backends) while 6 threads run handlers that write an
    effect row and take a moment; the server restarted at once. Transactions in flight are
    lost with their sessions (rolled back) or committed with their answers lost: every
    message ends acked, and every key's effect is committed exactly once, with its CONSUMED
    record."""
    db = Postgres(server.dsn)
    table = unique("t_eo_killed")
    effects = EffectTable(db)
    client = client_of(kind, server.dsn)
    config = make_config(client, table, pool_size=THREADS * 2)
    config.persist.create_table()  # type: ignore[union-attr]

    def behaviour(msg: Any, conn: Any) -> bool:
        time.sleep(0.005)  # work, so that transactions are in flight when the server dies
        return True

    listener = EffectListener(config, effects, behaviour)
    keys = [f"k{i}" for i in range(KEYS)]
    try:
        answers = consume_while_the_server_is_killed(listener, server, keys)
        assert effects.counts() == dict.fromkeys(keys, 1)
        assert any(ConsumeStatus.RECONSUME_LATER in a for a in answers.values())
        store = config.persist
        assert store is not None
        statuses = store.read_many(
            [DedupElement(config.application_name, "TEST-TOPIC", "TagA", k) for k in keys]
        )
        assert all(r is not None and r.status is DedupStatus.CONSUMED for r in statuses)
    finally:
        listener.close()
        config.close()
        dispose(client)
        effects.drop()
        db.drop(table, f"{table}_seq")
