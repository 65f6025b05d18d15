"""The Redis record store (``redis.Redis`` or ``redis.RedisCluster``); needs the ``[redis]``
extra. Keys, values and scripts: :mod:`.records`; connections: :mod:`.transport`.

Round trips: a fresh message costs two (claim, ``SET``), a duplicate one (claim). A single
claim is ``SET key value NX PX lease GET`` on Redis >= 7.0 (else the claim script). The batch
methods cost one round trip per batch on ``redis.Redis``; on a cluster they run one command per
key, since a script may only touch one slot. On ``redis.Redis`` the requests of concurrent
threads are coalesced into shared round trips, and a CONSUMED mark may ride a later one
(:mod:`rocketmq_dedup.stores.coalesce`).

Connections of the client's pool (a bounded pool must be at least :data:`MIN_POOL_SIZE`):

* ``redis.Redis`` with coalescing (the default): the store keeps **one** connection checked out
  for all its claims, marks, releases and renewals, from its first request until ``close()``
  (after a failed round trip it gives it back and takes another at the next request; a store
  dropped without ``close()`` gives it back at the next store construction or connection
  checkout in the process). It never holds a second one for them: a script the server lost
  is loaded again on that connection. ``check()`` (PING), ``read()`` and ``get_status()``, and
  the operators' commands (``delete``, ``stats``, ``diagnose``) go through the client and take
  one more connection each, per calling thread, for one command or pipeline. So a bounded
  pool needs ``max_connections >= 2`` (one kept by the store, one for everything else, plus
  what the application uses the same client for at once); a smaller one is refused at
  construction (:class:`DedupConfigError`).
* ``coalesce=False``, and ``redis.RedisCluster``: no connection is kept; each store call takes
  one connection (of the key's node) per calling thread for one round trip (a cluster batch:
  one command per key, one after the other). A pool of one is enough.

Errors: a refusal a person must fix (:mod:`.acl`: an ACL denial, ``NOPERM``; a read-only
replica, ``READONLY``; refused credentials) is a
:class:`~rocketmq_dedup.errors.StoreMisconfiguredError`, never an outage. An outage
(:meth:`RedisDedupStore.is_outage`) is any other redis-py ``RedisError`` but ``DataError``
(connection lost or refused, timeouts, and the other error replies of the server, e.g. ``OOM``,
``BUSY``, ``WRONGTYPE``: the server could not do the write) and any ``OSError`` from a socket.
A pool with no free connection (``MaxConnectionsError``, or a
``BlockingConnectionPool`` that stayed empty for its ``timeout``) is not an outage: no server
was asked. It becomes :class:`StorePoolExhaustedError` (a ``StoreError``): the messages are
consumed later, never run without dedup. ``DataError`` (redis-py refused an argument before
sending it) and anything else raised inside the store (a ``TypeError``...) is a defect: a plain
``StoreError``.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import (
    DedupConfigError,
    MissingExtraError,
    StoreError,
    StorePoolExhaustedError,
)
from rocketmq_dedup.message import DedupElement, to_text
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import Claim, ClaimResult, Record, parse_status
from rocketmq_dedup.stores.coalesce import (
    DEFAULT_DEFER_MS,
    Coalescer,
    DeferredMarks,
    Request,
    Waker,
    default_waker,
    marks_failed_reporter,
)
from rocketmq_dedup.stores.operations import (
    Diagnosis,
    OperatedStore,
    StoreStats,
    records_stats,
    round_trip,
)
from rocketmq_dedup.stores.redis import acl, transport
from rocketmq_dedup.stores.redis.records import (
    CLAIM,
    CLAIM_COUNTED,
    CONSUMED,
    CONSUMING,
    DEFAULT_KEY_PREFIX,
    DELETE_SCRIPT,
    FAIL,
    MARK,
    MARK_COUNTED,
    RELEASE,
    RELEASE_COUNTED,
    RENEW,
    SCRIPTS,
    RecordKeys,
    app_key_pattern,
    claim_result,
    failed_value,
    key_pattern,
    parse_key,
    parse_record,
    plan_calls,
)

try:  # the [redis] extra
    import redis
    from redis.cluster import RedisCluster
    from redis.sentinel import SentinelConnectionPool
except ImportError:  # pragma: no cover - exercised by the no-extras import test
    redis = None  # type: ignore[assignment]
    RedisCluster = None  # type: ignore[assignment,misc]
    SentinelConnectionPool = None  # type: ignore[assignment,misc]

logger = logging.getLogger(__name__)

#: The smallest bounded pool (``max_connections``) a coalescing store accepts: the connection
#: it keeps, and one for the client's other commands (its own PING and GET among them).
MIN_POOL_SIZE = 2


def is_redis_client(client: object) -> bool:
    """True if ``client`` is a redis-py ``Redis`` or ``RedisCluster`` (without importing redis
    when it is not installed)."""
    if redis is None:
        return False
    return isinstance(client, (redis.Redis, RedisCluster))


class RedisDedupStore(DeferredMarks, OperatedStore):
    """Dedup records in Redis.

    :param client: a ``redis.Redis`` (plain, Sentinel, TLS, unix socket) or a
        ``redis.RedisCluster``; ``decode_responses`` may be either. The store never closes it;
        it keeps one connection of the client's pool checked out for its coalesced round trips
        (see the module docs: a bounded pool needs ``max_connections >= 2``).
    :param key_prefix: the first segment of every record key.
    :param coalesce: combine the requests of concurrent threads into shared round trips
        (``redis.Redis`` only; a request that arrives alone is sent at once). ``False`` keeps
        no connection: each call takes one from the pool for one round trip.
    :param waker: how a thread waiting for a coalesced round trip is woken (see
        :func:`~rocketmq_dedup.stores.coalesce.default_waker`).
    :param defer_marks_ms: with coalescing, how long a CONSUMED mark may wait for a later round
        trip to carry it (the listener returns without waiting for it; see the module docs);
        ``0``: every mark is written before the listener returns.
    """

    #: The start-up check claims and releases probe records (SET NX PX GET, the scripts).
    proves_writes = True

    def __init__(
        self,
        client: Any,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        coalesce: bool = True,
        waker: Callable[[], Waker] = default_waker,
        defer_marks_ms: int = DEFAULT_DEFER_MS,
    ) -> None:
        if redis is None:
            raise MissingExtraError("redis", "redis")
        if not is_redis_client(client):
            raise DedupConfigError(
                f"expected redis.Redis or redis.RedisCluster, got {type(client)!r}"
            )
        if not isinstance(key_prefix, str) or not key_prefix:
            raise DedupConfigError(f"key_prefix must be a non-empty string; got {key_prefix!r}")
        self.client = client
        self.key_prefix = key_prefix
        self._keys = RecordKeys(key_prefix)
        self._cluster = isinstance(client, RedisCluster)
        self._scripts = {kind: client.register_script(text) for kind, text in SCRIPTS.items()}
        self._delete_script = client.register_script(DELETE_SCRIPT)  # operators only
        self._init_deferred_marks(defer_marks_ms, coalesce and not self._cluster)
        if coalesce and not self._cluster:
            _check_pool_size(client.connection_pool)
        self._coalescer = (
            Coalescer(
                self._execute,
                waker,
                defer_ms=defer_marks_ms,
                on_deferred_error=marks_failed_reporter(self.describe),
            )
            if coalesce and not self._cluster
            else None
        )
        self._set_nx_get = True  # until the server says it has no SET NX GET
        #: The kinds of claims, marks and releases: counted ones once count_lapses() was called.
        self._claim, self._mark, self._release = CLAIM, MARK, RELEASE
        # The connection of the coalesced round trips, checked out of the client's pool. The
        # finalizer gives it back when the store is dropped without close(); it references the
        # pinned connection only, never the store.
        pool = None if self._cluster else client.connection_pool
        self._pinned = transport.PinnedConnection(pool)
        self._finalizer = weakref.finalize(self, self._pinned.orphan)
        self._finalizer.atexit = False  # sockets close with the process anyway
        transport.release_orphans()

    @property
    def coalescer(self) -> Optional[Coalescer]:
        """What combines concurrent threads' requests into shared round trips (None on a
        cluster, or with ``coalesce=False``)."""
        return self._coalescer

    def record_key(self, element: DedupElement) -> bytes:
        """The Redis key of ``element``."""
        return self._keys(element)

    def count_lapses(self) -> None:
        """From now on, claims, marks and releases keep each record's lapsed-claim counter
        (:mod:`.records`): a claim is a script (not ``SET NX PX GET``) that also writes the
        counter, and a mark or release deletes it, in the same round trip."""
        self._claim, self._mark, self._release = CLAIM_COUNTED, MARK_COUNTED, RELEASE_COUNTED

    # -- I/O hooks -----------------------------------------------------------------------

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        element, owner = claim
        self._note_lease(lease_ms)
        key = self.record_key(element)
        reply = self._request(self._claim, lease_ms, [key], [CONSUMING + owner])
        return claim_result(reply[0])

    def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        self._note_lease(lease_ms)
        reply = self._request(self._claim, lease_ms, *self._keys_and_values(claims, CONSUMING))
        return [claim_result(r) for r in reply]

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        element, owner = claim
        self._mark_or_defer(retention_ms, [self.record_key(element)], [CONSUMED + owner])

    def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        self._mark_or_defer(retention_ms, *self._keys_and_values(claims, CONSUMED))

    def _mark_or_defer(self, retention_ms: int, keys: List[bytes], values: List[str]) -> None:
        """Mark CONSUMED: deferred to a later round trip when allowed, else now."""
        coalescer = self._coalescer
        if coalescer is not None and self.marks_deferred:
            coalescer.defer(Request(self._mark, retention_ms, keys, values))
        else:
            self._request(self._mark, retention_ms, keys, values)

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        """Coalesced with the other threads' requests, never deferred: written before the
        listener answers."""
        element, owner = claim
        value = failed_value(owner, reason)
        self._request(FAIL, retention_ms, [self.record_key(element)], [value])

    def do_release(self, claim: Claim) -> bool:
        element, owner = claim
        key = self.record_key(element)
        reply = self._request(self._release, 0, [key], [CONSUMING + owner])
        return int(reply[0]) == 1

    def do_release_many(self, claims: Sequence[Claim]) -> int:
        reply = self._request(self._release, 0, *self._keys_and_values(claims, CONSUMING))
        return sum(int(r) for r in reply)

    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        reply = self._request(RENEW, lease_ms, *self._keys_and_values(claims, CONSUMING))
        return [int(r) == 1 for r in reply]

    def _keys_and_values(
        self, claims: Sequence[Claim], status: str
    ) -> Tuple[List[bytes], List[str]]:
        """The record keys of ``claims`` and their values with ``status`` (``CONSUMING:`` or
        ``CONSUMED:``) before each owner token."""
        return [self.record_key(e) for e, _ in claims], [status + o for _, o in claims]

    def _flush_marks(self) -> None:
        """Send the deferred CONSUMED marks (a read of the store sees every mark made)."""
        if self._coalescer is not None:
            self._coalescer.flush()

    def do_read(self, element: DedupElement) -> Optional[Record]:
        self._flush_marks()
        key = self.record_key(element)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        value, pttl = pipe.execute()
        return parse_record(value, pttl, element)

    def do_check(self) -> None:
        """PING through the client (every primary of a cluster): the pool the store's own
        connection comes from reaches the server and authenticates."""
        self.client.ping()

    def do_risks(self) -> List[str]:
        """A ``maxmemory-policy`` that evicts dedup records (:func:`.acl.evicts_records`)."""
        evicting = [p for p in self.eviction_policies() or () if acl.evicts_records(p)]
        if not evicting:
            return []
        return [
            f"maxmemory-policy {', '.join(evicting)} evicts keys under memory pressure, dedup "
            "records among them (each has a TTL): a duplicate whose record was evicted runs its "
            "handler again; set maxmemory-policy noeviction (or give the records a Redis of "
            "their own)"
        ]

    def eviction_policies(self) -> Optional[List[str]]:
        """The server's ``maxmemory-policy`` (each primary's, on a cluster), by ``CONFIG GET``,
        else ``INFO memory`` (managed services rename CONFIG); None when this user may run
        neither (logged at INFO)."""
        nodes = self.client.get_primaries() if self._cluster else [None]
        policies: List[str] = []
        for node in nodes:
            options = {} if node is None else {"target_nodes": node}
            try:
                try:
                    policy = self.client.config_get("maxmemory-policy", **options)
                    policy = policy["maxmemory-policy"]
                except redis.ResponseError:  # CONFIG denied (ACL) or renamed
                    policy = self.client.info("memory", **options)["maxmemory_policy"]
            except (redis.ResponseError, KeyError) as exc:
                logger.info(
                    "%s: could not read maxmemory-policy (%s: the user may run neither CONFIG "
                    "GET nor INFO); dedup records are safe from eviction only under noeviction",
                    self.describe(),
                    exc,
                )
                return None
            if str(policy) not in policies:
                policies.append(str(policy))
        return policies

    # -- operator hooks (the CLI): through the client, never on the hot path ---------------

    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]:
        self._flush_marks()
        key = self.record_key(element)
        deleted = self._delete_script(keys=[key], args=["1" if force else "0"])
        return parse_status(to_text(deleted)) if deleted else None

    def do_stats(self, application: str, limit: int) -> StoreStats:
        """One SCAN over the application's keys (every primary of a cluster), then their
        values and TTLs, 500 keys a round trip."""
        self._flush_marks()
        pattern = app_key_pattern(self.key_prefix, application)
        keys = list(self.client.scan_iter(match=pattern, count=1000))
        records: List[Record] = []
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            pipe = self.client.pipeline(transaction=False)
            for key in chunk:
                pipe.get(key)
                pipe.pttl(key)
            replies = pipe.execute()
            for i, key in enumerate(chunk):
                element = parse_key(key if isinstance(key, bytes) else key.encode())
                record = (
                    parse_record(replies[2 * i], replies[2 * i + 1], element) if element else None
                )
                if record is not None:
                    records.append(record)
        return records_stats(records, limit)

    def do_diagnose(self) -> List[Diagnosis]:
        """The server version, the claim path it allows, the scripts, the round-trip time,
        the eviction policy. What this user may not run is said (INFO and CONFIG GET are
        optional; SCRIPT LOAD is not)."""
        checks = self._version_diagnoses()
        try:
            for script in self._scripts.values():
                script.sha = self.client.script_load(script.script)
            checks.append(Diagnosis("scripts", True, f"{len(self._scripts)} Lua scripts loaded"))
        except redis.exceptions.NoPermissionError as exc:
            checks.append(Diagnosis("scripts", False, self.misconfiguration(exc) or str(exc)))
        times = []
        for _ in range(5):
            begin = time.perf_counter()
            self.client.ping()
            times.append(time.perf_counter() - begin)
        checks.append(Diagnosis("latency", True, round_trip(sorted(times)[2]) + " (median of 5)"))
        policies = self.eviction_policies()
        if policies is None:
            detail = "maxmemory-policy unknown (the user may run neither CONFIG GET nor INFO)"
            checks.append(Diagnosis("eviction", True, detail))
        elif any(acl.evicts_records(p) for p in policies):
            checks.append(Diagnosis("eviction", True, self.do_risks()[0], warning=True))
        else:
            checks.append(Diagnosis("eviction", True, f"maxmemory-policy {', '.join(policies)}"))
        return checks

    def _version_diagnoses(self) -> List[Diagnosis]:
        """The server version and the claim path it allows (unknown without INFO)."""
        try:
            info = self.client.info("server")
        except redis.exceptions.NoPermissionError:
            return [
                Diagnosis("server", True, "version unknown (the user may not run INFO)"),
                Diagnosis("claim", True, "SET NX PX GET on Redis >= 7.0, else a Lua script"),
            ]
        if self._cluster:  # {node name: info} on a cluster: the lowest version counts
            infos = [v for v in info.values() if isinstance(v, dict)] or [info]
        else:
            infos = [info]
        versions = sorted({str(i.get("redis_version", "?")) for i in infos})
        checks = [Diagnosis("server", True, f"version {', '.join(versions)}")]
        if min(_version(v) for v in versions) >= (7, 0):
            checks.append(Diagnosis("claim", True, "SET NX PX GET (Redis >= 7.0)"))
        else:
            checks.append(Diagnosis("claim", True, "Lua claim script (Redis < 7.0)"))
        return checks

    def describe(self) -> str:
        """``Redis host:port/db``, ``Redis unix:/path/db``, ``Redis Sentinel master <name>`` or
        ``Redis Cluster host:port, ...``; never credentials."""
        if self._cluster:
            nodes = sorted(node.name for node in self.client.get_nodes())
            more = f" (+{len(nodes) - 3} nodes)" if len(nodes) > 3 else ""
            return f"Redis Cluster {', '.join(nodes[:3])}{more}"
        pool = self.client.connection_pool
        if SentinelConnectionPool is not None and isinstance(pool, SentinelConnectionPool):
            role = "master" if pool.is_master else "replica"
            return f"Redis Sentinel {role} {pool.service_name}"
        kwargs = getattr(pool, "connection_kwargs", {})  # any pool-like object the client has
        db = kwargs.get("db", 0)
        if kwargs.get("path"):
            return f"Redis unix:{kwargs['path']}/{db}"
        connection_class = getattr(pool, "connection_class", None)
        tls = ""
        if isinstance(connection_class, type) and issubclass(connection_class, redis.SSLConnection):
            tls = " (TLS)"
        return f"Redis {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}{tls}"

    def is_outage(self, exc: BaseException) -> bool:
        """Any ``RedisError`` but ``DataError``, an exhausted pool and a refusal a person must
        fix, and socket errors (see the module docs)."""
        if redis is None:
            return False
        if isinstance(exc, redis.DataError):  # refused by redis-py before sending: a defect
            return False
        if transport.pool_exhausted(exc):  # no server was asked
            return False
        if self.misconfiguration(exc) is not None:  # will not pass by itself
            return False
        return isinstance(exc, (redis.RedisError, OSError))

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        """The ACL rules to add, the primary to point at, the credentials to fix, for a
        refusal (:func:`.acl.refusal`)."""
        where = self.describe().removeprefix("Redis ")
        return acl.refusal(exc, self._username(), self.acl_key_pattern, where)

    @property
    def acl_key_pattern(self) -> str:
        """The ACL key pattern of every record of this store: ``<key_prefix>:*``."""
        return to_text(key_pattern(self.key_prefix))

    def _username(self) -> str:
        """The user the client authenticates as (``default`` when it names none)."""
        if self._cluster:
            kwargs = getattr(getattr(self.client, "nodes_manager", None), "connection_kwargs", {})
        else:
            kwargs = getattr(self.client.connection_pool, "connection_kwargs", {})
        return str(kwargs.get("username") or "default")

    def wrap_error(self, exc: Exception) -> StoreError:
        """An exhausted pool as :class:`StorePoolExhaustedError`; the rest as any store."""
        if not transport.pool_exhausted(exc):
            return super().wrap_error(exc)
        pool = self.client.connection_pool if not self._cluster else None
        size = getattr(pool, "max_connections", None)
        where = "the client's pool" + ("" if size is None else f" (max_connections={size})")
        return StorePoolExhaustedError(
            f"{self.describe()}: no free connection in {where}: {type(exc).__name__}: {exc} "
            "(not an outage: consumed later; size the pool for the consumer's threads)"
        )

    def close(self) -> None:
        """Send the deferred CONSUMED marks; give the store's connection back to the client's
        pool (disconnected); never closes the user's client. The store stays usable: it takes
        a connection again if needed."""
        self._flush_marks()
        self._pinned.release()
        transport.release_orphans()

    # -- execution -----------------------------------------------------------------------

    def _request(self, kind: str, millis: int, keys: List[bytes], values: List[str]) -> Any:
        """Run one request; return its per-key replies. With coalescing, concurrent threads'
        requests share round trips on the store's own connection."""
        request = Request(kind, millis, keys, values)
        if self._coalescer is not None:
            self._coalescer.run(request)
        elif self._cluster:  # a script may only touch one slot: one command per key
            parts = transport.per_key(request)
            for part in parts:
                self._execute([part])
            transport.join_parts(request, parts)
        else:
            self._execute([request])
        if request.error is not None:
            raise request.error  # the original: DedupStore._call wraps it, once
        return request.result

    def _execute(self, batch: List[Request]) -> None:
        """Run a batch of requests in one round trip; set each one's result or error. Every
        command is safe to run twice, so a batch is rerun once after the server lost its
        scripts or turned out to lack ``SET NX GET``. Never raises (short of a BaseException):
        the original error goes to every request of the batch, each caller re-raises it and
        :meth:`DedupStore._call` tells an outage from a defect."""
        try:
            for attempt in (1, 2):
                shas = {kind: script.sha for kind, script in self._scripts.items()}
                calls = plan_calls(batch, shas, self._set_nx_get)
                replies = self._send([call.command for call in calls])
                errors = [r for r in replies if isinstance(r, redis.ResponseError)]
                if not errors:
                    break
                if attempt == 2 or not self._recover(errors):
                    raise errors[0]
            for call, reply in zip(calls, replies, strict=True):
                call.deliver(reply)
        except Exception as exc:
            for request in batch:
                request.error = exc

    def _recover(self, errors: List[redis.ResponseError]) -> bool:
        """Fix what an error reply says is missing; False if it is not recoverable. A lost
        script is redis-py's ``NoScriptError``. A server without ``SET ... NX GET`` (Redis <
        7.0) answers with the generic ``ERR syntax error``, which redis-py gives as a plain
        ``ResponseError``: its text is all there is to tell it by, so it is matched here, and
        only while the store sends ``SET NX GET``."""
        if any(isinstance(e, redis.exceptions.NoScriptError) for e in errors):
            self._load_scripts()
            return True
        if self._set_nx_get and any(_is_syntax_error(e) for e in errors):
            logger.info("Redis has no SET NX GET (< 7.0); claiming with a Lua script")
            self._set_nx_get = False
            return True
        return False

    def _load_scripts(self) -> None:
        """Load the scripts into the server: under the coalescer on the store's own connection
        (the store never holds a second connection of the pool), else through the client."""
        scripts = list(self._scripts.values())
        if self._coalescer is None:
            for script in scripts:
                script.sha = self.client.script_load(script.script)
            return
        replies = self._pinned.round_trip([("SCRIPT", "LOAD", s.script) for s in scripts])
        for script, reply in zip(scripts, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            script.sha = to_text(reply)

    def _send(self, commands: List[Tuple[Any, ...]]) -> List[Any]:
        """Send commands in one round trip: under the coalescer (one sender at a time) on the
        store's own connection, else through the client."""
        if self._coalescer is None:
            return transport.send_through_client(self.client, commands)
        return self._pinned.round_trip(commands)


def _check_pool_size(pool: Any) -> None:
    """Refuse a bounded pool smaller than :data:`MIN_POOL_SIZE` (a coalescing store keeps one
    of its connections for as long as it is used)."""
    size = getattr(pool, "max_connections", None)
    if isinstance(size, int) and size < MIN_POOL_SIZE:
        raise DedupConfigError(
            f"the Redis client's connection pool allows max_connections={size}; the dedup "
            "store keeps one of its connections for its round trips for as long as it is used "
            "and sends PING and GET through the client, so it needs a pool of at least "
            f"{MIN_POOL_SIZE} (plus what the application uses the client for at once), or "
            "RedisDedupStore(client, coalesce=False), which keeps none"
        )


def _is_syntax_error(error: redis.ResponseError) -> bool:
    """The server's ``ERR syntax error`` (redis-py strips the ``ERR``; a server's casing
    varies)."""
    return str(error).lower().startswith(("syntax error", "err syntax error"))


def _version(text: str) -> Tuple[int, ...]:
    """``"7.0.15"`` as ``(7, 0, 15)``; unreadable parts count as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in text.split("."))
