"""Deduplicated functions: :func:`deduplicated` (a function run at most once per key, on the
listener's stores) and :func:`exactly_once` (a function whose writes through a given connection
commit with its dedup record, on the exactly-once mode's databases)."""

from __future__ import annotations

import functools
import inspect
from typing import (
    Any,
    Awaitable,
    Callable,
    Concatenate,
    Dict,
    Optional,
    ParamSpec,
    Tuple,
    TypeVar,
)

from rocketmq_dedup.errors import (
    DedupConfigError,
    DuplicateConsumedError,
    TransactionMisuseError,
)
from rocketmq_dedup.once.block import Once, raise_for, wait_ms_of
from rocketmq_dedup.once.call import Call
from rocketmq_dedup.once.registry import (
    async_strategy,
    async_transaction_strategy,
    exactly_once_config,
    transaction_strategy,
)
from rocketmq_dedup.once.strategy import CallDelivery
from rocketmq_dedup.status import Outcome

P = ParamSpec("P")
T = TypeVar("T")

#: What gives a call's key (or payload) from the function's arguments.
ArgsFn = Callable[..., Any]


def function_topic(fn: Callable[..., Any]) -> str:
    """The topic of a deduplicated function's records when none is given: its module and
    qualified name (two functions never share records by accident; rename it, and pass the
    old name as ``topic`` to keep its records)."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__  # a callable object
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}.{name}"


def _refuse_async(fn: Callable[..., Any], what: str, why: str) -> None:
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise DedupConfigError(f"{what} of {fn.__qualname__}: {why}")


def deduplicated(
    config: Any,
    key: ArgsFn,
    *,
    topic: Optional[str] = None,
    tag: str = "",
    payload: Optional[ArgsFn] = None,
    in_progress_wait_milli_seconds: Optional[float] = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Run the decorated function at most once per key (the listener's decision table, on its
    stores, leases, owner tokens, payload check and metrics)::

        @deduplicated(config, key=lambda order: order.id)
        def charge(order): ...

    ``key(*args, **kwargs)`` and ``payload(*args, **kwargs)`` get the call's arguments. A call
    with a fresh key runs the function: its return value is returned and the key recorded
    CONSUMED; if it raises, the key is released (a later call runs again) and the exception
    propagates. A call whose key is CONSUMED does not run: it raises
    :class:`~rocketmq_dedup.errors.DuplicateConsumedError` (it never returns something that
    looks like a run). A key in progress in another call is asked again for up to
    ``in_progress_wait_milli_seconds`` (default: the config's), then
    :class:`~rocketmq_dedup.errors.DuplicateInProgressError`. The rest as ``config.once``
    (:mod:`rocketmq_dedup.once.block`): a key of None runs without dedup, a refused key raises
    :class:`~rocketmq_dedup.errors.DedupKeyError`, a store outage follows
    ``store_failure_policy``.

    :param topic: the records' topic (default: the function's module and qualified name);
        ``topic`` and ``tag`` of a consumer's messages share that consumer's records.
    :param payload: what identifies the call's data (bytes or str), for the payload check.
    """
    if not callable(key):
        raise DedupConfigError(
            "deduplicated(config, key=...): key must be a callable of the "
            "function's arguments, e.g. key=lambda order: order.id"
        )
    wait_ms = wait_ms_of(in_progress_wait_milli_seconds)

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        records = topic if topic is not None else function_topic(fn)
        if inspect.iscoroutinefunction(fn):
            return _deduplicated_async(config, key, fn, records, tag, payload, wait_ms)  # type: ignore[return-value]
        _refuse_async(fn, "deduplicated", "an async generator is no call that returns")

        @functools.wraps(fn)
        def call_once(*args: P.args, **kwargs: P.kwargs) -> T:
            data = payload(*args, **kwargs) if payload is not None else None
            block = Once(config, key(*args, **kwargs), topic=records, tag=tag, payload=data)
            block._wait_ms = wait_ms
            with block as run:
                if run:
                    return fn(*args, **kwargs)
            raise consumed_error(fn, block)

        return call_once

    return decorate


def consumed_error(fn: Callable[..., Any], block: Once) -> DuplicateConsumedError:
    """What a duplicate call of ``fn`` raises: its block's key is CONSUMED."""
    return DuplicateConsumedError(
        f"{getattr(fn, '__qualname__', fn)}: {block.element!r} is CONSUMED: an earlier call ran it",
        block.element,
        block._delivery.record if block._delivery is not None else None,
    )


def _deduplicated_async(
    config: Any,
    key: ArgsFn,
    fn: Callable[..., Awaitable[Any]],
    records: str,
    tag: str,
    payload: Optional[ArgsFn],
    wait_ms: Optional[int],
) -> Callable[..., Awaitable[Any]]:
    """:func:`deduplicated` of an ``async def``: the same decisions, awaited on the config's
    asyncio store (``async with`` the call's :class:`Once`)."""
    async_strategy(config)  # a config of a sync store is refused now, not at the first call

    @functools.wraps(fn)
    async def call_once(*args: Any, **kwargs: Any) -> Any:
        data = payload(*args, **kwargs) if payload is not None else None
        block = Once(config, key(*args, **kwargs), topic=records, tag=tag, payload=data)
        block._wait_ms = wait_ms
        async with block as run:
            if run:
                return await fn(*args, **kwargs)
        raise consumed_error(fn, block)

    return call_once


