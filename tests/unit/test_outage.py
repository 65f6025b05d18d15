"""Case 9: a store outage follows store_failure_policy, the same on Redis and MySQL."""

from __future__ import annotations

import logging
import queue
from typing import Any, List

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    MemoryDedupStore,
    RedisDedupStore,
    StoreError,
    StorePoolExhaustedError,
    StoreUnavailableError,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import Claim, ClaimResult
from rocketmq_dedup.stores.redis import transport
from rocketmq_dedup.testing import ClassicMessage
from tests.support import mysql_connect

CLOSED_PORT = 1  # nothing listens on 127.0.0.1:1


class Counting(DedupConcurrentListener):
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.handled: List[Any] = []

    def do_handle_msg(self, msg: Any) -> bool:
        self.handled.append(msg)
        return True


def unreachable_client(kind: str) -> Any:
    if kind == "redis":
        # No client-side retries: the test is about the policy, not redis-py's backoff.
        return redis.Redis(
            port=CLOSED_PORT, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
    return mysql_connect(port=CLOSED_PORT, connect_timeout=1)


@pytest.mark.parametrize("kind", ["redis", "mysql"])
def test_outage_consumes_without_dedup_by_default(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Default policy "consume": the handler runs (nothing is lost) and a warning is logged."""
    listener = Counting(
        DedupConfig.enable_dedup_consume_config("app", unreachable_client(kind), check_store=False)
    )
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
        assert (
            listener.consume_message([ClassicMessage("m2")]).status is ConsumeStatus.CONSUME_SUCCESS
        )
    assert len(listener.handled) == 2
    assert any("WITHOUT dedup" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", ["redis", "mysql"])
def test_outage_reconsume_later_policy_leaves_it_to_the_broker(kind: str) -> None:
    """Policy "reconsume_later": RECONSUME_LATER and the handler does not run."""
    config = DedupConfig.enable_dedup_consume_config(
        "app", unreachable_client(kind), store_failure_policy="reconsume_later", check_store=False
    )
    listener = Counting(config)
    assert listener(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
    assert listener.consume_message([ClassicMessage("m2")]).status is ConsumeStatus.RECONSUME_LATER
    assert listener.handled == []


@pytest.mark.parametrize("kind", ["redis", "mysql"])
def test_store_errors_wrap_the_driver_error(kind: str) -> None:
    """An unreachable server is an outage: StoreUnavailableError, the driver's exception as
    __cause__."""
    config = DedupConfig.enable_dedup_consume_config(
        "app", unreachable_client(kind), check_store=False
    )
    assert config.persist is not None
    with pytest.raises(StoreUnavailableError) as info:
        config.persist.claim(Claim(DedupElement("app", "T", "", "k"), "o"), 1000)
    assert info.value.__cause__ is not None


class FailingMarkStore(MemoryDedupStore):
    """Claims work; recording CONSUMED and releasing fail."""

    def do_mark_consumed_many(self, *args: Any) -> None:
        raise OSError("store went away")

    do_mark_consumed = do_mark_consumed_many

    def do_release_many(self, *args: Any) -> int:
        raise OSError("store went away")

    do_release = do_release_many  # type: ignore[assignment]
    outage_errors = (OSError,)


def test_mark_failure_after_success_still_acks(caplog: pytest.LogCaptureFixture) -> None:
    """A failure to mark CONSUMED after a successful handler acks the message and logs it."""
    listener = Counting(DedupConfig.enable_dedup_consume_config("app", FailingMarkStore()))
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert any("could not mark" in r.getMessage() for r in caplog.records)


def test_release_failure_does_not_hide_the_handler_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When the handler raises and the release fails too, both are logged and the answer is
    RECONSUME_LATER."""

    class Failing(Counting):
        def do_handle_msg(self, msg: Any) -> bool:
            raise RuntimeError("business failure")

    listener = Failing(DedupConfig.enable_dedup_consume_config("app", FailingMarkStore()))
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
    messages = [r.getMessage() for r in caplog.records]
    assert any("do_handle_msg raised" in m for m in messages)
    assert any("could not release" in m for m in messages)


class BuggyStore(MemoryDedupStore):
    """A store whose claim has a bug (not an outage)."""

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        raise TypeError("a bug in the store")


def test_store_bug_is_not_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A programming error in a store is a StoreError, not an outage: under the default
    "consume" policy the message is retried (handler not run) and an ERROR is logged."""
    store = BuggyStore()
    with pytest.raises(StoreError) as info:
        store.claim(Claim(DedupElement("app", "T", "", "k"), "o"), 1000)
    assert not isinstance(info.value, StoreUnavailableError)
    listener = Counting(DedupConfig.enable_dedup_consume_config("app", store))
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
        assert listener.consume_each([ClassicMessage("m2")]) == [ConsumeStatus.RECONSUME_LATER]
    assert listener.handled == []
    assert any(
        r.levelno == logging.ERROR and "a bug in the store" in r.getMessage()
        for r in caplog.records
    )


def test_outage_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """During an outage one warning line covers many messages, with a count, not one each."""
    config = DedupConfig.enable_dedup_consume_config(
        "app", unreachable_client("redis"), check_store=False
    )
    listener = Counting(config)
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        for i in range(50):
            assert listener(ClassicMessage(f"m{i}")) is ConsumeStatus.CONSUME_SUCCESS
    warnings = [r for r in caplog.records if "WITHOUT dedup" in r.getMessage()]
    assert len(listener.handled) == 50
    assert len(warnings) == 1


class ShortStore(MemoryDedupStore):
    """A user's store that answers one claim result too few for a batch."""

    def do_claim_many(self, claims: Any, lease_ms: int) -> List[ClaimResult]:
        return super().do_claim_many(claims, lease_ms)[:-1]


def test_a_store_answering_fewer_results_is_a_defect_never_a_run_without_dedup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 21.3: the number of results is checked where stores are called: a store that
    answers fewer claim results than claims is a store defect (RECONSUME_LATER for the whole
    batch, an error naming the store), never a message left unclaimed and run."""
    store = ShortStore()
    listener = Counting(DedupConfig.enable_dedup_consume_config("app", store))
    msgs = [ClassicMessage(f"m{i}") for i in range(3)]
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener.consume_each(msgs) == [ConsumeStatus.RECONSUME_LATER] * 3
        assert listener.consume_message(msgs).ack_index == -1
    assert listener.handled == []
    assert any(
        "ShortStore: claim answered 2 result(s) for 3" in r.getMessage() for r in caplog.records
    )


def test_exhaustion_is_told_apart_from_connection_failures() -> None:
    """Issue 21: what counts as an exhausted Redis pool (not an outage): redis-py's
    MaxConnectionsError, its older "Too many connections", and the BlockingConnectionPool's
    error raised while waiting for its queue; a refused or lost connection is an outage."""

    def blocking_error() -> redis.ConnectionError:
        try:
            try:
                raise queue.Empty
            except queue.Empty:
                raise redis.ConnectionError("No connection available.")  # noqa: B904
        except redis.ConnectionError as exc:
            return exc

    exhausted = [redis.ConnectionError("Too many connections"), blocking_error()]
    if hasattr(redis.exceptions, "MaxConnectionsError"):
        exhausted.append(redis.exceptions.MaxConnectionsError("Too many connections"))
    failures = [redis.ConnectionError("Error 111 connecting"), redis.TimeoutError(), OSError()]
    assert [transport.pool_exhausted(e) for e in exhausted] == [True] * len(exhausted)
    assert [transport.pool_exhausted(e) for e in failures] == [False] * 3
    store = RedisDedupStore(redis.Redis(host="127.0.0.1", port=CLOSED_PORT))  # no I/O yet
    assert [store.is_outage(e) for e in exhausted] == [False] * len(exhausted)
    assert [store.is_outage(e) for e in failures] == [True] * 3
    assert all(isinstance(store.wrap_error(e), StorePoolExhaustedError) for e in exhausted)


def test_an_error_reply_is_recovered_by_its_kind_and_only_a_syntax_error_by_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lost script is told by redis-py's NoScriptError (scripts reloaded), not by the text
    "NOSCRIPT" in some other reply; a server without SET NX GET by its "syntax error" reply,
    and only while the store sends SET NX GET; any other reply is not recovered."""
    store = RedisDedupStore(redis.Redis(host="127.0.0.1", port=CLOSED_PORT))  # no I/O yet
    loads: List[int] = []
    monkeypatch.setattr(store, "_load_scripts", lambda: loads.append(1))
    assert store._recover([redis.exceptions.NoScriptError("No matching script.")])
    assert loads == [1]
    assert not store._recover([redis.ResponseError("NOSCRIPT in a reply of another kind")])
    assert not store._recover([redis.ResponseError("WRONGTYPE Operation against a key")])
    assert loads == [1] and store._set_nx_get
    assert store._recover([redis.ResponseError("syntax error")])
    assert not store._set_nx_get  # claims go through the Lua script from now on
    assert not store._recover([redis.ResponseError("syntax error")])  # not twice
