"""The asyncio record stores' contract: :class:`AsyncDedupStore`, the same public API as
:class:`~rocketmq_dedup.stores.base.DedupStore` with ``async def`` methods, on the same
:class:`~rocketmq_dedup.stores.base.StoreBoundary` (errors sorted and wrapped once, one result
per item asked) and the same contract (``tests/shared/store_contract.py`` runs on both). A
concrete store implements the ``async def do_*`` hooks; what its records are (keys, Lua
scripts, SQL text, rows) is the sync store's module, shared: only the I/O differs.

* :class:`AsyncMemoryDedupStore`: the memory store, for tests and single-process tools (its
  operations never wait, so they run on the event loop as they are);
* :class:`LoopBoundStore`: a sync :class:`DedupStore` whose calls run an asyncio store's on its
  event loop, from another thread (the lease keeper's thread, a client's callback thread, a
  test), never from the loop's own thread (that would wait for itself).

Stores over servers: :mod:`rocketmq_dedup.stores.redis.aio`, :mod:`.postgres.aio`,
:mod:`.mysql.aio`.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import importlib
import logging
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    FrozenSet,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from rocketmq_dedup.errors import DedupConfigError, DedupError, StoreError, StoreMisconfiguredError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import new_owner_token
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import (
    PROBE_APPLICATION,
    PROBE_LEASE_MS,
    PROBE_TOPIC,
    Claim,
    ClaimResult,
    DedupStore,
    Record,
    StoreBoundary,
    bounded_reason,
)
from rocketmq_dedup.stores.memory import MemoryDedupStore

T = TypeVar("T")
logger = logging.getLogger(__name__)


class AsyncDedupStore(StoreBoundary, abc.ABC):
    """Base class of the asyncio record stores (module docstring). Bound to the event loop
    that first uses it (its connections are that loop's)."""

    # -- public API: wraps driver errors, checks the number of results --------------------

    async def claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return await self._call(self.do_claim, claim, lease_ms)

    async def claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        if len(claims) == 1:
            return [await self._call(self.do_claim, claims[0], lease_ms)]
        if not claims:
            return []
        results = await self._call(self.do_claim_many, claims, lease_ms)
        return self._one_each(results, claims, "claim")

    async def mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        await self._call(self.do_mark_consumed, claim, retention_ms)

    async def mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        if len(claims) == 1:
            await self._call(self.do_mark_consumed, claims[0], retention_ms)
        elif claims:
            await self._call(self.do_mark_consumed_many, claims, retention_ms)

    async def mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        """:meth:`DedupStore.mark_failed`, awaited."""
        await self._call(self.do_mark_failed, claim, retention_ms, bounded_reason(reason))

    def count_lapses(self) -> None:
        """:meth:`DedupStore.count_lapses` (no I/O: the Redis store switches its scripts)."""

    async def release(self, claim: Claim) -> bool:
        return bool(await self._call(self.do_release, claim))

    async def release_many(self, claims: Sequence[Claim]) -> int:
        if len(claims) == 1:
            return int(await self.release(claims[0]))
        if not claims:
            return 0
        released = int(await self._call(self.do_release_many, claims))
        if not 0 <= released <= len(claims):
            raise StoreError(
                f"{self.describe()}: released {released} of {len(claims)} claims (a store defect)"
            )
        return released

    async def renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        if not claims:
            return []
        results = await self._call(self.do_renew_many, claims, lease_ms)
        return self._one_each(results, claims, "renew")

    async def read(self, element: DedupElement) -> Optional[Record]:
        return await self._call(self.do_read, element)

    async def read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        if len(elements) == 1:
            return [await self.read(elements[0])]
        results = await self._call(self.do_read_many, elements)
        return self._one_each(results, elements, "read")

    async def get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        record = await self.read(element)
        return record.status if record is not None else None

    async def check(self) -> None:
        """One round trip that proves the store is reachable (nothing written)."""
        await self._call(self.do_check)

    async def prove_writes(self, application: str = PROBE_APPLICATION) -> None:
        """:meth:`DedupStore.prove_writes`: probe records claimed, renewed, read and released
        through the store's own write path (server stores only)."""
        if not self.proves_writes:
            return
        owner = new_owner_token()
        elements = [DedupElement(application, PROBE_TOPIC, "", f"{owner}-{n}") for n in (1, 2, 3)]
        await self._call(self.do_prove_writes, [Claim(element, owner) for element in elements])

    async def check_usable(self, application: str = PROBE_APPLICATION) -> None:
        """The start-up check (:func:`rocketmq_dedup.stores.check_usable`), awaited: raises
        :class:`DedupConfigError` naming the address, the missing privilege or ACL rule."""
        try:
            await self.check()
            await self.prove_writes(application)
        except StoreMisconfiguredError as exc:
            raise DedupConfigError(
                f"the dedup store {self.describe()} refused the start-up check: "
                f"{exc.__cause__ or exc}; {exc.fix}"
            ) from exc
        except StoreError as exc:
            raise DedupConfigError(
                f"the dedup store {self.describe()} is not usable: {exc.__cause__ or exc}; "
                "fix the address, or pass check_store=False to start without it"
            ) from exc

    async def aclose(self) -> None:
        """Release client resources the store created itself (never the user's client); the
        store stays usable."""

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``, its errors wrapped once (:meth:`wrap_error`)."""
        try:
            return await fn(*args)
        except DedupError:
            raise
        except Exception as exc:
            raise self.wrap_error(exc) from exc

    # -- I/O hooks -----------------------------------------------------------------------

    async def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self._one_each(await self.do_claim_many([claim], lease_ms), [claim], "claim")[0]

    @abc.abstractmethod
    async def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]: ...

    async def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        await self.do_mark_consumed_many([claim], retention_ms)

    @abc.abstractmethod
    async def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None: ...

    async def do_release(self, claim: Claim) -> bool:
        return await self.do_release_many([claim]) == 1

    @abc.abstractmethod
    async def do_release_many(self, claims: Sequence[Claim]) -> int: ...

    async def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot record FAILED")

    @abc.abstractmethod
    async def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]: ...

    @abc.abstractmethod
    async def do_read(self, element: DedupElement) -> Optional[Record]: ...

    async def do_read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        return [await self.do_read(element) for element in elements]

    async def do_check(self) -> None:
        """Prove the store is reachable; the default has nothing to check."""

    async def do_prove_writes(self, claims: List[Claim]) -> None:
        """:meth:`DedupStore.do_prove_writes`, awaited."""
        lease = PROBE_LEASE_MS
        try:
            results = [
                await self.do_claim(claims[0], lease),
                *await self.do_claim_many(claims[1:], lease),
            ]
            if not all(result.claimed for result in results):
                raise StoreError(f"{self.describe()}: a new probe record was not claimed")
            if self.supports_renewal and not all(await self.do_renew_many(claims, 2 * lease)):
                raise StoreError(f"{self.describe()}: a claimed probe record was not renewed")
            record = await self.do_read(claims[0].element)
            if record is None or record.status is not DedupStatus.CONSUMING:
                raise StoreError(f"{self.describe()}: a claimed probe record reads {record}")
        except BaseException:
            try:
                await self.do_release_many(claims)
            except Exception:
                logger.debug("releasing the probe records failed", exc_info=True)
            raise
        released = await self.do_release_many(claims)
        if released != len(claims):
            raise StoreError(f"{self.describe()}: released {released} of {len(claims)} probes")


class AsyncMemoryDedupStore(AsyncDedupStore):
    """The memory store (:class:`MemoryDedupStore`), awaited: its operations never wait, so they
    run on the event loop. ``clock`` as the memory store's (tests move a ``ManualClock``)."""

    def __init__(self, store: Optional[MemoryDedupStore] = None, **options: Any) -> None:
        self.memory = store if store is not None else MemoryDedupStore(**options)

    def __len__(self) -> int:
        return len(self.memory)

    async def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self.memory.do_claim(claim, lease_ms)

    async def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return self.memory.do_claim_many(claims, lease_ms)

    async def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        self.memory.do_mark_consumed(claim, retention_ms)

    async def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        self.memory.do_mark_consumed_many(claims, retention_ms)

    async def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        self.memory.do_mark_failed(claim, retention_ms, reason)

    async def do_release(self, claim: Claim) -> bool:
        return self.memory.do_release(claim)

    async def do_release_many(self, claims: Sequence[Claim]) -> int:
        return self.memory.do_release_many(claims)

    async def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        return self.memory.do_renew_many(claims, lease_ms)

    async def do_read(self, element: DedupElement) -> Optional[Record]:
        return self.memory.do_read(element)


class LoopBoundStore(DedupStore):
    """A sync store over an asyncio store: each call runs the asyncio store's own public method
    on ``loop`` and waits for it in the calling thread. For threads other than the loop's (the
    lease keeper's, a client's callback threads, tests); on the loop's own thread a call would
    wait for itself, so it raises ``RuntimeError``."""

    def __init__(self, store: AsyncDedupStore, loop: asyncio.AbstractEventLoop) -> None:
        self.aio = store
        self.loop = loop
        self.supports_renewal = store.supports_renewal

    def _on_loop(self, coro: Awaitable[T]) -> T:
        if self.loop.is_running() and running_loop() is self.loop:
            if asyncio.iscoroutine(coro):
                coro.close()
            raise RuntimeError(
                "a LoopBoundStore was called on its own event loop's thread: await the "
                "asyncio store instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def describe(self) -> str:
        return self.aio.describe()

    def claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self._on_loop(self.aio.claim(claim, lease_ms))

    def claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return self._on_loop(self.aio.claim_many(claims, lease_ms))

    def mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        self._on_loop(self.aio.mark_consumed(claim, retention_ms))

    def mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        self._on_loop(self.aio.mark_consumed_many(claims, retention_ms))

    def mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        self._on_loop(self.aio.mark_failed(claim, retention_ms, reason))

    def count_lapses(self) -> None:
        self.aio.count_lapses()

    def release(self, claim: Claim) -> bool:
        return self._on_loop(self.aio.release(claim))

    def release_many(self, claims: Sequence[Claim]) -> int:
        return self._on_loop(self.aio.release_many(claims))

    def renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        return self._on_loop(self.aio.renew_many(claims, lease_ms))

    def read(self, element: DedupElement) -> Optional[Record]:
        return self._on_loop(self.aio.read(element))

    def read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        return self._on_loop(self.aio.read_many(elements))

    def check(self) -> None:
        self._on_loop(self.aio.check())

    def close(self) -> None:
        self._on_loop(self.aio.aclose())

    # The hooks: never reached (every public method above goes to the asyncio store).
    def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        raise NotImplementedError

    def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        raise NotImplementedError

    def do_release_many(self, claims: Sequence[Claim]) -> int:
        raise NotImplementedError

    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        raise NotImplementedError

    def do_read(self, element: DedupElement) -> Optional[Record]:
        raise NotImplementedError


def running_loop() -> Optional[asyncio.AbstractEventLoop]:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _module(obj: Any) -> str:
    return str(getattr(obj, "__module__", "") or "")


def is_async_redis_client(client: Any) -> bool:
    """True for a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (also a Sentinel's
    ``master_for``); never imports redis."""
    return any(
        _module(kind).startswith("redis.asyncio") and kind.__name__ in ("Redis", "RedisCluster")
        for kind in type(client).__mro__
    )


def is_async_postgres_source(client: Any) -> bool:
    """True for a ``psycopg_pool.AsyncConnectionPool`` or a ``functools.partial`` of
    ``psycopg.AsyncConnection.connect``; never imports psycopg."""
    if any(
        _module(kind).startswith("psycopg_pool") and kind.__name__ == "AsyncConnectionPool"
        for kind in type(client).__mro__
    ):
        return True
    if not isinstance(client, functools.partial):
        return False
    owner = getattr(client.func, "__self__", None)
    return isinstance(owner, type) and any(
        _module(kind).startswith("psycopg") and kind.__name__ == "AsyncConnection"
        for kind in owner.__mro__
    )


def is_async_mysql_factory(client: Any) -> bool:
    """True for a ``functools.partial`` of ``asyncmy.connect`` or ``aiomysql.connect`` (the
    asyncio MySQL drivers); never imports them."""
    return isinstance(client, functools.partial) and _module(client.func).startswith(
        ("asyncmy", "aiomysql")
    )


#: The options each kind of asyncio store takes, by the check that recognises its client.
_ASYNC_STORES: Dict[str, Tuple[str, FrozenSet[str]]] = {
    "redis": (
        "rocketmq_dedup.stores.redis.aio:AsyncRedisDedupStore",
        frozenset({"key_prefix", "defer_marks_ms"}),
    ),
    "postgres": (
        "rocketmq_dedup.stores.postgres.aio:AsyncPostgresDedupStore",
        frozenset({"table_name", "pool_size", "pool_timeout"}),
    ),
    "mysql": (
        "rocketmq_dedup.stores.mysql.aio:AsyncMySQLDedupStore",
        frozenset({"table_name", "pool_size", "pool_timeout"}),
    ),
}


def make_async_store(client: Any, **options: Any) -> Optional[AsyncDedupStore]:
    """The asyncio store for ``client``, or None when it is not an asyncio client (the sync
    :func:`~rocketmq_dedup.stores.make_store` then picks one): an :class:`AsyncDedupStore` as it
    is; a ``redis.asyncio`` client -> :class:`~.redis.aio.AsyncRedisDedupStore`; a
    ``psycopg_pool.AsyncConnectionPool`` or a partial of ``psycopg.AsyncConnection.connect`` ->
    :class:`~.postgres.aio.AsyncPostgresDedupStore`; a partial of ``asyncmy.connect`` (or
    ``aiomysql.connect``) -> :class:`~.mysql.aio.AsyncMySQLDedupStore`. Each store's module
    needs its extra only when used."""
    if isinstance(client, AsyncDedupStore):
        if options:
            raise DedupConfigError(
                f"option(s) {', '.join(sorted(options))} do not apply to a store object"
            )
        return client
    if is_async_redis_client(client):
        kind = "redis"
    elif is_async_postgres_source(client):
        kind = "postgres"
    elif is_async_mysql_factory(client):
        kind = "mysql"
    else:
        return None
    path, allowed = _ASYNC_STORES[kind]
    wrong = sorted(set(options) - allowed)
    if wrong:
        raise DedupConfigError(
            f"option(s) {', '.join(wrong)} do not apply to {path.rpartition(':')[2]} (it "
            f"takes: {', '.join(sorted(allowed))})"
        )
    module, _, name = path.partition(":")
    store: AsyncDedupStore = getattr(importlib.import_module(module), name)(client, **options)
    return store


__all__ = [
    "AsyncDedupStore",
    "AsyncMemoryDedupStore",
    "LoopBoundStore",
    "is_async_mysql_factory",
    "is_async_postgres_source",
    "is_async_redis_client",
    "make_async_store",
]
