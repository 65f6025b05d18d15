"""DedupConcurrentListener behaviour (the numbered cases of the design), on every store."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional

import pytest

from rocketmq_dedup import (
    BatchResult,
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupStatus,
)
from rocketmq_dedup.stores.base import Claim, DedupStore
from rocketmq_dedup.testing import ClassicMessage, GrpcMessage
from tests.aio_support import AsyncRecordingListener, BridgedListener, async_store_of
from tests.support import wait_for

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


class RecordingListener(DedupConcurrentListener):
    """Counts handler runs per key; ``behaviour`` decides each run's result. On a config of an
    asyncio store, the asyncio listener behind the classic push bridge (tests.aio_support)."""

    def __new__(cls, config: Optional[DedupConfig] = None, *args: Any, **kwargs: Any) -> Any:
        if config is not None and config.async_store is not None:
            return BridgedListener(AsyncRecordingListener(config, *args, **kwargs))
        return super().__new__(cls)

    def __init__(
        self,
        config: Optional[DedupConfig],
        behaviour: Optional[Callable[[Any], Any]] = None,
        key: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        super().__init__(config)
        self.behaviour = behaviour
        self.key = key
        self.handled: List[Any] = []
        self._lock = threading.Lock()

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return self.key(msg) if self.key else super().dedup_message_key(msg)

    def do_handle_msg(self, msg: Any) -> bool:
        with self._lock:
            self.handled.append(msg)
        return self.behaviour(msg) if self.behaviour else True


def config_for(store: DedupStore, app: str, **options: Any) -> DedupConfig:
    client = async_store_of(store)  # the asyncio store behind a bound one
    if client is None:  # (not `or`: an empty asyncio memory store is falsy, it has a length)
        client = store
    return DedupConfig.enable_dedup_consume_config(app, client, **options)


@pytest.fixture(params=[ClassicMessage, GrpcMessage], ids=["classic", "grpc"])
def make_msg(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Messages of both clients' shapes."""
    return request.param  # type: ignore[no-any-return]


# 1 -------------------------------------------------------------------------------------------


def test_fresh_message_is_handled_once(
    store: DedupStore, app_name: str, make_msg: Callable[..., Any]
) -> None:
    """Case 1: a fresh message runs the handler; redeliveries ack without running it."""
    listener = RecordingListener(config_for(store, app_name))
    assert listener(make_msg("m1")) is SUCCESS
    assert listener(make_msg("m1")) is SUCCESS
    assert listener(make_msg("m1")) is SUCCESS
    assert len(listener.handled) == 1


def test_message_runs_again_after_retention(store: DedupStore, app_name: str) -> None:
    """Case 1: once the CONSUMED record's retention passes, a redelivery runs again."""
    listener = RecordingListener(config_for(store, app_name, dedup_record_reserve_minutes=0.005))
    assert listener(ClassicMessage("m1")) is SUCCESS
    wait_for(lambda: listener(ClassicMessage("m1")) is SUCCESS and len(listener.handled) == 2)


# 2 -------------------------------------------------------------------------------------------


def test_duplicate_during_handler_is_consumed_later(store: DedupStore, app_name: str) -> None:
    """Case 2: a duplicate arriving while the first runs gets RECONSUME_LATER, no handler."""
    entered, release = threading.Event(), threading.Event()

    def slow(msg: Any) -> bool:
        entered.set()
        assert release.wait(10)
        return True

    listener = RecordingListener(config_for(store, app_name), slow)
    results: List[ConsumeStatus] = []
    first = threading.Thread(target=lambda: results.append(listener(ClassicMessage("m1"))))
    first.start()
    assert entered.wait(10)
    assert listener(ClassicMessage("m1")) is LATER
    release.set()
    first.join(10)
    assert results == [SUCCESS]
    assert len(listener.handled) == 1
    assert listener(ClassicMessage("m1")) is SUCCESS  # the broker's retry: acked as duplicate
    assert len(listener.handled) == 1


