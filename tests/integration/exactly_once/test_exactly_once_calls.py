"""@exactly_once on MariaDB, every driver of the exactly-once mode: a function's writes through
its conn commit with its record, once per key, whatever the copies and failures."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest

from rocketmq_dedup import (
    DedupConfig,
    DedupStatus,
    DuplicateConsumedError,
    DuplicateInProgressError,
    TransactionMisuseError,
    exactly_once,
)
from rocketmq_dedup.message import DedupElement
from tests.integration.exactly_once.support import EffectTable


def test_a_functions_writes_commit_once_with_its_record(
    config: DedupConfig, effects: EffectTable
) -> None:
    """The first call commits its row and its record and returns the function's value; the
    next calls raise DuplicateConsumedError and write nothing."""

    @exactly_once(config, key=lambda order: order, topic="payments")
    def pay(conn: Any, order: str) -> str:
        effects.insert(conn, order, "paid")
        return f"paid {order}"

    assert pay("o1") == "paid o1"
    for _ in range(2):
        with pytest.raises(DuplicateConsumedError):
            pay("o1")
    assert effects.count("o1") == 1
    assert config.persist is not None
    element = DedupElement(config.application_name, "payments", "", "o1")
    assert config.persist.get_status(element) is DedupStatus.CONSUMED


def test_a_function_that_raises_rolls_back_and_runs_again(
    config: DedupConfig, effects: EffectTable
) -> None:
    """The function writes, then raises: its write is rolled back, no record, the exception
    propagates; the next call commits once."""
    attempts: List[int] = []

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> None:
        attempts.append(1)
        effects.insert(conn, order)
        if len(attempts) == 1:
            raise ValueError("card declined")

    with pytest.raises(ValueError, match="card declined"):
        pay("o2")
    assert effects.count("o2") == 0
    pay("o2")
    assert effects.count("o2") == 1


def test_a_function_that_commits_by_itself_is_refused_and_rolled_back(
    config: DedupConfig, effects: EffectTable
) -> None:
    """conn.commit() in the function is refused (TransactionMisuseError raised into it); the
    transaction rolls back and the caller gets the refusal."""

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> None:
        effects.insert(conn, order)
        conn.commit()

    with pytest.raises(TransactionMisuseError):
        pay("o3")
    assert effects.count("o3") == 0


def test_concurrent_calls_with_one_key_commit_once(
    config: DedupConfig, effects: EffectTable
) -> None:
    """8 threads call with one key at once: one commits; every other call is a duplicate
    (committed, or in progress in this process), and the row exists once."""
    barrier = threading.Barrier(8)
    answers: List[str] = []
    lock = threading.Lock()

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> None:
        effects.insert(conn, order)

    def attempt() -> None:
        barrier.wait(10)
        try:
            pay("hot")
            answer = "committed"
        except DuplicateConsumedError:
            answer = "duplicate"
        except DuplicateInProgressError:
            answer = "in progress"
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers.count("committed") == 1 and len(answers) == 8
    assert effects.count("hot") == 1


def test_copies_in_two_processes_commit_once(
    client: Any, table: str, config: DedupConfig, effects: EffectTable
) -> None:
    """Two configs of one application (two processes' stores), a copy in each: the second
    runs while the first is still in its function (nothing locks it out: "at_commit") and
    commits first; the first's COMMIT then finds the record, its write is rolled back and it
    raises DuplicateConsumedError. The row exists once."""
    from tests.integration.exactly_once.support import make_config

    other = make_config(client, table, application=config.application_name)
    inside, finish = threading.Event(), threading.Event()
    first_answer: List[BaseException] = []

    def first_pay(conn: Any, order: str) -> None:
        effects.insert(conn, order, "first")
        inside.set()
        assert finish.wait(20)

    def second_pay(conn: Any, order: str) -> str:
        effects.insert(conn, order, "second")
        return "second committed"

    first = exactly_once(config, key=lambda order: order, topic="pay")(first_pay)
    second = exactly_once(other, key=lambda order: order, topic="pay")(second_pay)

    def run_first() -> None:
        try:
            first("o4")
        except DuplicateConsumedError as exc:
            first_answer.append(exc)

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert inside.wait(20)
        assert second("o4") == "second committed"
    finally:
        finish.set()
        thread.join(30)
        other.close()
    assert len(first_answer) == 1
    assert effects.count("o4") == 1
