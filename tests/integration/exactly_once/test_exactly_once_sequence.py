"""The sequence guard of the exactly-once mode (issue 11, requirement 6), on every driver of
MySQL and PostgreSQL; the mode under PostgreSQL's REPEATABLE READ; and the order sample driven
with fake messages."""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupConfigError, DedupStatus, Outcome
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import Decision, DedupMetrics
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    SQL_STORES,
    EffectTable,
    SequencedListener,
    dispose,
    execute,
    make_client,
    make_config,
    redeliver_until_acked,
    sql,
    unique,
)
from tests.support import mysql_connect

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


def step(entity: str, seq: int, msg_id: str = "") -> ClassicMessage:
    """A message of ``entity``'s step ``seq`` (body ``entity:seq``); its own id by default."""
    return ClassicMessage(msg_id or f"{entity}:{seq}", body=f"{entity}:{seq}".encode())


def parse(msg: Any) -> Tuple[str, int]:
    entity, seq = msg.body.decode().rsplit(":", 1)
    return entity, int(seq)


class StepListener(SequencedListener):
    """Records each applied step as an effect row ``entity:seq`` (in commit order: ids)."""

    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        entity, seq = parse(msg)
        with self.lock:
            self.calls[f"{entity}:{seq}"] = self.calls.get(f"{entity}:{seq}", 0) + 1
        self.effects.insert(conn, entity, str(seq))
        return True


def applied(effects: EffectTable) -> Dict[str, List[int]]:
    """Per entity, the steps applied, in the order they were committed."""
    rows = effects.db.sql(f"SELECT k, v FROM {effects.name} ORDER BY id")
    result: Dict[str, List[int]] = collections.defaultdict(list)
    for entity, seq in rows:
        result[str(entity)].append(int(seq))
    return dict(result)


def test_strict_applies_out_of_order_steps_once_and_in_order(
    client: Any, table: str, effects: EffectTable
) -> None:
    """Steps 1-3 of 5 entities sent 3, 1, 2 with duplicates and resends (new ids): every
    message ends acked, each entity's steps applied once each, in order."""
    config = make_config(client, table, sequence_mode="strict")
    config.persist.create_table()  # type: ignore[union-attr]
    listener = StepListener(config, effects, parse)
    msgs = []
    for n in range(5):
        entity = f"order-{n}"
        msgs += [step(entity, 3), step(entity, 1), step(entity, 2)]
        msgs += [step(entity, 3), step(entity, 1)]  # duplicates (same id)
        msgs += [step(entity, 1, f"resend-{entity}:1"), step(entity, 2, f"resend-{entity}:2")]
    try:
        answers = redeliver_until_acked(listener, msgs)
    finally:
        listener.close()
    assert applied(effects) == {f"order-{n}": [1, 2, 3] for n in range(5)}
    assert set(listener.calls.values()) == {1}
    # the gaps were answered RECONSUME_LATER, then filled
    assert any(LATER in a for a in answers.values())


def test_strict_gap_waits_and_stale_is_acked_as_a_duplicate(
    client: Any, table: str, effects: EffectTable
) -> None:
    """seq 2 first: RECONSUME_LATER without the handler, claim released; 1 then 2 run; a
    resend of 1 (new id) is acked without the handler and recorded CONSUMED."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    listener = StepListener(config, effects, parse)
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "again")
    store = config.persist
    assert isinstance(store, SQL_STORES)
    assert listener(step("o", 2)) is LATER
    assert listener.calls == {}
    assert store.get_status(element._replace(key="o:2")) is None  # released
    assert [listener(step("o", 1)), listener(step("o", 2))] == [SUCCESS, SUCCESS]
    assert listener(step("o", 1, "again")) is SUCCESS
    assert store.get_status(element) is DedupStatus.CONSUMED
    assert listener(step("o", 1, "again")) is SUCCESS  # now a plain duplicate
    assert listener.calls == {"o:1": 1, "o:2": 1}
    assert applied(effects) == {"o": [1, 2]}


def test_latest_applies_only_newer_steps(client: Any, table: str, effects: EffectTable) -> None:
    """latest: 3, 1, 2, a resend of 3, then 4: only 3 and 4 run; everything is acked."""
    config = make_config(client, table, sequence_mode="latest")
    config.persist.create_table()  # type: ignore[union-attr]
    listener = StepListener(config, effects, parse)
    msgs = [step("s", 3), step("s", 1), step("s", 2), step("s", 3, "resend"), step("s", 4)]
    assert [listener(m) for m in msgs] == [SUCCESS] * 5
    assert applied(effects) == {"s": [3, 4]}
    assert listener.calls == {"s:3": 1, "s:4": 1}


def test_sequence_start_sets_what_a_new_entity_expects(
    client: Any, table: str, effects: EffectTable
) -> None:
    """sequence_start=0: seq 1 of a new entity waits for 0."""
    config = make_config(client, table, sequence_start=0)
    config.persist.create_table()  # type: ignore[union-attr]
    listener = StepListener(config, effects, parse)
    assert listener(step("z", 1)) is LATER
    assert [listener(step("z", 0)), listener(step("z", 1))] == [SUCCESS, SUCCESS]
    assert applied(effects) == {"z": [0, 1]}


def test_orderly_delivery_with_duplicates_applies_each_step_once(
    client: Any, table: str, effects: EffectTable
) -> None:
    """The orderly consumer's shape: one thread, in order, a RECONSUME_LATER retried in place
    (and a whole ordered batch through consume_message)."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    listener = StepListener(config, effects, parse)
    for msg in [step("a", 1), step("a", 1), step("a", 2), step("a", 3), step("a", 3)]:
        for _ in range(20):
            if listener(msg) is SUCCESS:
                break
        else:
            raise AssertionError(f"{msg.id} never acked")
    result = listener.consume_message([step("b", 1), step("b", 2), step("b", 3)])
    assert (result.status, result.ack_index) == (SUCCESS, 2)
    assert applied(effects) == {"a": [1, 2, 3], "b": [1, 2, 3]}
    assert set(listener.calls.values()) == {1}


