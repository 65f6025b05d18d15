"""The Redis record store on ``redis.asyncio`` (the ``[redis]`` extra): standalone, Sentinel
(``redis.asyncio.sentinel.Sentinel(...).master_for(...)``) and Cluster
(``redis.asyncio.RedisCluster``). Keys, values, Lua scripts, the commands planned for a batch
and what their replies mean are :mod:`.records`' (the sync store's); only the I/O differs.

Round trips, as the sync store's: a fresh message costs two (``SET NX PX GET`` or the claim
script, then ``SET PX``), a duplicate one; with coalescing the ``SET PX`` of a CONSUMED mark
rides a later round trip (``defer_marks_ms``). On a ``redis.asyncio.Redis`` the requests of
concurrent tasks share round trips (:class:`~rocketmq_dedup.stores.coalesce_aio.
AsyncCoalescer`): one command per kind (a claim script over every key claimed meanwhile), sent
on one connection the store checks out of the client's pool (made the pool's way: Sentinel
discovery, TLS, credentials) and keeps until :meth:`AsyncRedisDedupStore.aclose`; a lost
connection is given back and the round trip run once more on a new one (every command is safe
to repeat). A script the server lost (a restart, a failover) is loaded again on that
connection. On a cluster every key is one command through the client (a script may touch one
slot), the keys of a batch concurrently.

Errors are sorted as the sync store sorts them (:mod:`.acl` for refusals; an exhausted pool is
:class:`~rocketmq_dedup.errors.StorePoolExhaustedError`, a ``DataError`` a defect, any other
``RedisError`` or socket error an outage).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import (
    DedupConfigError,
    MissingExtraError,
    StoreError,
    StorePoolExhaustedError,
)
from rocketmq_dedup.message import DedupElement, to_text
from rocketmq_dedup.stores.aio import AsyncDedupStore, is_async_redis_client
from rocketmq_dedup.stores.base import Claim, ClaimResult, Record
from rocketmq_dedup.stores.coalesce import (
    DEFAULT_DEFER_MS,
    DeferredMarks,
    Request,
    marks_failed_reporter,
)
from rocketmq_dedup.stores.coalesce_aio import AsyncCoalescer
from rocketmq_dedup.stores.redis import acl, transport
from rocketmq_dedup.stores.redis.records import (
    CLAIM,
    CLAIM_COUNTED,
    CONSUMED,
    CONSUMING,
    DEFAULT_KEY_PREFIX,
    FAIL,
    MARK,
    MARK_COUNTED,
    RELEASE,
    RELEASE_COUNTED,
    RENEW,
    SCRIPTS,
    RecordKeys,
    claim_result,
    failed_value,
    key_pattern,
    parse_record,
    plan_calls,
)
from rocketmq_dedup.stores.redis.store import MIN_POOL_SIZE, _is_syntax_error

try:  # the [redis] extra
    import redis
    import redis.asyncio
except ImportError:  # pragma: no cover - exercised by the no-extras import test
    redis = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)


class AsyncRedisDedupStore(DeferredMarks, AsyncDedupStore):
    """Dedup records in Redis through ``redis.asyncio`` (module docstring).

    :param client: a ``redis.asyncio.Redis`` (plain, Sentinel's ``master_for``, TLS, unix
        socket) or ``redis.asyncio.RedisCluster``; never closed by the store. With coalescing
        the store keeps one connection of its pool: a bounded pool needs
        ``max_connections >= 2``.
    :param key_prefix: the first segment of every record key.
    :param coalesce: share round trips among concurrent tasks (``Redis`` only); ``False``
        sends each call through the client.
    :param defer_marks_ms: with coalescing, how long a CONSUMED mark may wait for a later round
        trip to carry it (the sync store's, README "CONSUMED marks ride later round trips"; the
        loop's timer sends it when none comes, ``aclose()`` and reads send it at once); 0:
        every mark is written before the listener answers.
    """

    proves_writes = True

    def __init__(
        self,
        client: Any,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        coalesce: bool = True,
        defer_marks_ms: int = DEFAULT_DEFER_MS,
    ) -> None:
        if redis is None:
            raise MissingExtraError("redis", "redis")
        if not is_async_redis_client(client):
            raise DedupConfigError(
                f"expected redis.asyncio.Redis or RedisCluster, got {type(client)!r}"
            )
        if not isinstance(key_prefix, str) or not key_prefix:
            raise DedupConfigError(f"key_prefix must be a non-empty string; got {key_prefix!r}")
        self.client = client
        self.key_prefix = key_prefix
        self._keys = RecordKeys(key_prefix)
        self._cluster = isinstance(client, redis.asyncio.RedisCluster)
        self._shas = {kind: _sha(text) for kind, text in SCRIPTS.items()}
        if coalesce and not self._cluster:
            size = getattr(client.connection_pool, "max_connections", None)
            if isinstance(size, int) and size < MIN_POOL_SIZE:
                raise DedupConfigError(
                    f"the Redis client's connection pool allows max_connections={size}; the "
                    "dedup store keeps one of its connections for its round trips, so it needs "
                    f"at least {MIN_POOL_SIZE}, or AsyncRedisDedupStore(client, coalesce=False)"
                )
        self._init_deferred_marks(defer_marks_ms, coalesce and not self._cluster)
        self._coalescer: Optional[AsyncCoalescer] = (
            AsyncCoalescer(
                self._execute,
                defer_ms=defer_marks_ms,
                on_deferred_error=marks_failed_reporter(self.describe),
            )
            if coalesce and not self._cluster
            else None
        )
        self._conn: Any = None  # the coalesced round trips' connection, out of the pool
        self._set_nx_get = True  # until the server says it has no SET NX GET
        #: The kinds of claims, marks and releases: counted ones once count_lapses() was called.
        self._claim, self._mark, self._release = CLAIM, MARK, RELEASE

    def record_key(self, element: DedupElement) -> bytes:
        """The Redis key of ``element`` (the sync store's)."""
        return self._keys(element)

    def count_lapses(self) -> None:
        """The sync store's :meth:`~.store.RedisDedupStore.count_lapses`: from now on claims,
        marks and releases keep each record's lapsed-claim counter (:mod:`.records`)."""
        self._claim, self._mark, self._release = CLAIM_COUNTED, MARK_COUNTED, RELEASE_COUNTED

    # -- I/O hooks -----------------------------------------------------------------------

    async def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        element, owner = claim
        self._note_lease(lease_ms)
        key = self._keys(element)
        reply = await self._request(self._claim, lease_ms, [key], [CONSUMING + owner])
        return claim_result(reply[0])

    async def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        self._note_lease(lease_ms)
        keys, values = self._keys_and_values(claims, CONSUMING)
        reply = await self._request(self._claim, lease_ms, keys, values)
        return [claim_result(r) for r in reply]

    async def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        element, owner = claim
        await self._mark_or_defer(retention_ms, [self._keys(element)], [CONSUMED + owner])

    async def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        await self._mark_or_defer(retention_ms, *self._keys_and_values(claims, CONSUMED))

    async def _mark_or_defer(self, retention_ms: int, keys: List[bytes], values: List[str]) -> None:
        """Mark CONSUMED: deferred to a later round trip when allowed (the sync store's rule),
        else now."""
        coalescer = self._coalescer
        if coalescer is not None and self.marks_deferred:
            coalescer.defer(Request(self._mark, retention_ms, keys, values))
        else:
            await self._request(self._mark, retention_ms, keys, values)

    async def flush_marks(self) -> None:
        """Send the deferred CONSUMED marks now (a read of the store sees every mark made)."""
        if self._coalescer is not None:
            await self._coalescer.flush()

    async def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        element, owner = claim
        value = failed_value(owner, reason)
        await self._request(FAIL, retention_ms, [self._keys(element)], [value])

    async def do_release(self, claim: Claim) -> bool:
        element, owner = claim
        key = self._keys(element)
        reply = await self._request(self._release, 0, [key], [CONSUMING + owner])
        return int(reply[0]) == 1

    async def do_release_many(self, claims: Sequence[Claim]) -> int:
        reply = await self._request(self._release, 0, *self._keys_and_values(claims, CONSUMING))
        return sum(int(r) for r in reply)

    async def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        reply = await self._request(RENEW, lease_ms, *self._keys_and_values(claims, CONSUMING))
        return [int(r) == 1 for r in reply]

    def _keys_and_values(
        self, claims: Sequence[Claim], status: str
    ) -> Tuple[List[bytes], List[str]]:
        return [self._keys(e) for e, _ in claims], [status + o for _, o in claims]

    async def do_read(self, element: DedupElement) -> Optional[Record]:
        await self.flush_marks()
        key = self._keys(element)
        if self._cluster:  # two commands to the key's node: a cluster pipeline would share
            value, pttl = await asyncio.gather(self.client.get(key), self.client.pttl(key))
        else:  # its connections with the concurrent tasks' commands
            pipe = self.client.pipeline(transaction=False)
            pipe.get(key)
            pipe.pttl(key)
            value, pttl = await pipe.execute()
        return parse_record(value, pttl, element)

    async def do_check(self) -> None:
        await self.client.ping()

    # -- execution -----------------------------------------------------------------------

    async def _request(self, kind: str, millis: int, keys: List[bytes], values: List[str]) -> Any:
        request = Request(kind, millis, keys, values)
        if self._coalescer is not None:
            await self._coalescer.run(request)
        elif self._cluster:  # one command per key: the keys concurrently, a key's in order
            parts = transport.per_key(request)
            by_key: Dict[bytes, List[Request]] = {}
            for part in parts:
                by_key.setdefault(part.keys[0], []).append(part)
            await asyncio.gather(*(self._execute_each(same) for same in by_key.values()))
            transport.join_parts(request, parts)
        else:
            await self._execute([request])
        if request.error is not None:
            raise request.error
        return request.result

    async def _execute_each(self, parts: List[Request]) -> None:
        """Each request in its own round trip, one after the other (a key claimed twice in one
        batch: the first claim wins, as on a single node)."""
        for part in parts:
            await self._execute([part])

    async def _execute(self, batch: List[Request]) -> None:
        """One round trip for ``batch`` (rerun once after the server lost a script or turned
        out to lack ``SET NX GET``); each request's result or error set. Never raises but
        CancelledError."""
        try:
            for attempt in (1, 2):
                calls = plan_calls(batch, self._shas, self._set_nx_get)
                replies = await self._send([call.command for call in calls])
                errors = [r for r in replies if isinstance(r, redis.ResponseError)]
                if not errors:
                    break
                if attempt == 2 or not await self._recover(errors):
                    raise errors[0]
            for call, reply in zip(calls, replies, strict=True):
                call.deliver(reply)
        except Exception as exc:
            for request in batch:
                request.error = exc

    async def _recover(self, errors: List[Any]) -> bool:
        """The sync store's recovery: a lost script is loaded again; a server without
        ``SET ... NX GET`` gets the claim script."""
        if any(isinstance(e, redis.exceptions.NoScriptError) for e in errors):
            await self._load_scripts()
            return True
        if self._set_nx_get and any(_is_syntax_error(e) for e in errors):
            logger.info("Redis has no SET NX GET (< 7.0); claiming with a Lua script")
            self._set_nx_get = False
            return True
        return False

    async def _load_scripts(self) -> None:
        """Load the scripts into the server, as the sync store does: under the coalescer on the
        store's own connection, else through the client, one ``script_load`` each (a cluster
        sends it to every primary; in a cluster pipeline SCRIPT LOAD has no slot to go to)."""
        if self._coalescer is None:
            for text in SCRIPTS.values():
                await self.client.script_load(text)
            return
        replies = await self._send([("SCRIPT", "LOAD", text) for text in SCRIPTS.values()])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    async def _send(self, commands: List[Tuple[Any, ...]]) -> List[Any]:
        """Commands in one round trip: on the store's connection (coalescing), else through
        the client (its pool, its cluster routing). Error replies come back as values."""
        if self._coalescer is None:
            return await self._send_through_client(commands)
        packed = transport.pack_commands(commands)
        for attempt in (1, 2):
            conn = self._conn
            try:
                if conn is None:
                    conn = self._conn = await self.client.connection_pool.get_connection()
                await conn.send_packed_command(packed, check_health=False)
                replies: List[Any] = []
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
                return replies
            except BaseException as exc:  # lost, or cancelled between two replies
                await self._give_back()
                lost = isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError))
                lost = lost and not isinstance(exc, redis.AuthenticationError)
                if attempt == 2 or not lost or _pool_exhausted(exc):
                    raise
                logger.warning("Redis connection lost (%s); reconnecting", exc)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send_through_client(self, commands: List[Tuple[Any, ...]]) -> List[Any]:
        encoded = [(c[0], *(transport._encode_arg(a) for a in c[1:])) for c in commands]
        if len(encoded) == 1:
            try:
                return [await self.client.execute_command(*encoded[0], **transport.RAW)]
            except redis.ResponseError as exc:
                return [exc]
        pipe = self.client.pipeline(transaction=False)
        for command in encoded:
            pipe.execute_command(*command, **transport.RAW)
        return list(await pipe.execute(raise_on_error=False))

    async def _give_back(self) -> None:
        """Disconnect the store's connection and return it to the pool (no reply of ours may
        reach another user of it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.disconnect()
            finally:
                await self.client.connection_pool.release(conn)

    async def aclose(self) -> None:
        """Send the deferred marks, then give the store's connection back to the client's
        pool; the client stays open."""
        try:
            await self.flush_marks()
        finally:
            await self._give_back()

    # -- the boundary: as the sync store's ---------------------------------------------------

    def describe(self) -> str:
        if self._cluster:
            nodes = sorted(node.name for node in self.client.get_nodes())
            more = f" (+{len(nodes) - 3} nodes)" if len(nodes) > 3 else ""
            return f"Redis Cluster {', '.join(nodes[:3])}{more}"
        pool = self.client.connection_pool
        service = getattr(pool, "service_name", None)
        if service is not None:
            role = "master" if getattr(pool, "is_master", True) else "replica"
            return f"Redis Sentinel {role} {service}"
        kwargs = getattr(pool, "connection_kwargs", {})
        db = kwargs.get("db", 0)
        if kwargs.get("path"):
            return f"Redis unix:{kwargs['path']}/{db}"
        return f"Redis {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"

    def is_outage(self, exc: BaseException) -> bool:
        if isinstance(exc, redis.DataError) or _pool_exhausted(exc):
            return False
        if self.misconfiguration(exc) is not None:
            return False
        return isinstance(exc, (redis.RedisError, OSError))

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        where = self.describe().removeprefix("Redis ")
        pattern = to_text(key_pattern(self.key_prefix))
        return acl.refusal(exc, self._username(), pattern, where)

    def _username(self) -> str:
        if self._cluster:
            kwargs: Dict[str, Any] = getattr(self.client, "connection_kwargs", {}) or {}
        else:
            kwargs = getattr(self.client.connection_pool, "connection_kwargs", {})
        return str(kwargs.get("username") or "default")

    def wrap_error(self, exc: Exception) -> StoreError:
        if not _pool_exhausted(exc):
            return super().wrap_error(exc)
        return StorePoolExhaustedError(
            f"{self.describe()}: no free connection in the client's pool: "
            f"{type(exc).__name__}: {exc} (not an outage: consumed later; size the pool for "
            "the consumer's tasks)"
        )


def _pool_exhausted(exc: BaseException) -> bool:
    """The sync store's test, and ``redis.asyncio``'s ``BlockingConnectionPool`` that stayed
    empty for its timeout (a ``ConnectionError`` raised from an ``asyncio.TimeoutError``)."""
    if transport.pool_exhausted(exc):
        return True
    return isinstance(exc, redis.ConnectionError) and isinstance(
        exc.__cause__, asyncio.TimeoutError
    )


def _sha(script: str) -> str:
    """A Lua script's SHA1, as ``SCRIPT LOAD`` answers it (``EVALSHA`` names it)."""
    return hashlib.sha1(script.encode()).hexdigest()


__all__ = ["AsyncRedisDedupStore"]
