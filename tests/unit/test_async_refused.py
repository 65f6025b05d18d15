"""Async code the listener cannot run: an ``async def`` handler or hook is refused when the
listener is made (both listener kinds), and a handler or key hook that returns an awaitable at
run time is logged, its coroutine closed (never run, no "never awaited" warning), and the
message retried later. The exactly-once listener's run-time case against MariaDB is in
tests/integration/exactly_once/test_exactly_once.py."""

from __future__ import annotations

import gc
import inspect
import logging
import warnings
from typing import Any, AsyncIterator, Coroutine, List

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupConfigError,
    MemoryDedupStore,
    TransactionalDedupListener,
)
from rocketmq_dedup.testing import ClassicMessage, deliver

LATER = ConsumeStatus.RECONSUME_LATER


def memory_config() -> DedupConfig:
    return DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())


def mysql_config() -> DedupConfig:
    """A config on the MySQL store that never connects (check_store=False): enough to build a
    TransactionalDedupListener without a server."""
    return DedupConfig.enable_dedup_consume_config("app", lambda: None, check_store=False)


class AsyncHandler(DedupConcurrentListener):
    async def do_handle_msg(self, msg: Any) -> bool:  # type: ignore[override]
        return True


class AsyncTransactionalHandler(TransactionalDedupListener):
    async def do_handle_msg(self, msg: Any, conn: Any) -> bool:  # type: ignore[override]
        return True


@pytest.mark.parametrize("kind", ["plain", "exactly-once"])
def test_an_async_handler_is_refused_when_the_listener_is_made(kind: str) -> None:
    """``async def do_handle_msg`` on either listener kind: DedupConfigError at construction,
    naming the method and what to do, instead of a coroutine never awaited per message."""
    with pytest.raises(DedupConfigError) as refused:
        if kind == "plain":
            AsyncHandler(memory_config())
        else:
            AsyncTransactionalHandler(mysql_config())
    text = str(refused.value)
    assert ".do_handle_msg is an async def" in text
    assert "Define do_handle_msg with def" in text and "asyncio.run(" in text
    assert "not supported yet" in text


class Plain(DedupConcurrentListener):
    def do_handle_msg(self, msg: Any) -> bool:
        return True


async def _async_hook(self: Any, msg: Any, *rest: Any) -> Any:
    return "k"


async def _async_generator_hook(self: Any, msg: Any) -> AsyncIterator[bool]:
    yield True


@pytest.mark.parametrize(
    "name", ["dedup_message_key", "payload_fingerprint", "on_duplicate", "do_handle_msg"]
)
def test_an_async_hook_is_refused_too(name: str) -> None:
    """Every method the listener calls for the user (the key, the payload fingerprint, the
    duplicate hook) is refused as an async def, and so is an async generator handler."""
    hook = _async_generator_hook if name == "do_handle_msg" else _async_hook
    listener_class = type("Hooked", (Plain,), {name: hook})
    with pytest.raises(DedupConfigError, match=rf"Hooked\.{name} is an async def"):
        listener_class(memory_config())


def test_an_async_sequence_key_is_refused_on_the_exactly_once_listener() -> None:
    """TransactionalDedupListener's own hook, sequence_key, is checked as well."""

    class Sequenced(TransactionalDedupListener):
        def do_handle_msg(self, msg: Any, conn: Any) -> bool:
            return True

        async def sequence_key(self, msg: Any) -> Any:  # type: ignore[override]
            return ("order", 1)

    with pytest.raises(DedupConfigError, match=r"Sequenced\.sequence_key is an async def"):
        Sequenced(mysql_config())


class ReturnsCoroutine(DedupConcurrentListener):
    """A plain def whose body calls an async function and forgets to await it."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.returned: List[Coroutine[Any, Any, bool]] = []

    async def apply(self, msg: Any) -> bool:
        raise AssertionError("the coroutine must never run")

    def do_handle_msg(self, msg: Any) -> Any:
        coroutine = self.apply(msg)
        self.returned.append(coroutine)
        return coroutine


def test_a_handler_returning_a_coroutine_is_retried_and_the_coroutine_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each delivery: RECONSUME_LATER, the claim released (the next one runs the handler
    again), one error naming the awaitable; every coroutine closed unrun, and Python warns
    about none of them."""
    listener = ReturnsCoroutine(memory_config())
    with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.ERROR):
        warnings.simplefilter("always")
        report = deliver(listener, ClassicMessage("m1", keys=b"k"), times=2)
        states = [inspect.getcoroutinestate(c) for c in listener.returned]
        listener.returned.clear()
        gc.collect()
    assert report.answers == (LATER, LATER) and report.handler_runs == 2
    assert states == ["CORO_CLOSED", "CORO_CLOSED"]
    assert not [w for w in warned if "never awaited" in str(w.message)], warned
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert "do_handle_msg returned an awaitable, <coroutine object" in errors[0]
    assert "ReturnsCoroutine.apply" in errors[0] and "asyncio.run(" in errors[0]


def test_a_key_hook_returning_a_coroutine_is_a_refused_key() -> None:
    """A plain def dedup_message_key that returns a coroutine: never a key keyed by the
    coroutine's address; the message is retried (outcome key_error) and the coroutine closed."""
    returned: List[Coroutine[Any, Any, str]] = []

    async def lookup(msg: Any) -> str:
        raise AssertionError("the coroutine must never run")

    class KeyedByCoroutine(Plain):
        def dedup_message_key(self, msg: Any) -> Any:
            returned.append(lookup(msg))
            return returned[-1]

    store = MemoryDedupStore()
    listener = KeyedByCoroutine(DedupConfig.enable_dedup_consume_config("app", store))
    report = deliver(listener, ClassicMessage("m1"), times=1)
    assert report.answers == (LATER,) and report.handler_runs == 0
    assert inspect.getcoroutinestate(returned[0]) == "CORO_CLOSED"
    assert store.stats("app", 10).counts == {}


def test_a_plain_listener_is_built_as_before() -> None:
    """The check refuses only async code: a listener of plain defs answers as it did."""
    listener = Plain(memory_config())
    assert deliver(listener, ClassicMessage("m1"), times=2).answers == (
        ConsumeStatus.CONSUME_SUCCESS,
        ConsumeStatus.CONSUME_SUCCESS,
    )
