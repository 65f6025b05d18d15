"""MySQL specifics (case 10): server clock, purge, thread safety, reconnects, drivers."""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path
from typing import Any, List

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupConfigError,
    DedupElement,
    DedupStatus,
)
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.mysql import PURGE_SCAN_SQL, MySQLDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import claims, consume_in_threads, mysql_connect, wait_for

REPO = Path(__file__).resolve().parents[2]


class Ok(DedupConcurrentListener):
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.handled: List[Any] = []
        self.lock = threading.Lock()

    def do_handle_msg(self, msg: Any) -> bool:
        with self.lock:
            self.handled.append(msg.id)
        return True


def query(sql: str, *params: Any) -> Any:
    conn = mysql_connect()()
    try:
        cur = conn.cursor()
        cur.execute(sql, params)
        return cur.fetchall()
    finally:
        conn.close()


@pytest.fixture
def mysql_store(mysql_table: str) -> Any:
    store = MySQLDedupStore(mysql_connect(), mysql_table)
    yield store
    store.close()


def test_create_table_is_idempotent(mysql_store: MySQLDedupStore) -> None:
    """create_table() twice is fine; the table keeps its one index, the primary key."""
    mysql_store.create_table()
    mysql_store.create_table()
    keys = {row[2] for row in query(f"SHOW INDEX FROM {mysql_store.table_name}")}
    assert keys == {"PRIMARY"}


def test_lease_uses_the_database_clock(mysql_store: MySQLDedupStore, app_name: str) -> None:
    """expire_time is the server's now + lease (epoch ms), whatever the client clock says."""
    e = DedupElement(app_name, "T", "", "k")
    mysql_store.claim(Claim(e, "o"), 60_000)
    ((expire, server_now),) = query(
        f"SELECT expire_time, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) "
        f"FROM {mysql_store.table_name} WHERE dedup_key = %s",
        e.digest(),
    )
    assert 59_000 <= expire - server_now <= 60_000


def test_row_id_is_stable_across_versions() -> None:
    """The row id is SHA-256 of the length-prefixed UTF-8 fields, pinned: a change would hide
    every existing record after an upgrade."""
    assert DedupElement("app", "Topic", "", "k").digest().hex() == (
        "6dfecab172cabeb10efcde6bdbdae154e51a9a065049f58879940cecf9af6d86"
    )
    assert DedupElement("订单服务", "T", "A", "x" * 300).digest().hex() == (
        "b43494e58a69b01aac8bb090292653bb76bdd8e2685ab1f1419b85161351ce67"
    )


def test_readable_columns_for_operators(mysql_store: MySQLDedupStore, app_name: str) -> None:
    """The row shows application, topic, tag, key (first 255 chars), status and owner."""
    e = DedupElement(app_name, "TOPIC", "TagA", "k" * 300)
    mysql_store.claim(Claim(e, "owner-1"), 60_000)
    row = query(
        f"SELECT application_name, topic, tag, msg_uniq_key, status, owner_token, deliveries "
        f"FROM {mysql_store.table_name} WHERE dedup_key = %s",
        e.digest(),
    )[0]
    assert row == (app_name, "TOPIC", "TagA", "k" * 255, "CONSUMING", "owner-1", 1)


def app_rows(store: MySQLDedupStore, app_name: str) -> int:
    rows = query(f"SELECT COUNT(*) FROM {store.table_name} WHERE application_name = %s", app_name)
    return int(rows[0][0])


def test_purge_expired_deletes_in_batches(mysql_store: MySQLDedupStore, app_name: str) -> None:
    """purge_expired removes every expired row, batch by batch, and keeps live ones."""
    expired = [DedupElement(app_name, "T", "", f"old{i}") for i in range(10)]
    live = DedupElement(app_name, "T", "", "live")
    mysql_store.mark_consumed_many(claims(expired, ["o"] * 10), 1)
    mysql_store.mark_consumed(Claim(live, "o"), 600_000)
    wait_for(lambda: all(mysql_store.get_status(e) is None for e in expired))
    assert mysql_store.purge_expired(batch_size=3) >= 10
    assert app_rows(mysql_store, app_name) == 1