# 3 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["false", "raise", "none"])
def test_failed_handler_is_retried(
    store: DedupStore, app_name: str, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Case 3: False, an exception or None -> RECONSUME_LATER; the claim is removed so the
    redelivery runs the handler."""
    attempts: List[int] = []

    def flaky(msg: Any) -> Any:
        attempts.append(1)
        if len(attempts) > 1:
            return True
        if outcome == "raise":
            raise RuntimeError("boom")
        return False if outcome == "false" else None

    listener = RecordingListener(config_for(store, app_name), flaky)
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
    if outcome == "raise":
        assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)
    assert store.get_status(_element(app_name)) is None
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert len(attempts) == 2


def _element(app: str, key: str = "m1") -> Any:
    from rocketmq_dedup import DedupElement

    return DedupElement(app, "TEST-TOPIC", "TagA", key)


# 4 -------------------------------------------------------------------------------------------


def test_concurrent_deliveries_run_the_handler_once(store: DedupStore, app_name: str) -> None:
    """Case 4: 16 threads delivering one key at once -> one handler run."""
    barrier = threading.Barrier(16)
    listener = RecordingListener(config_for(store, app_name))

    def deliver() -> None:
        barrier.wait(10)
        listener(ClassicMessage("hot"))

    threads = [threading.Thread(target=deliver) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(listener.handled) == 1


# 5 -------------------------------------------------------------------------------------------


def test_lease_expiry_lets_a_duplicate_run_and_late_failure_keeps_its_record(
    store: DedupStore, app_name: str
) -> None:
    """Case 5: after a handler's lease lapses a duplicate runs; when the slow first handler
    then fails, it neither deletes the newer claim nor the newer CONSUMED record."""
    entered, release = threading.Event(), threading.Event()

    def behaviour(msg: Any) -> bool:
        if msg.body == b"slow":
            entered.set()
            assert release.wait(20)
            return False  # the late failure
        return True

    listener = RecordingListener(
        config_for(store, app_name, dedup_processing_expire_milli_seconds=300, lease_renewal=False),
        behaviour,
    )
    slow = threading.Thread(target=listener, args=(ClassicMessage("m1", body=b"slow"),))
    slow.start()
    assert entered.wait(10)
    wait_for(lambda: listener(ClassicMessage("m1", body=b"fast")) is SUCCESS)
    release.set()
    slow.join(20)
    assert store.get_status(_element(app_name)) is DedupStatus.CONSUMED
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert [m.body for m in listener.handled] == [b"slow", b"fast"]


def test_late_success_is_recorded_as_consumed(store: DedupStore, app_name: str) -> None:
    """Case 5: a handler that succeeds after losing its lease still records CONSUMED, even
    over a newer claim; the newer claimer's failure cannot delete it."""
    entered, release = threading.Event(), threading.Event()
    second_in, second_go = threading.Event(), threading.Event()

    def behaviour(msg: Any) -> bool:
        if msg.body == b"slow":
            entered.set()
            assert release.wait(20)
            return True
        second_in.set()
        assert second_go.wait(20)
        return False

    listener = RecordingListener(
        config_for(store, app_name, dedup_processing_expire_milli_seconds=300, lease_renewal=False),
        behaviour,
    )
    slow = threading.Thread(target=listener, args=(ClassicMessage("m1", body=b"slow"),))
    slow.start()
    assert entered.wait(10)
    results: List[ConsumeStatus] = []

    def second() -> None:
        wait_for(lambda: _try(listener, results))

    newer = threading.Thread(target=second)
    newer.start()
    assert second_in.wait(20)  # the newer claim is running
    release.set()
    slow.join(20)
    assert store.get_status(_element(app_name)) is DedupStatus.CONSUMED
    second_go.set()
    newer.join(20)
    assert results[-1] is LATER
    assert store.get_status(_element(app_name)) is DedupStatus.CONSUMED
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert len(listener.handled) == 2


def _try(listener: RecordingListener, results: List[ConsumeStatus]) -> bool:
    before = len(listener.handled)
    results.append(listener(ClassicMessage("m1", body=b"second")))
    return len(listener.handled) > before


# 7 -------------------------------------------------------------------------------------------


def test_tag_and_key_never_collide(store: DedupStore, app_name: str) -> None:
    """Case 7: empty tag + key 'A:B' and tag 'A' + key 'B' are different messages; keys are
    case-sensitive."""
    listener = RecordingListener(config_for(store, app_name), key=lambda m: m.body.decode())
    assert listener(ClassicMessage("1", tags=b"", body=b"A:B")) is SUCCESS
    assert listener(ClassicMessage("2", tags=b"A", body=b"B")) is SUCCESS
    assert listener(ClassicMessage("3", tags=b"A", body=b"b")) is SUCCESS
    assert listener(GrpcMessage("4", tag=None, body=b"A:B")) is SUCCESS  # same as the first
    assert len(listener.handled) == 3


# 8 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "", b""])
def test_missing_or_empty_key_consumes_without_dedup(
    store: DedupStore, app_name: str, key: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Case 8: key None -> consumed without dedup; an empty key too, with a warning."""
    listener = RecordingListener(config_for(store, app_name), key=lambda m: key)
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert listener(ClassicMessage("m1")) is SUCCESS
    assert len(listener.handled) == 2
    assert any("empty" in r.getMessage() for r in caplog.records) == (key is not None)


def test_failing_key_function_retries_later(store: DedupStore, app_name: str) -> None:
    """A dedup_message_key that raises -> RECONSUME_LATER, the handler is not run."""

    def broken(msg: Any) -> str:
        raise ValueError("no key")

    listener = RecordingListener(config_for(store, app_name), key=broken)
    assert listener(ClassicMessage("m1")) is LATER
    assert listener.handled == []


# batches ------------------------------------------------------------------------------------


def test_batch_stops_at_first_failure(store: DedupStore, app_name: str) -> None:
    """A batch is handled in order and stops at the first failure; the rest is released so
    the retry handles it, and what succeeded is acked as duplicates on the retry."""
    fail_once = {"m2"}

    def behaviour(msg: Any) -> bool:
        if msg.id in fail_once:
            fail_once.discard(msg.id)
            return False
        return True

    listener = RecordingListener(config_for(store, app_name), behaviour)
    batch = [ClassicMessage(f"m{i}") for i in range(4)]
    assert listener.consume_message(batch) == BatchResult(LATER, 1)
    assert [m.id for m in listener.handled] == ["m0", "m1", "m2"]
    assert listener.consume_message(batch) == BatchResult(SUCCESS, 3)
    assert [m.id for m in listener.handled] == ["m0", "m1", "m2", "m2", "m3"]


def test_batch_stops_at_a_message_being_consumed(store: DedupStore, app_name: str) -> None:
    """A batch member whose key is CONSUMING elsewhere stops the batch there."""
    config = config_for(store, app_name)
    store.claim(Claim(_element(app_name, "m1"), "someone-else"), 60_000)
    listener = RecordingListener(config)
    result = listener.consume_message([ClassicMessage(f"m{i}") for i in range(3)])
    assert result == BatchResult(LATER, 0)
    assert result.consumed == 1
    assert store.get_status(_element(app_name, "m2")) is None  # released, not left claimed


# 12 ------------------------------------------------------------------------------------------


def test_consume_each_handles_members_independently(store: DedupStore, app_name: str) -> None:
    """consume_each: one failure does not stop the others; duplicates are acked; the failed
    member's claim is released so its redelivery runs."""
    fail_once = {"m1"}

    def behaviour(msg: Any) -> bool:
        if msg.id in fail_once:
            fail_once.discard(msg.id)
            return False
        return True

    listener = RecordingListener(config_for(store, app_name), behaviour)
    listener(ClassicMessage("m2"))  # already consumed before the batch
    batch = [ClassicMessage(f"m{i}") for i in range(4)]
    assert listener.consume_each(batch) == [SUCCESS, LATER, SUCCESS, SUCCESS]
    assert listener.consume_each(batch) == [SUCCESS] * 4
    assert [m.id for m in listener.handled] == ["m2", "m0", "m1", "m3", "m1"]


# lease renewal ------------------------------------------------------------------------------


def test_lease_is_renewed_while_the_handler_runs(store: DedupStore, app_name: str) -> None:
    """With renewal (the default) a handler running 5 leases long keeps its claim: a
    duplicate arriving after the first lease lapsed is still answered RECONSUME_LATER."""
    entered, release = threading.Event(), threading.Event()

    def slow(msg: Any) -> bool:
        entered.set()
        assert release.wait(20)
        return True

    listener = RecordingListener(
        config_for(store, app_name, dedup_processing_expire_milli_seconds=300), slow
    )
    first = threading.Thread(target=listener, args=(ClassicMessage("m1"),))
    first.start()
    assert entered.wait(10)
    deadline = time.monotonic() + 1.5  # five leases
    while time.monotonic() < deadline:
        assert listener(ClassicMessage("m1")) is LATER
        time.sleep(0.05)
    release.set()
    first.join(10)
    assert len(listener.handled) == 1
    assert listener(ClassicMessage("m1")) is SUCCESS


def test_renewal_stops_after_max_processing(store: DedupStore, app_name: str) -> None:
    """Past max_processing_milli_seconds the lease is no longer renewed, so a hung handler
    cannot block its message forever: a duplicate then runs."""
    entered, release = threading.Event(), threading.Event()

    def behaviour(msg: Any) -> bool:
        if msg.body == b"hung":
            entered.set()
            assert release.wait(20)
        return True

    config = config_for(
        store, app_name, dedup_processing_expire_milli_seconds=300, max_processing_milli_seconds=600
    )
    listener = RecordingListener(config, behaviour)
    hung = threading.Thread(target=listener, args=(ClassicMessage("m1", body=b"hung"),))
    hung.start()
    assert entered.wait(10)
    wait_for(lambda: listener(ClassicMessage("m1", body=b"dup")) is SUCCESS)
    release.set()
    hung.join(10)
    assert [m.body for m in listener.handled] == [b"hung", b"dup"]


# local retries and the in-process wait (issue 24) --------------------------------------------


@pytest.mark.parametrize(("retries", "expected"), [(2, SUCCESS), (1, LATER)])
def test_local_retries_run_a_failed_handler_again_in_place(
    store: DedupStore, app_name: str, retries: int, expected: ConsumeStatus
) -> None:
    """local_retries=N: a failed handler runs up to N more times, the claim still held, with a
    growing wait between runs; success then marks CONSUMED, the last failure releases."""
    results = iter([False, RuntimeError("flaky"), True])

    def behaviour(msg: Any) -> bool:
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    config = config_for(
        store, app_name, local_retries=retries, local_retry_backoff_milli_seconds=20
    )
    listener = RecordingListener(config, behaviour)
    begin = time.monotonic()
    assert listener(ClassicMessage("m1")) is expected
    assert len(listener.handled) == retries + 1
    assert time.monotonic() - begin >= 0.02 * (2**retries - 1)  # 20 ms, then 40 ms
    element = listener_element(app_name, "m1")
    assert store.get_status(element) is (DedupStatus.CONSUMED if expected is SUCCESS else None)


def test_local_retries_apply_to_each_member_of_a_batch(store: DedupStore, app_name: str) -> None:
    """In a batch each failed member gets its own local retries; the batch still stops at a
    member that never succeeds."""
    attempts: dict[str, int] = {}

    def behaviour(msg: Any) -> bool:
        attempts[msg.id] = attempts.get(msg.id, 0) + 1
        return msg.id != "never" and attempts[msg.id] > 1

    config = config_for(store, app_name, local_retries=1, local_retry_backoff_milli_seconds=1)
    listener = RecordingListener(config, behaviour)
    msgs = [ClassicMessage("a"), ClassicMessage("never"), ClassicMessage("c")]
    assert listener.consume_message(msgs) == BatchResult(LATER, 0)
    assert attempts == {"a": 2, "never": 2}


def listener_element(app: str, msg_id: str) -> Any:
    from rocketmq_dedup import DedupElement

    return DedupElement(app, "TEST-TOPIC", "TagA", msg_id)


@pytest.mark.parametrize("first_succeeds", [True, False])
def test_in_progress_wait_answers_a_twin_from_its_outcome(
    store: DedupStore, app_name: str, first_succeeds: bool
) -> None:
    """in_progress_wait_milli_seconds: a duplicate whose twin is in its handler in this process
    waits for the twin's outcome and is acked without its handler if the twin succeeded (else
    RECONSUME_LATER), instead of going back to the broker at once."""
    running, finish = threading.Event(), threading.Event()

    def behaviour(msg: Any) -> bool:
        if msg.body == b"first":
            running.set()
            assert finish.wait(10)
            return first_succeeds
        return True

    config = config_for(store, app_name, in_progress_wait_milli_seconds=5_000)
    listener = RecordingListener(config, behaviour)
    first = threading.Thread(target=listener, args=(ClassicMessage("m1", body=b"first"),))
    first.start()
    try:
        assert running.wait(10)
        threading.Timer(0.2, finish.set).start()
        begin = time.monotonic()
        answer = listener(ClassicMessage("m1", body=b"dup"))
        waited = time.monotonic() - begin
    finally:
        finish.set()
        first.join(10)
    assert answer is (SUCCESS if first_succeeds else LATER)
    assert 0.15 <= waited < 5.0  # waited for the twin, not for the whole bound
    assert [m.body for m in listener.handled] == [b"first"]


def test_without_in_progress_wait_a_twin_is_answered_at_once(
    store: DedupStore, app_name: str
) -> None:
    """The default (0): a duplicate of a message in its handler is RECONSUME_LATER at once."""
    running, finish = threading.Event(), threading.Event()

    def behaviour(msg: Any) -> bool:
        running.set()
        return finish.wait(10)

    listener = RecordingListener(config_for(store, app_name), behaviour)
    first = threading.Thread(target=listener, args=(ClassicMessage("m1"),))
    first.start()
    try:
        assert running.wait(10)
        begin = time.monotonic()
        assert listener(ClassicMessage("m1")) is LATER
        assert time.monotonic() - begin < 1.0
    finally:
        finish.set()
        first.join(10)
