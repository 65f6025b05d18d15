"""Deduplicated calls (rocketmq_dedup.once: ``config.once`` and ``@deduplicated``) on every
store: the listener's decision table for a block and a function."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest

from rocketmq_dedup import (
    DedupConcurrentListener,
    DedupConfig,
    DedupElement,
    DedupKeyError,
    DedupStatus,
    DedupUsageError,
    DuplicateConsumedError,
    DuplicateError,
    DuplicateInProgressError,
    PayloadMismatchError,
    deduplicated,
)
from rocketmq_dedup.once import DEFAULT_ONCE_TOPIC
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.testing import ClassicMessage


def config_for(store: DedupStore, app: str, **options: Any) -> DedupConfig:
    return DedupConfig.enable_dedup_consume_config(app, store, **options)


def once_element(app: str, key: str, topic: str = DEFAULT_ONCE_TOPIC) -> DedupElement:
    return DedupElement(app, topic, "", key)


# -- the block ---------------------------------------------------------------------------------


def test_a_block_runs_for_a_fresh_key_and_is_skipped_for_its_duplicates(
    store: DedupStore, app_name: str
) -> None:
    """``with config.once(key) as run``: truthy for a fresh key, then the key is CONSUMED and
    every later block is falsy with status CONSUMED."""
    config = config_for(store, app_name)
    done: List[str] = []
    with config.once("order-1") as run:
        assert run and run.fresh and run.status is None and run.dedup
        done.append("charged")
    assert store.get_status(once_element(app_name, "order-1")) is DedupStatus.CONSUMED
    for _ in range(2):
        with config.once("order-1") as run:
            if run:
                done.append("charged again")
        assert not run and run.status is DedupStatus.CONSUMED and run.dedup
    assert done == ["charged"]


def test_a_block_that_raises_releases_its_key_and_the_next_block_runs(
    store: DedupStore, app_name: str
) -> None:
    """An exception leaves the block: the claim is released (no record) and the exception
    propagates; the next block with that key runs."""
    config = config_for(store, app_name)
    with pytest.raises(RuntimeError, match="card declined"), config.once("order-2") as run:
        assert run
        raise RuntimeError("card declined")
    assert store.get_status(once_element(app_name, "order-2")) is None
    with config.once("order-2") as run:
        assert run


def test_an_interrupt_in_a_block_releases_its_key(store: DedupStore, app_name: str) -> None:
    """KeyboardInterrupt (any BaseException) in the body releases the claim and propagates."""
    config = config_for(store, app_name)
    with pytest.raises(KeyboardInterrupt), config.once("order-3") as run:
        assert run
        raise KeyboardInterrupt
    assert store.get_status(once_element(app_name, "order-3")) is None


def test_a_block_in_progress_elsewhere_raises_at_once_without_a_wait(
    store: DedupStore, app_name: str
) -> None:
    """A key another block holds: DuplicateInProgressError from the with statement (the
    default wait, the config's in_progress_wait_milli_seconds, is 0)."""
    config = config_for(store, app_name)
    with config.once("order-4") as first:
        assert first
        begin = time.monotonic()
        with pytest.raises(DuplicateInProgressError) as raised, config.once("order-4"):
            pytest.fail("the body of a duplicate in progress ran")
        assert time.monotonic() - begin < 1.0
        assert raised.value.element == once_element(app_name, "order-4")
        assert isinstance(raised.value, DuplicateError)


@pytest.mark.parametrize("first_succeeds", [True, False])
def test_a_block_waits_for_a_key_in_progress_and_takes_its_outcome(
    store: DedupStore, app_name: str, first_succeeds: bool
) -> None:
    """With in_progress_wait_milli_seconds the store is asked again until the holder ends:
    its success makes this a CONSUMED duplicate, its failure lets this block run."""
    config = config_for(store, app_name)
    holding, finish = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with config.once("order-5") as run:
                assert run
                holding.set()
                assert finish.wait(10)
                if not first_succeeds:
                    raise RuntimeError("first attempt failed")
        except RuntimeError:
            pass

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert holding.wait(10)
        threading.Timer(0.3, finish.set).start()
        begin = time.monotonic()
        with config.once("order-5", in_progress_wait_milli_seconds=10_000) as run:
            waited = time.monotonic() - begin
            assert bool(run) is (not first_succeeds)
    finally:
        finish.set()
        thread.join(10)
    assert 0.25 <= waited < 5.0


def test_the_lease_is_renewed_while_a_block_runs(store: DedupStore, app_name: str) -> None:
    """A body running five leases long keeps its claim (renewal): blocks arriving after the
    first lease lapsed are still told it is in progress."""
    config = config_for(store, app_name, dedup_processing_expire_milli_seconds=300)
    with config.once("order-6") as run:
        assert run
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            with pytest.raises(DuplicateInProgressError), config.once("order-6"):
                pass
            time.sleep(0.05)
    with config.once("order-6") as run:
        assert not run


@pytest.mark.parametrize("key", [None, ""])
def test_a_block_without_a_key_runs_every_time_without_dedup(
    store: DedupStore, app_name: str, key: Any
) -> None:
    """Key None (or ""): the block runs, without dedup, every time (the listener's no_key)."""
    config = config_for(store, app_name)
    for _ in range(2):
        with config.once(key) as run:
            assert run and not run.dedup and run.element is None


@pytest.mark.parametrize("key", [object(), {"a"}, {"a": 1}])
def test_a_refused_key_raises_before_anything_is_claimed(
    store: DedupStore, app_name: str, key: Any
) -> None:
    """A key the listener refuses (its text an address, a set, a dict): DedupKeyError when the
    block is made."""
    config = config_for(store, app_name)
    with pytest.raises(DedupKeyError):
        config.once(key)


def test_bytes_and_int_keys_are_the_keys_the_listener_uses(
    store: DedupStore, app_name: str
) -> None:
    """b"k" and "k" are the same key; 7 and "7" too (key_text's rules)."""
    config = config_for(store, app_name)
    with config.once(b"k") as run:
        assert run
    with config.once("k") as run:
        assert not run
    with config.once(7) as run:
        assert run
    with config.once("7") as run:
        assert not run


def test_a_duplicate_body_that_never_tests_run_is_a_usage_error(
    store: DedupStore, app_name: str
) -> None:
    """The body of a duplicate that never looked at ``run`` did its work again: the block
    raises DedupUsageError when it ends instead of staying silent."""
    config = config_for(store, app_name)
    with config.once("order-7"):
        pass
    with pytest.raises(DedupUsageError), config.once("order-7"):
        pass


@pytest.mark.parametrize("mode", ["warn", "reject"])
def test_a_key_reused_with_another_payload(store: DedupStore, app_name: str, mode: str) -> None:
    """The payload check: the same key with another payload is the duplicate it claims to be
    under payload_mismatch="warn", PayloadMismatchError under "reject"; the same payload is a
    plain duplicate under both."""
    config = config_for(store, app_name, payload_mismatch=mode)
    with config.once("order-8", payload=b'{"amount": 10}') as run:
        assert run
    with config.once("order-8", payload=b'{"amount": 10}') as run:
        assert not run
    if mode == "warn":
        with config.once("order-8", payload=b'{"amount": 99}') as run:
            assert not run
    else:
        with pytest.raises(PayloadMismatchError), config.once("order-8", payload=b"other"):
            pass


def test_concurrent_blocks_with_one_key_run_the_work_once(store: DedupStore, app_name: str) -> None:
    """16 threads at once: the work runs once; each other block is a CONSUMED duplicate or
    in progress (never a second run)."""
    config = config_for(store, app_name)
    barrier = threading.Barrier(16)
    ran: List[int] = []
    others: List[str] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        barrier.wait(10)
        try:
            with config.once("hot") as run:
                if run:
                    time.sleep(0.05)
                    with lock:
                        ran.append(i)
                else:
                    with lock:
                        others.append("consumed")
        except DuplicateInProgressError:
            with lock:
                others.append("in progress")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(ran) == 1 and len(others) == 15


# -- the function -------------------------------------------------------------------------------


def test_a_function_runs_once_per_key_and_a_duplicate_raises(
    store: DedupStore, app_name: str
) -> None:
    """@deduplicated: a fresh key runs the function and returns its value; a CONSUMED key
    raises DuplicateConsumedError, the function not run (a skipped call never looks like a
    run). Another key runs."""
    config = config_for(store, app_name)
    charged: List[str] = []

    @deduplicated(config, key=lambda order, amount: order)
    def charge(order: str, amount: int) -> str:
        charged.append(order)
        return f"receipt-{order}-{amount}"

    assert charge("o1", 10) == "receipt-o1-10"
    with pytest.raises(DuplicateConsumedError) as raised:
        charge("o1", 10)
    assert raised.value.element.key == "o1"
    assert raised.value.record is not None
    assert raised.value.record.status is DedupStatus.CONSUMED
    assert charge("o2", 5) == "receipt-o2-5"
    assert charged == ["o1", "o2"]
    assert charge.__name__ == "charge"  # functools.wraps


def test_a_function_that_raises_is_run_again_by_the_next_call(
    store: DedupStore, app_name: str
) -> None:
    """The function raises: the key is released and the exception propagates; the next call
    runs it again."""
    config = config_for(store, app_name)
    attempts: List[int] = []

    @deduplicated(config, key=lambda order: order)
    def ship(order: str) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("carrier down")
        return len(attempts)

    with pytest.raises(ConnectionError):
        ship("o1")
    assert ship("o1") == 2
    with pytest.raises(DuplicateConsumedError):
        ship("o1")


def test_a_function_shares_the_records_of_a_consumer_of_the_same_topic(
    store: DedupStore, app_name: str
) -> None:
    """A function whose topic and tag are a consumer's, keyed like its listener, sees that
    consumer's records: a message consumed by the listener is a duplicate for the function
    (an HTTP replay of what a consumer already applied), and the other way round."""
    config = config_for(store, app_name)
    applied: List[str] = []

    class Orders(DedupConcurrentListener):
        def dedup_message_key(self, msg: Any) -> Any:
            return msg.keys.decode()

        def do_handle_msg(self, msg: Any) -> bool:
            applied.append(f"consumer {msg.keys.decode()}")
            return True

    @deduplicated(config, key=lambda order: order, topic="ORDER-TOPIC", tag="TagA")
    def apply(order: str) -> None:
        applied.append(f"http {order}")

    with Orders(config) as listener:
        listener(ClassicMessage("m1", topic="ORDER-TOPIC", keys=b"o1"))
        with pytest.raises(DuplicateConsumedError):
            apply("o1")
        apply("o2")
        listener(ClassicMessage("m2", topic="ORDER-TOPIC", keys=b"o2"))  # acked as duplicate
    assert applied == ["consumer o1", "http o2"]


def test_a_functions_records_live_under_its_qualified_name(
    store: DedupStore, app_name: str
) -> None:
    """Without ``topic`` two functions never share records: each one's topic is its module
    and qualified name."""
    config = config_for(store, app_name)

    @deduplicated(config, key=lambda k: k)
    def first(k: str) -> str:
        return "first"

    @deduplicated(config, key=lambda k: k)
    def second(k: str) -> str:
        return "second"

    assert (first("k"), second("k")) == ("first", "second")
    topic = f"{first.__module__}.{first.__qualname__}"
    assert store.get_status(DedupElement(app_name, topic, "", "k")) is DedupStatus.CONSUMED