def test_purge_walks_past_batches_with_nothing_expired(
    mysql_store: MySQLDedupStore, app_name: str
) -> None:
    """A batch of live rows does not end the purge: it walks the whole table."""
    live = [DedupElement(app_name, "T", "", f"live{i}") for i in range(20)]
    expired = [DedupElement(app_name, "T", "", f"old{i}") for i in range(5)]
    mysql_store.mark_consumed_many(claims(live, ["o"] * 20), 600_000)
    mysql_store.mark_consumed_many(claims(expired, ["o"] * 5), 1)
    wait_for(lambda: all(mysql_store.get_status(e) is None for e in expired))
    assert mysql_store.purge_expired(batch_size=2) >= 5
    assert app_rows(mysql_store, app_name) == 20
    assert all(mysql_store.get_status(e) is DedupStatus.CONSUMED for e in live)


def test_purge_scans_by_primary_key(mysql_store: MySQLDedupStore) -> None:
    """Each purge step reads a primary-key range, never the whole table."""
    plan = query("EXPLAIN " + PURGE_SCAN_SQL.format(table=mysql_store.table_name), b"\0" * 32, 1000)
    assert plan[0][5] == "PRIMARY"  # the `key` column


@pytest.mark.parametrize("batch_size", [0, -1, 1.5])
def test_purge_rejects_a_bad_batch_size(mysql_store: MySQLDedupStore, batch_size: Any) -> None:
    """A batch size that is not a positive int is a DedupConfigError."""
    with pytest.raises(DedupConfigError, match="batch_size"):
        mysql_store.purge_expired(batch_size=batch_size)