def test_a_failed_handler_leaves_the_sequence_unchanged(
    client: Any, table: str, effects: EffectTable
) -> None:
    """A rollback also rolls back the sequence: the same step runs again on the retry."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    failing = [True]

    class FlakyListener(StepListener):
        """Writes its step, then asks for a rollback while ``failing``."""

        def do_handle_msg(self, msg: Any, conn: Any) -> Any:
            super().do_handle_msg(msg, conn)
            return not failing[0]

    listener = FlakyListener(config, effects, parse)
    assert listener(step("f", 1)) is LATER
    failing[0] = False
    assert listener(step("f", 1)) is SUCCESS
    assert applied(effects) == {"f": [1]}


class Outcomes(DedupMetrics):
    """Records each decision's outcome, per message id."""

    def __init__(self) -> None:
        self.seen: Dict[str, List[Outcome]] = collections.defaultdict(list)

    def message(self, decision: Decision) -> None:
        self.seen[decision.message.id].append(decision.outcome)


def repeatable_read_client(driver: str) -> Any:
    """A PostgreSQL client whose transactions are REPEATABLE READ: the server's default for its
    sessions (a factory), the psycopg connection's isolation level (an engine's option)."""
    if driver == "sqlalchemy+psycopg":
        return make_client(driver, isolation_level="REPEATABLE READ")
    return make_client(driver, options="-c default_transaction_isolation=repeatable\\ read")


@pytest.mark.parametrize("driver", ["psycopg", "sqlalchemy+psycopg"])
def test_under_repeatable_read_a_step_that_waited_is_a_lock_conflict_then_applies(
    driver: str, table: str, effects: EffectTable
) -> None:
    """PostgreSQL under REPEATABLE READ (the mode assumes READ COMMITTED, the default): step 2
    of an entity waits for step 1's row and, once step 1 commits, fails with a serialization
    error before its handler runs: RECONSUME_LATER, outcome lock_conflict. Its redelivery
    applies it; each step applied once, in order."""
    metrics = Outcomes()
    client = repeatable_read_client(driver)
    config = make_config(client, table, metrics=metrics)
    config.persist.create_table()  # type: ignore[union-attr]
    holding, release = threading.Event(), threading.Event()

    class Holding(StepListener):
        def do_handle_msg(self, msg: Any, conn: Any) -> Any:
            level = execute(conn, "SHOW transaction_isolation").fetchall()[0][0]
            assert level == "repeatable read"
            if parse(msg)[1] == 1:
                holding.set()
                assert release.wait(20)
            return super().do_handle_msg(msg, conn)

    listener = Holding(config, effects, parse)
    first = threading.Thread(target=listener, args=(step("rr", 1),))
    first.start()
    try:
        assert holding.wait(20)
        second: List[ConsumeStatus] = []
        waiter = threading.Thread(target=lambda: second.append(listener(step("rr", 2))))
        waiter.start()
        deadline = time.monotonic() + 20
        while not effects.db.waiting_on(f"{table}_seq"):
            assert time.monotonic() < deadline, "step 2 never waited for step 1"
            time.sleep(0.01)
        release.set()
        first.join(20)
        waiter.join(20)
        assert second == [LATER]
        assert metrics.seen["rr:2"] == [Outcome.LOCK_CONFLICT]
        assert listener(step("rr", 2)) is SUCCESS
    finally:
        release.set()
        first.join(20)
        listener.close()
        dispose(client)
    assert applied(effects) == {"rr": [1, 2]}
    assert listener.calls == {"rr:1": 1, "rr:2": 1}


def test_sequence_settings_are_validated() -> None:
    """sequence_mode is strict or latest; sequence_start an int (not a bool) in 64 bits."""
    config = DedupConfig.disable_dedup_consume_config("app")
    assert (config.sequence_mode, config.sequence_start) == ("strict", 1)
    config.sequence_mode = "latest"
    for name, value in [
        ("sequence_mode", "newest"),
        ("sequence_mode", None),
        ("sequence_start", True),
        ("sequence_start", 1.0),
        ("sequence_start", 2**63),
    ]:
        with pytest.raises(DedupConfigError, match=name):
            setattr(config, name, value)


# -- the sample -----------------------------------------------------------------------------------


@pytest.mark.mysql
@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql"])
def test_the_order_sample_ships_every_order_once(driver: str, table: str) -> None:
    """samples/orders_exactly_once.py's listener, fed create/pay/ship sent 3, 1, 2 with
    duplicates and resends: every order ends shipped, each step applied once."""
    from samples.orders_exactly_once import OrderListener, order_message_body

    orders_table = unique("t_order")
    connect = mysql_connect(driver)
    listener = OrderListener(make_config(connect, table), orders_table=orders_table)
    listener.create_tables(connect)
    orders = [f"o-{n}" for n in range(4)]
    try:
        msgs = []
        for order in orders:
            bodies = [order_message_body(order, s) for s in (3, 1, 2)]
            for copy in ("", "-dup", "-resend"):  # a resend has its own message id
                msgs += [ClassicMessage(f"{order}-{i}{copy}", body=b) for i, b in enumerate(bodies)]
        redeliver_until_acked(listener, msgs)
        assert listener.order_rows(connect, orders) == {o: ("shipped", 1, 1, 1) for o in orders}
        assert json.loads(order_message_body("x", 2)) == {"order_id": "x", "step": 2}
    finally:
        listener.close()
        sql(f"DROP TABLE IF EXISTS {orders_table}")
