"""The decision rules: what handler return values mean, which keys are accepted, exceptions that
are not ``Exception``, batches given as iterators. The same answers on every store."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import threading
from typing import Any, Callable, Iterator, List, Optional

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupStatus,
    PermanentFailure,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import Claim, DedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import wait_for

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


class classic:  # stands for the module rocketmq.client
    class ConsumeStatus(enum.IntEnum):
        """rocketmq-client-python's ConsumeStatus (same class name, names and values)."""

        CONSUME_SUCCESS = 0
        RECONSUME_LATER = 1


ClassicConsumeStatus = classic.ConsumeStatus


class ConsumeResult(enum.Enum):
    """rocketmq-python-client 5.x's ConsumeResult (same names and values)."""

    SUCCESS = 0
    FAILURE = 1


class Listener(DedupConcurrentListener):
    """Returns ``result`` (or calls it) and dedups on ``key(msg)``; counts handler runs."""

    def __init__(
        self,
        config: Optional[DedupConfig],
        result: Any = True,
        key: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        super().__init__(config)
        self.result = result
        self.key = key
        self.runs: List[str] = []

    def dedup_message_key(self, msg: Any) -> Any:
        return self.key(msg) if self.key is not None else super().dedup_message_key(msg)

    def do_handle_msg(self, msg: Any) -> Any:
        self.runs.append(msg.id)
        return self.result(msg) if callable(self.result) else self.result


def config_for(store: DedupStore, app: str, **options: Any) -> DedupConfig:
    return DedupConfig.enable_dedup_consume_config(app, store, **options)


# -- handler return values -----------------------------------------------------------------------


#: Handler return values with one meaning, and the answer each means.
RETURN_VALUES = [
    (True, SUCCESS),
    (ConsumeStatus.CONSUME_SUCCESS, SUCCESS),
    (ClassicConsumeStatus.CONSUME_SUCCESS, SUCCESS),
    (ConsumeResult.SUCCESS, SUCCESS),
    (False, LATER),
    (None, LATER),
    (ConsumeStatus.RECONSUME_LATER, LATER),
    (ClassicConsumeStatus.RECONSUME_LATER, LATER),
    (ConsumeResult.FAILURE, LATER),
]


@pytest.mark.parametrize(("result", "expected"), RETURN_VALUES, ids=repr)
def test_handler_return_values_have_one_meaning(
    store: DedupStore, app_name: str, result: Any, expected: ConsumeStatus
) -> None:
    """True and every client's success value ack and mark CONSUMED; False, None and every
    client's retry value retry and release the claim (no truthiness)."""
    listener = Listener(config_for(store, app_name), result)
    assert listener(ClassicMessage("m1")) is expected
    status = store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1"))
    assert status is (DedupStatus.CONSUMED if expected is SUCCESS else None)
    listener.result = True
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert len(listener.runs) == (1 if expected is SUCCESS else 2)


# -- keys ----------------------------------------------------------------------------------------


class Opaque:
    """A key object whose text is its memory address."""


@dataclasses.dataclass(frozen=True)
class OrderKey:
    """A key object with a value-based repr."""

    order_id: int


class Named:
    """A key object with its own __str__."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"named-{self.name}"


LONE_SURROGATE = json.loads('"order-\\ud83d"')


#: Keys accepted as their text.
VALUE_KEYS = [
    "plain",
    LONE_SURROGATE,
    "\udcff",
    "订单-1 🎉",
    b"bytes-key",
    b"\xff\xfe invalid utf-8",
    12345,
    1.5,
    True,
    ("order", 7),
    ["order", 7],
    OrderKey(7),
    Named("x"),
]
#: Keys refused: their text is their identity, or its order is not stable.
REFUSED_KEYS = [Opaque(), {"a", "b"}, {"a": 1}, ("x", Opaque())]
#: What a handler may raise that is not an ``Exception``.
BASE_EXCEPTIONS = [asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit]


@pytest.mark.parametrize("key", VALUE_KEYS, ids=repr)
def test_value_keys_dedup_on_every_store(store: DedupStore, app_name: str, key: Any) -> None:
    """str (any code point), bytes, int and value-based objects dedup identically on every
    store: the handler runs once, the duplicate is acked."""
    listener = Listener(config_for(store, app_name), key=lambda msg: key)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener(ClassicMessage("m2")) is SUCCESS
    assert listener.runs == ["m1"]


def test_bytes_and_text_of_a_key_are_the_same_key(store: DedupStore, app_name: str) -> None:
    """b"k" and "k" name the same record."""
    config = config_for(store, app_name)
    Listener(config, key=lambda msg: b"order-1")(ClassicMessage("m1"))
    listener = Listener(config, key=lambda msg: "order-1")
    assert listener(ClassicMessage("m2")) is SUCCESS
    assert listener.runs == []


@pytest.mark.parametrize("key", REFUSED_KEYS, ids=repr)
def test_identity_keys_are_refused_on_every_store(
    store: DedupStore, app_name: str, key: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A key whose text is its identity (or unstable: sets, dicts) is refused: an error naming
    the type, RECONSUME_LATER, the handler not run, nothing written."""
    listener = Listener(config_for(store, app_name), key=lambda msg: key)
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
        assert listener.consume_each([ClassicMessage("m2")]) == [LATER]
    assert listener.runs == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and ("Opaque" in errors[0] or "set" in errors[0] or "dict" in errors[0])


# -- exceptions that are not Exception ----------------------------------------------------------


@pytest.mark.parametrize("exc_type", BASE_EXCEPTIONS)
def test_base_exceptions_on_a_client_thread_release_the_claim_and_never_escape(
    store: DedupStore, app_name: str, exc_type: type
) -> None:
    """On a client's (non-main) thread: RECONSUME_LATER, nothing escapes, the claim is released
    at once and no renewal goes on; the redelivery runs the handler."""

    def boom(msg: Any) -> Any:
        raise exc_type()

    listener = Listener(config_for(store, app_name), boom)
    answers: List[Any] = []
    thread = threading.Thread(target=lambda: answers.append(listener(ClassicMessage("m1"))))
    thread.start()
    thread.join()
    assert answers == [LATER]
    assert store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1")) is None
    listener.result = True
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.runs == ["m1", "m1"]


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_interrupts_on_the_main_thread_propagate_after_cleanup(
    store: DedupStore, app_name: str, exc_type: type
) -> None:
    """On the main thread Ctrl-C and sys.exit() still stop the program, after the claim was
    released."""

    def interrupt(msg: Any) -> Any:
        raise exc_type()

    listener = Listener(config_for(store, app_name), interrupt)
    with pytest.raises(exc_type):
        listener(ClassicMessage("m1"))
    assert store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1")) is None


# -- batches given as iterators ------------------------------------------------------------------


def test_any_iterable_is_a_batch(store: DedupStore, app_name: str) -> None:
    """Generators and other one-shot iterables work for consume_each and consume_message."""
    listener = Listener(config_for(store, app_name))
    generator = (ClassicMessage(f"m{i}") for i in range(3))
    assert listener.consume_each(generator) == [SUCCESS] * 3
    result = listener.consume_message(iter([ClassicMessage("m3"), ClassicMessage("m0")]))
    assert (result.status, result.ack_index) == (SUCCESS, 1)
    assert listener.runs == ["m0", "m1", "m2", "m3"]


def test_iterable_that_fails_is_refused_before_any_claim(store: DedupStore, app_name: str) -> None:
    """An iterable that raises while being read: nothing claimed, nothing handled or acked."""

    def broken() -> Iterator[Any]:
        yield ClassicMessage("m1")
        raise RuntimeError("broken source")

    listener = Listener(config_for(store, app_name))
    assert listener.consume_each(broken()) == []
    assert listener.consume_message(broken()).ack_index == -1
    assert listener.runs == []
    assert store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1")) is None


def test_interrupted_batch_marks_the_handled_and_releases_the_rest(
    store: DedupStore, app_name: str
) -> None:
    """A batch whose second handler is cancelled: the first stays CONSUMED, the others are
    released at once, and the batch is answered RECONSUME_LATER."""

    def second_cancels(msg: Any) -> Any:
        if msg.id == "m2":
            raise asyncio.CancelledError()
        return True

    listener = Listener(config_for(store, app_name), second_cancels)
    answers: List[Any] = []
    batch = [ClassicMessage(f"m{i}") for i in (1, 2, 3)]
    thread = threading.Thread(target=lambda: answers.append(listener.consume_each(batch)))
    thread.start()
    thread.join()
    assert answers == [[LATER] * 3]

    def status(key: str) -> Optional[DedupStatus]:
        return store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", key))

    assert status("m1") is DedupStatus.CONSUMED
    assert wait_for(lambda: status("m2") is None and status("m3") is None)


# -- payload fingerprints ------------------------------------------------------------------------


class Fingerprinted(Listener):
    """Dedups on ``keys[id]`` and fingerprints the body."""

    def payload_fingerprint(self, msg: Any) -> Any:
        return msg.body


@pytest.mark.parametrize("action", ["warn", "reject"])
def test_duplicate_key_with_another_payload_is_reported(
    store: DedupStore, app_name: str, action: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Same key, same payload: a plain duplicate. Same key, another payload: logged as a
    producer bug; acked as a duplicate under "warn", RECONSUME_LATER under "reject"."""
    listener = Fingerprinted(
        config_for(store, app_name, payload_mismatch=action), key=lambda msg: "order-1"
    )
    assert listener(ClassicMessage("m1", body=b"pay 10")) is SUCCESS
    assert listener(ClassicMessage("m2", body=b"pay 10")) is SUCCESS
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        answer = listener(ClassicMessage("m3", body=b"pay 99"))
    assert answer is (LATER if action == "reject" else SUCCESS)
    assert listener.runs == ["m1"]
    assert any("different payload" in r.getMessage() for r in caplog.records)


# -- messages that can never succeed ----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "answer"), [("dlq", LATER), ("ack", SUCCESS)], ids=["dlq", "ack"]
)
def test_a_permanent_failure_is_recorded_and_its_copies_answered_without_the_handler(
    store: DedupStore, app_name: str, policy: str, answer: ConsumeStatus
) -> None:
    """A handler raising PermanentFailure runs once: the message is recorded FAILED with the
    reason, answered as permanent_failure says, and so is every copy, alone or in a batch,
    without the handler."""

    def refuse(msg: Any) -> Any:
        raise PermanentFailure(f"order {msg.id} has no amount")

    listener = Listener(config_for(store, app_name, permanent_failure=policy), result=refuse)
    msg = ClassicMessage("m1")
    assert [listener(msg), listener(msg), *listener.consume_each([msg, msg])] == [answer] * 4
    assert listener.runs == ["m1"]
    record = store.read(DedupElement(app_name, msg.topic, "TagA", "m1"))
    assert record is not None
    assert (record.status, record.reason) == (DedupStatus.FAILED, "order m1 has no amount")


def test_a_claim_whose_consumers_died_is_parked_at_max_lapsed_claims(
    store: DedupStore, app_name: str
) -> None:
    """With max_lapsed_claims=2, a message whose claims lapsed twice (consumers that died in
    its handler, stood for by claims nobody settles) is parked: FAILED, its handler not run."""
    config = config_for(store, app_name, max_lapsed_claims=2)
    listener = Listener(config)
    msg = ClassicMessage("m1")
    element = DedupElement(app_name, msg.topic, "TagA", "m1")
    for n in (1, 2):  # two consumers die in the handler: their claims are never settled
        assert store.claim(Claim(element, f"dead-{n}"), 300).lapsed == n - 1
        wait_for(lambda: store.read(element) is None, timeout=10)
    assert listener(msg) is LATER
    assert listener.runs == []
    record = store.read(element)
    assert record is not None and record.status is DedupStatus.FAILED
    assert record.reason == "its handler ended 2 consumers (claims lapsed, never settled)"