def exactly_once(
    config: Any,
    key: ArgsFn,
    *,
    topic: Optional[str] = None,
    tag: str = "",
    payload: Optional[ArgsFn] = None,
    in_progress_wait_milli_seconds: Optional[float] = None,
) -> Callable[[Callable[Concatenate[Any, P], T]], Callable[P, T]]:
    """Run the decorated function in a transaction of the config's database, its writes and
    its dedup record committed together or not at all (the exactly-once mode of
    :class:`~rocketmq_dedup.TransactionalDedupListener`, on MySQL/MariaDB and on any store
    whose transaction port the mode supports)::

        @exactly_once(config, key=lambda order: order.id)
        def record_payment(conn, order):       # conn: the transaction's connection
            conn.cursor().execute("INSERT INTO t_payment ...", ...)

        record_payment(order)                   # called without conn

    The function writes through ``conn`` (its ``commit()``, ``rollback()``, ``close()`` and
    autocommit are refused). It returns: the transaction commits with the CONSUMED record and
    its value is returned. It raises: everything rolls back and the exception propagates (a
    later call runs again). A key already committed: nothing runs (or what ran is rolled back,
    when a concurrent copy committed first) and
    :class:`~rocketmq_dedup.errors.DuplicateConsumedError` is raised. A key in progress (a call
    of this process in it, or with ``exactly_once_claim="before_handler"`` any holder of the
    key's lock) is tried again for up to ``in_progress_wait_milli_seconds``, then
    :class:`~rocketmq_dedup.errors.DuplicateInProgressError`. A store failure raises the
    store's error whatever ``store_failure_policy`` says (the function needs that database).
    Local retries do not apply. Key, topic and payload: :func:`deduplicated`.

    Over an ``async def fn(conn, ...)`` the call is awaited, with the same decisions and
    answers, on the config's asyncio store: PostgreSQL through psycopg's async API (``conn`` is
    the transaction's ``psycopg.AsyncConnection``) or MySQL/MariaDB through asyncmy (its
    connection); every statement awaited, never blocking the event loop. Another store raises
    :class:`~rocketmq_dedup.errors.DedupConfigError` when the function is decorated. A
    cancelled call rolls back (unless its COMMIT was sent).
    """
    if not callable(key):
        raise DedupConfigError(
            "exactly_once(config, key=...): key must be a callable of the "
            "function's arguments (without conn)"
        )
    exactly_once_config(config)
    wait_ms = wait_ms_of(in_progress_wait_milli_seconds)

    def decorate(fn: Callable[Concatenate[Any, P], T]) -> Callable[P, T]:
        records = topic if topic is not None else function_topic(fn)
        if inspect.iscoroutinefunction(fn):
            return _exactly_once_async(config, key, fn, records, tag, payload, wait_ms)  # type: ignore[return-value]
        _refuse_async(fn, "exactly_once", "an async generator is no call that returns")
        strategy = transaction_strategy(config)

        @functools.wraps(fn)
        def call_once(*args: P.args, **kwargs: P.kwargs) -> T:
            delivery = call_delivery(fn, key, records, tag, payload, args, kwargs)
            strategy.decide(delivery, wait_ms)
            value: T = committed(delivery, fn)
            return value

        return call_once

    return decorate


def call_delivery(
    fn: Callable[..., Any],
    key: ArgsFn,
    records: str,
    tag: str,
    payload: Optional[ArgsFn],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
) -> CallDelivery:
    """An exactly-once call of ``fn`` with its arguments, on its way through the steps."""
    data = payload(*args, **kwargs) if payload is not None else None
    return CallDelivery(0, Call(key(*args, **kwargs), records, tag, data).bind(fn, args, kwargs))


def _exactly_once_async(
    config: Any,
    key: ArgsFn,
    fn: Callable[..., Awaitable[Any]],
    records: str,
    tag: str,
    payload: Optional[ArgsFn],
    wait_ms: Optional[int],
) -> Callable[..., Awaitable[Any]]:
    """:func:`exactly_once` of an ``async def``: the same decisions, awaited, in a transaction
    of the config's asyncio store (PostgreSQL on psycopg's async API, MySQL on asyncmy)."""
    strategy = async_transaction_strategy(config)  # refused now, not at the first call

    @functools.wraps(fn)
    async def call_once(*args: Any, **kwargs: Any) -> Any:
        delivery = call_delivery(fn, key, records, tag, payload, args, kwargs)
        await strategy.decide(delivery, wait_ms)
        return committed(delivery, fn)

    return call_once


def committed(delivery: CallDelivery, fn: Callable[..., Any]) -> Any:
    """What an exactly-once call's caller gets: the function's value once committed, else the
    error that says why nothing was committed."""
    call: Call = delivery.msg
    outcome = delivery.outcome
    if outcome in (Outcome.CONSUMED, Outcome.NO_KEY):  # NO_KEY: committed without a record
        return call.value
    if outcome is Outcome.FAILED:
        if call.error is not None:
            raise call.error
        raise TransactionMisuseError(
            f"{fn.__qualname__} ended, left or broke its transaction (commit(), autocommit, a "
            "reconnect): it was rolled back"
        )
    raise_for(delivery)  # raises, but for a duplicate of a committed key
    raise DuplicateConsumedError(
        f"{fn.__qualname__}: {delivery.element!r} was committed by an earlier call",
        delivery.element,
        delivery.record,
    )
