"""@exactly_once over an async def on a fake asyncio transaction port (tests/unit/
fake_transactions.py): the sync form's decisions, awaited, without a database (the real ports:
tests/integration/test_aio_exactly_once.py)."""

from __future__ import annotations

import asyncio
from typing import Any, List, Tuple

import pytest

from rocketmq_dedup import (
    DedupConfig,
    DedupStatus,
    DuplicateConsumedError,
    DuplicateInProgressError,
    StoreUnavailableError,
    TransactionMisuseError,
    exactly_once,
)
from rocketmq_dedup.message import DedupElement
from tests.unit.fake_transactions import AsyncFakeTransactionalStore, FakeTransactions


def fake_config(**options: Any) -> Tuple[DedupConfig, AsyncFakeTransactionalStore]:
    store = AsyncFakeTransactionalStore()
    return DedupConfig.enable_dedup_consume_config("app", store, **options), store


def database(store: AsyncFakeTransactionalStore) -> FakeTransactions:
    return store.fake.transactions


def test_an_async_function_commits_its_writes_with_its_record_once() -> None:
    """The first call commits its write and its CONSUMED record and returns its value; a
    second call does not run and raises DuplicateConsumedError; every transaction is closed."""
    config, store = fake_config()
    runs: List[str] = []

    @exactly_once(config, key=lambda order: order, topic="pay")
    async def pay(conn: Any, order: str) -> str:
        runs.append(order)
        conn.write(order)
        await asyncio.sleep(0)
        return f"paid {order}"

    async def work() -> None:
        assert await pay("o1") == "paid o1"
        with pytest.raises(DuplicateConsumedError):
            await pay("o1")

    asyncio.run(work())
    assert runs == ["o1"] and database(store).committed == ["o1"]
    element = DedupElement("app", "pay", "", "o1")
    assert store.memory.get_status(element) is DedupStatus.CONSUMED
    assert database(store).open == 0


def test_an_async_function_that_raises_commits_nothing_and_runs_again() -> None:
    """It writes, then raises: nothing is committed, the exception propagates, and the next
    call runs and commits."""
    config, store = fake_config()
    attempts: List[int] = []

    @exactly_once(config, key=lambda order: order)
    async def pay(conn: Any, order: str) -> None:
        attempts.append(1)
        conn.write(len(attempts))
        if len(attempts) == 1:
            raise ValueError("declined")

    async def work() -> None:
        with pytest.raises(ValueError, match="declined"):
            await pay("o1")
        assert database(store).committed == []
        await pay("o1")

    asyncio.run(work())
    assert database(store).committed == [2] and database(store).open == 0


def test_an_async_function_that_breaks_its_transaction_is_rolled_back() -> None:
    """A function whose connection reports misuse (it committed by itself): nothing of it is
    committed and the caller gets TransactionMisuseError."""
    config, store = fake_config()

    @exactly_once(config, key=lambda order: order)
    async def pay(conn: Any, order: str) -> None:
        conn.write(order)
        conn.misuse = "called commit() on its connection"

    with pytest.raises(TransactionMisuseError):
        asyncio.run(pay("o1"))
    assert database(store).committed == [] and database(store).open == 0


def test_an_async_store_failure_at_the_commit_raises_whatever_the_policy() -> None:
    """The record's COMMIT fails (the database went away): the caller gets the store's error
    even with store_failure_policy="consume", and nothing is committed."""
    config, store = fake_config(store_failure_policy="consume")
    database(store).fail["commit_record"] = StoreUnavailableError("database down")

    @exactly_once(config, key=lambda order: order)
    async def pay(conn: Any, order: str) -> None:
        conn.write(order)

    with pytest.raises(StoreUnavailableError, match="database down"):
        asyncio.run(pay("o1"))
    assert database(store).committed == [] and database(store).open == 0


def test_an_async_key_locked_elsewhere_is_in_progress_without_running() -> None:
    """exactly_once_claim="before_handler": another transaction holds the key's lock -> the
    function does not run; DuplicateInProgressError once the wait ends."""
    config, store = fake_config(exactly_once_claim="before_handler")
    database(store).hold_key(DedupElement("app", "pay", "", "o1"))

    @exactly_once(config, key=lambda order: order, topic="pay", in_progress_wait_milli_seconds=30)
    async def pay(conn: Any, order: str) -> None:
        pytest.fail("ran while the key was locked elsewhere")

    with pytest.raises(DuplicateInProgressError):
        asyncio.run(pay("o1"))
    assert database(store).steps.count("claim_key") >= 2  # asked again during the wait


def test_an_async_call_without_a_key_commits_its_writes_without_a_record() -> None:
    """A key of None: the function runs and its writes commit, with no record (every call
    runs)."""
    config, store = fake_config()

    @exactly_once(config, key=lambda order: None)
    async def pay(conn: Any, order: str) -> None:
        conn.write(order)

    async def work() -> None:
        await pay("o1")
        await pay("o1")

    asyncio.run(work())
    assert database(store).committed == ["o1", "o1"] and len(store.memory) == 0


def test_async_twins_in_one_process_commit_once() -> None:
    """Eight tasks with one key: one commits, the others are its duplicates (waited for in
    this process, or found committed); the write exists once."""
    config, store = fake_config(in_progress_wait_milli_seconds=1000)

    @exactly_once(config, key=lambda order: order)
    async def pay(conn: Any, order: str) -> None:
        conn.write(order)
        await asyncio.sleep(0.02)

    async def work() -> List[Any]:
        return list(await asyncio.gather(*(pay("hot") for _ in range(8)), return_exceptions=True))

    answers = asyncio.run(work())
    assert answers.count(None) == 1
    assert all(isinstance(a, DuplicateConsumedError) for a in answers if a is not None)
    assert database(store).committed == ["hot"] and database(store).open == 0


def test_a_def_on_an_asyncio_config_and_an_async_def_on_a_sync_one_are_refused() -> None:
    """Each form needs its own transactions: a def on a config of an asyncio store (it would
    run on threads) and an async def on a config of a sync store (it would block the loop)
    raise DedupConfigError when decorated, naming the form that fits."""
    from rocketmq_dedup import DedupConfigError
    from tests.unit.fake_transactions import FakeTransactionalStore

    async_config, _ = fake_config()

    def pay(conn: Any, order: str) -> None:
        pytest.fail("decorated")

    with pytest.raises(DedupConfigError, match=r"asyncio store.*an async def"):
        exactly_once(async_config, key=lambda order: order)(pay)

    async def pay_async(conn: Any, order: str) -> None:
        pytest.fail("decorated")

    sync_config = DedupConfig.enable_dedup_consume_config("app", FakeTransactionalStore())
    with pytest.raises(DedupConfigError, match=r"sync store.*would block the event loop"):
        exactly_once(sync_config, key=lambda order: order)(pay_async)