def test_thread_pool_shares_one_store(mysql_store: MySQLDedupStore, app_name: str) -> None:
    """8 threads x 40 deliveries (each key delivered by every thread) -> each key once."""
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, mysql_store))
    barrier = threading.Barrier(8)
    errors: List[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(10)
            for i in range(40):
                assert listener(ClassicMessage(f"m{i}")) is not None
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(listener.handled) == sorted(f"m{i}" for i in range(40))


def test_concurrent_threads_share_round_trips(mysql_table: str, app_name: str) -> None:
    """8 threads x 100 fresh messages: the claims, marks and releases of concurrent threads
    share round trips (one statement per kind in each); every message handled once, every
    record CONSUMED once the deferred marks are sent (close)."""
    store = MySQLDedupStore(mysql_connect(), mysql_table)
    assert store.coalescer is not None
    batches: List[int] = []
    execute = store.coalescer._execute

    def counting(batch: List[Any]) -> None:
        batches.append(len(batch))
        execute(batch)

    store.coalescer._execute = counting
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    batches.clear()  # the start-up check's probe claim, mark and release
    answers = consume_in_threads(listener, 8, 100)
    assert answers == [ConsumeStatus.CONSUME_SUCCESS] * 800
    store.close()  # sends the CONSUMED marks still deferred
    assert sorted(listener.handled) == sorted(f"{t}-{i}" for t in range(8) for i in range(100))
    assert sum(batches) == 8 * 100 * 2  # one claim and one mark per message
    assert len(batches) < 8 * 100 * 2 * 0.6  # round trips were shared
    statuses = query(
        f"SELECT status, COUNT(*) FROM {mysql_table} WHERE application_name = %s GROUP BY 1",
        app_name,
    )
    assert [tuple(row) for row in statuses] == [("CONSUMED", 800)]


def test_a_copy_claimed_with_its_twins_deferred_mark_is_a_duplicate(
    mysql_table: str, app_name: str
) -> None:
    """A handled message's CONSUMED mark waits for the next round trip, and goes first in it:
    the row reads CONSUMING after the listener returned, and a copy claimed next is a
    duplicate of a CONSUMED record (acked, its handler not run)."""
    store = MySQLDedupStore(mysql_connect(), mysql_table, defer_marks_ms=500)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    status = f"SELECT status FROM {mysql_table} WHERE dedup_key = %s"
    digest = DedupElement(app_name, "TEST-TOPIC", "TagA", "m1").digest()
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert query(status, digest) == (("CONSUMING",),)
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert query(status, digest) == (("CONSUMED",),)
    assert listener.handled == ["m1"]
    store.close()


def test_a_copy_elsewhere_is_consumed_later_until_the_deferred_mark_lands(
    mysql_table: str, app_name: str
) -> None:
    """Until a deferred mark lands, another consumer's copy finds the live CONSUMING claim and
    is answered RECONSUME_LATER; once it lands (here: close), the copy is acked."""
    first = Ok(
        DedupConfig.enable_dedup_consume_config(
            app_name, MySQLDedupStore(mysql_connect(), mysql_table, defer_marks_ms=500)
        )
    )
    other_store = MySQLDedupStore(mysql_connect(), mysql_table)
    other = Ok(DedupConfig.enable_dedup_consume_config(app_name, other_store))
    assert first(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert other(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
    first.close()
    assert other(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert first.handled == ["m1"] and other.handled == []
    other_store.close()


def test_a_failed_record_after_a_deferred_mark_never_overwrites_the_success(
    mysql_table: str, app_name: str
) -> None:
    """mark_failed after a deferred CONSUMED mark of the same element sends the mark first: the
    row reads CONSUMED by its owner right after, never FAILED (a reader elsewhere would have
    answered a copy as failed)."""
    store = MySQLDedupStore(mysql_connect(), mysql_table, defer_marks_ms=500)
    element = DedupElement(app_name, "TEST-TOPIC", "TagA", "m1")
    store.claim(Claim(element, "o1"), 60_000)
    store.mark_consumed(Claim(element, "o1"), 60_000)
    row = f"SELECT status, owner_token FROM {mysql_table} WHERE dedup_key = %s"
    assert query(row, element.digest()) == (("CONSUMING", "o1"),)  # the mark waits
    store.mark_failed(Claim(element, "o2"), 60_000, "late")
    assert query(row, element.digest()) == (("CONSUMED", "o1"),)
    store.close()


def test_binary_keys_and_text_go_to_the_server_as_the_same_values(mysql_table: str) -> None:
    """mysqlclient runners send binary keys as hex literals and quote text once per value:
    the server reads back exactly the bytes and the text that were sent, quotes, backslashes,
    NUL bytes, percent signs and CJK included."""
    store = MySQLDedupStore(mysql_connect(), mysql_table)
    runner = store.pool.take()
    try:
        key = bytes(range(256))[:32] + b"'\\\"\x00%_"
        text = "k'\\%s\"\u8a02\u55ae"
        for _ in range(2):  # the second time from the runner's quoted-text cache
            rows = runner.run("SELECT %s, %s, HEX(%s)", (key, text, key), True)
            value, echoed, hexed = rows[0]
            assert bytes(value) == key
            assert (echoed.decode() if isinstance(echoed, bytes) else echoed) == text
            assert (hexed.decode() if isinstance(hexed, bytes) else hexed) == key.hex().upper()
    finally:
        store.pool.give(runner)
        store.close()


def test_reconnects_after_server_restart(mysql_table: str, app_name: str) -> None:
    """After MariaDB restarts, the next message reconnects and is deduped as before."""
    store = MySQLDedupStore(mysql_connect(), mysql_table)
    listener = Ok(
        DedupConfig.enable_dedup_consume_config(
            app_name, store, store_failure_policy="reconsume_later"
        )
    )
    assert listener(ClassicMessage("before")) is ConsumeStatus.CONSUME_SUCCESS
    subprocess.run([str(REPO / "scripts/services.sh"), "restart-mysql"], check=True)
    assert listener(ClassicMessage("after")) is ConsumeStatus.CONSUME_SUCCESS
    assert listener(ClassicMessage("before")) is ConsumeStatus.CONSUME_SUCCESS
    assert listener.handled == ["before", "after"]
    store.close()


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql", "mysql-connector"])
def test_a_renewal_in_the_claims_own_millisecond_finds_it_still_owned(
    mysql_table: str, app_name: str, driver: str
) -> None:
    """A renewal that lands in the same server millisecond as the claim (or as the previous
    renewal) sets the same expire_time: the UPDATE changes no row, and a rowcount of 0 read as
    "taken over" made the LeaseKeeper stop renewing a claim it still held (and count a lost
    lease). The server's clock is frozen for the store's one connection to make it certain."""
    store = MySQLDedupStore(mysql_connect(driver), mysql_table, pool_size=1)
    runner = store.pool.take()
    runner.run("SET timestamp = 1700000000.123", (), False)  # NOW(3) fixed for this session
    store.pool.give(runner)
    mine = Claim(DedupElement(app_name, "T", "", "k"), "o1")
    assert store.claim(mine, 10_000).claimed
    assert store.renew_many([mine], 10_000) == [True]
    assert store.renew_many([mine], 10_000) == [True]
    assert store.renew_many([Claim(mine.element, "other")], 10_000) == [False]
    record = store.read(mine.element)
    assert record is not None and record.owner == "o1"
    assert record.status is DedupStatus.CONSUMING
    store.close()


@pytest.mark.parametrize(
    ("driver", "runner"),
    [("mysqlclient", "MySQLdbRunner"), ("pymysql", "Runner"), ("mysql-connector", "Runner")],
)
def test_statements_run_through_the_drivers_fastest_api(
    mysql_table: str, app_name: str, driver: str, runner: str
) -> None:
    """mysqlclient connections skip the DB-API cursor; other drivers go through cursors."""
    store = MySQLDedupStore(mysql_connect(driver), mysql_table)
    element = DedupElement(app_name, "T", "tag", "k'\\%s")
    assert store.claim(Claim(element, "o1"), 5_000).claimed
    taken = store.pool.take()
    assert type(taken).__name__ == runner
    store.pool.give(taken)
    assert store.get_status(element) is DedupStatus.CONSUMING
    assert store.release(Claim(element, "o1"))
    store.close()


def test_pymysql_driver_works(mysql_table: str, app_name: str) -> None:
    """PyMySQL connection factories work like mysqlclient ones."""
    store = MySQLDedupStore(mysql_connect("pymysql"), mysql_table)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert listener.handled == ["m1"]
    store.close()


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql", "mysql-connector"])
def test_a_claim_that_times_out_on_a_row_lock_is_not_an_outage(
    driver: str, mysql_table: str, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A message CONSUMED; another session holds its record's row lock (an operator's
    ``SELECT ... FOR UPDATE``, a long purge); a duplicate's claim waits for it and times out
    (1205). That is a lock conflict, not an outage: RECONSUME_LATER, the handler not run, under
    the default policy (before: an outage, and the duplicate ran WITHOUT dedup)."""
    connect = mysql_connect(driver, init_command="SET SESSION innodb_lock_wait_timeout = 1")
    config = DedupConfig.enable_dedup_consume_config(app_name, connect, table_name=mysql_table)
    listener = Ok(config)
    holder = mysql_connect()()
    try:
        assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
        assert config.persist is not None
        digest = DedupElement(app_name, "TEST-TOPIC", "TagA", "m1").digest()
        holder.autocommit(False)
        holder.cursor().execute(
            f"SELECT status FROM {mysql_table} WHERE dedup_key = %s FOR UPDATE", (digest,)
        )
        with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
        assert listener.handled == ["m1"]
        messages = [r.getMessage() for r in caplog.records]
        assert any("waiting for a lock" in m for m in messages), messages
        assert not any("WITHOUT dedup" in m for m in messages), messages
    finally:
        holder.rollback()
        holder.close()
        listener.close()
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS  # a duplicate again
    assert listener.handled == ["m1"]
