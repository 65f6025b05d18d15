"""Redis record store (``redis.Redis`` or ``redis.RedisCluster``); needs the ``[redis]`` extra.

Record key: ``{prefix}:{application}:{topic}:{tag}:{key}`` with every segment percent-escaped
(``%``, ``:``, ``{``, ``}``), so different elements never share a key and no key forms a
cluster hash tag by accident. Value: ``CONSUMING:<owner token>`` (TTL = the lease) or
``CONSUMED:<owner token>`` (TTL = the retention).

Round trips: a fresh message costs two (claim, ``SET``), a duplicate one (claim). A single
claim is ``SET key value NX PX lease GET`` on Redis >= 7.0 (else the claim script). The batch
methods cost one round trip per batch on ``redis.Redis``; on a cluster they run one command per
key, since a script may only touch one slot. On ``redis.Redis`` the requests of concurrent
threads are coalesced into shared round trips (see :mod:`rocketmq_dedup.stores.coalesce`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import DedupConfigError, MissingExtraError, StoreError
from rocketmq_dedup.message import DedupElement, escape_segment, to_text
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import CLAIMED, ClaimResult, DedupStore, parse_status
from rocketmq_dedup.stores.coalesce import Coalescer, Request

try:  # the [redis] extra
    import redis
    from redis.cluster import RedisCluster
except ImportError:  # pragma: no cover - exercised by the no-extras import test
    redis = None  # type: ignore[assignment]
    RedisCluster = None  # type: ignore[assignment,misc]

logger = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "MSGDEDUP"

# KEYS[i]: the record key of element i
# ARGV[1]: the lease, in milliseconds
# ARGV[i + 1]: the claim value of element i ("CONSUMING:<owner token>")
# Returns one entry per key: 1 when the claim is ours (the key was free, or already holds this
# very claim, so a retried call is harmless), else the record's current value. GET and SET run
# in one script, so a record that vanishes in between cannot let a second claimer win.
CLAIM_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  if current == ARGV[i + 1] then
    result[i] = 1
  elseif current then
    result[i] = current
  else
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
    result[i] = 1
  end
end
return result
"""

# KEYS[i]: the record key of element i
# ARGV[1]: the retention, in milliseconds
# ARGV[i + 1]: the value of element i ("CONSUMED:<owner token>")
# Sets every key to CONSUMED, whoever held it: a success is always recorded. Returns 1 per key.
MARK_CONSUMED_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
  result[i] = 1
end
return result
"""

# KEYS[i]: the record key of element i
# ARGV[1]: unused (keeps the argument layout of the other scripts)
# ARGV[i + 1]: the claim value element i was claimed with ("CONSUMING:<owner token>")
# Deletes each key still holding exactly that claim; returns 1 per deleted key, else 0. A newer
# owner's claim or any CONSUMED record is left alone.
RELEASE_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('DEL', key)
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""

# KEYS[i]: the record key of element i
# ARGV[1]: the lease, in milliseconds
# ARGV[i + 1]: the claim value element i was claimed with ("CONSUMING:<owner token>")
# Extends each key still holding exactly that claim to the lease; returns 1 per renewed key,
# else 0 (taken over, consumed or gone: never touched).
RENEW_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""

_CLAIM, _MARK, _RELEASE, _RENEW = "claim", "mark", "release", "renew"
_CONSUMING = "CONSUMING:"
_CONSUMED = "CONSUMED:"


def is_redis_client(client: object) -> bool:
    """True if ``client`` is a redis-py ``Redis`` or ``RedisCluster`` (without importing redis
    when it is not installed)."""
    if redis is None:
        return False
    return isinstance(client, (redis.Redis, RedisCluster))


class RedisDedupStore(DedupStore):
    """Dedup records in Redis.

    :param client: a ``redis.Redis`` or ``redis.RedisCluster``; ``decode_responses`` may be
        either. The store never closes it.
    :param key_prefix: the first segment of every record key.
    :param coalesce: combine the requests of concurrent threads into shared round trips
        (``redis.Redis`` only; a request that arrives alone is sent at once).
    """

    driver_errors = (redis.RedisError,) if redis is not None else ()

    def __init__(
        self, client: Any, key_prefix: str = DEFAULT_KEY_PREFIX, coalesce: bool = True
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
        self._prefix = escape_segment(key_prefix) + ":"
        self._heads: Dict[Tuple[str, str, str], bytes] = {}
        self._cluster = RedisCluster is not None and isinstance(client, RedisCluster)
        self._scripts = {
            _CLAIM: client.register_script(CLAIM_SCRIPT),
            _MARK: client.register_script(MARK_CONSUMED_SCRIPT),
            _RELEASE: client.register_script(RELEASE_SCRIPT),
            _RENEW: client.register_script(RENEW_SCRIPT),
        }
        self._coalescer = Coalescer(self._execute) if coalesce and not self._cluster else None
        self._set_nx_get = True  # until the server says it has no SET NX GET
        self._conn: Any = None  # the store's own connection, used under the coalescer
        self._conn_pid = 0

    def record_key(self, element: DedupElement) -> bytes:
        """The Redis key of ``element``."""
        app, topic, tag, key = element
        head = self._heads.get((app, topic, tag))
        if head is None:
            if len(self._heads) > 1024:  # a bounded cache of the escaped key heads
                self._heads.clear()
            head = self._heads[app, topic, tag] = (
                f"{self._prefix}{escape_segment(app)}:{escape_segment(topic)}:"
                f"{escape_segment(tag)}:"
            ).encode("utf-8", "surrogateescape")
        return head + escape_segment(key).encode("utf-8", "surrogateescape")

    # -- I/O hooks -----------------------------------------------------------------------

    def do_claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult:
        reply = self._request(_CLAIM, lease_ms, [self.record_key(element)], [_CONSUMING + owner])
        return _claim_result(reply[0])

    def do_claim_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[ClaimResult]:
        keys = [self.record_key(e) for e in elements]
        reply = self._request(_CLAIM, lease_ms, keys, [_CONSUMING + o for o in owners])
        return [_claim_result(r) for r in reply]

    def do_mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None:
        self._request(_MARK, retention_ms, [self.record_key(element)], [_CONSUMED + owner])

    def do_mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None:
        keys = [self.record_key(e) for e in elements]
        self._request(_MARK, retention_ms, keys, [_CONSUMED + o for o in owners])

    def do_release(self, element: DedupElement, owner: str) -> bool:
        reply = self._request(_RELEASE, 0, [self.record_key(element)], [_CONSUMING + owner])
        return int(reply[0]) == 1

    def do_release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int:
        keys = [self.record_key(e) for e in elements]
        reply = self._request(_RELEASE, 0, keys, [_CONSUMING + o for o in owners])
        return sum(int(r) for r in reply)

    def do_renew_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[bool]:
        keys = [self.record_key(e) for e in elements]
        reply = self._request(_RENEW, lease_ms, keys, [_CONSUMING + o for o in owners])
        return [int(r) == 1 for r in reply]

    def do_get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        return parse_status(to_text(self.client.get(self.record_key(element))))

    # -- execution -----------------------------------------------------------------------

    def _request(self, kind: str, millis: int, keys: List[bytes], values: List[str]) -> Any:
        """Run one request; return its per-key replies. With coalescing, concurrent threads'
        requests share round trips on the store's own connection."""
        request = Request(kind, millis, keys, values)
        if self._coalescer is not None:
            self._coalescer.run(request)
        elif self._cluster:  # a script may only touch one slot: one command per key
            parts = [Request(kind, millis, [k], [v]) for k, v in zip(keys, values)]
            for part in parts:
                self._execute([part])
            request.error = next((p.error for p in parts if p.error is not None), None)
            request.result = [p.result[0] for p in parts] if request.error is None else None
        else:
            self._execute([request])
        if request.error is not None:
            raise StoreError(
                f"RedisDedupStore: {type(request.error).__name__}: {request.error}"
            ) from request.error
        return request.result

    def _execute(self, batch: List[Request]) -> None:
        """Run a batch of requests in one round trip; set each one's result or error. Every
        command is safe to run twice, so a batch is rerun once after the server lost its
        scripts or turned out to lack ``SET NX GET``. Never raises."""
        try:
            for attempt in (1, 2):
                calls = self._calls(batch)
                replies = self._send([call.command for call in calls])
                errors = [r for r in replies if isinstance(r, redis.ResponseError)]
                if not errors:
                    break
                if attempt == 2 or not self._recover(errors):
                    raise errors[0]
            for call, reply in zip(calls, replies):
                call.deliver(reply)
        except Exception as exc:
            for request in batch:
                request.error = exc

    def _calls(self, batch: List[Request]) -> List[_Call]:
        """One command per (kind, millis) group: a plain SET for a lone single-key claim or
        mark, else one script call over all the group's keys."""
        groups: Dict[Tuple[str, int], List[Request]] = {}
        for request in batch:
            groups.setdefault((request.kind, request.millis), []).append(request)
        calls = []
        for (kind, millis), members in groups.items():
            if len(members) == 1 and len(members[0].keys) == 1:
                key, value = members[0].keys[0], members[0].values[0]
                if kind == _MARK:
                    calls.append(_Call(("SET", key, value, "PX", millis), members, _set_reply))
                    continue
                if kind == _CLAIM and self._set_nx_get:
                    command = ("SET", key, value, "NX", "PX", millis, "GET")
                    calls.append(_Call(command, members, _set_get_reply(value)))
                    continue
            keys = [k for r in members for k in r.keys]
            values = [v for r in members for v in r.values]
            sha = self._scripts[kind].sha
            calls.append(_Call(("EVALSHA", sha, len(keys), *keys, millis, *values), members))
        return calls

    def _recover(self, errors: List[redis.ResponseError]) -> bool:
        """Fix what an error reply says is missing; False if it is not recoverable."""
        text = " ".join(str(e) for e in errors)
        if "NOSCRIPT" in text or any(isinstance(e, redis.exceptions.NoScriptError) for e in errors):
            for script in self._scripts.values():
                script.sha = self.client.script_load(script.script)
            return True
        if self._set_nx_get and "syntax" in text.lower():
            logger.info("Redis has no SET NX GET (< 7.0); claiming with a Lua script")
            self._set_nx_get = False
            return True
        return False

    def _send(self, commands: List[Tuple[Any, ...]]) -> List[Any]:
        """Send commands in one round trip; error replies come back as ResponseError values.

        Under the coalescer only one thread at a time sends, so the store uses a connection of
        its own, outside the client's pool; otherwise it goes through the client."""
        if self._coalescer is None:
            if len(commands) == 1:
                try:
                    return [self.client.execute_command(*commands[0], **_RAW)]
                except redis.ResponseError as exc:
                    return [exc]
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command, **_RAW)
            return list(pipe.execute(raise_on_error=False))
        for attempt in (1, 2):
            conn = self._own_connection()
            try:
                conn.send_packed_command([pack_commands(commands)])
                replies: List[Any] = []
                for _ in commands:
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
                return replies
            except BaseException as exc:  # lost, or interrupted between two replies: never
                conn.disconnect()  # let the next batch read this batch's unread replies
                self._conn = None
                lost = isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError))
                if attempt == 2 or not lost:
                    raise
                logger.warning("Redis connection lost; reconnecting")
        raise AssertionError("unreachable")  # pragma: no cover

    def _own_connection(self) -> Any:
        if self._conn is None or self._conn_pid != os.getpid():
            pool = self.client.connection_pool
            self._conn = pool.connection_class(**pool.connection_kwargs)
            self._conn_pid = os.getpid()
        return self._conn

    def close(self) -> None:
        """Close the store's own connection (never the user's client)."""
        if self._conn is not None and self._conn_pid == os.getpid():
            self._conn.disconnect()
        self._conn = None


def pack_commands(commands: List[Tuple[Any, ...]]) -> bytes:
    """RESP-encode commands whose arguments are bytes, str or int (a lean version of
    redis-py's packer for the store's own hot path)."""
    out = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            if isinstance(arg, str):
                arg = arg.encode("utf-8", "surrogateescape")
            elif isinstance(arg, int):
                arg = b"%d" % arg
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


_RAW = {"get": True}  # response-callback options: keep SET ... GET replies as they are


class _Call:
    """One command of a round trip and how its reply is split among its requests."""

    __slots__ = ("command", "convert", "members")

    def __init__(
        self,
        command: Tuple[Any, ...],
        members: List[Request],
        convert: Optional[Callable[[Any], List[Any]]] = None,
    ) -> None:
        self.command = command
        self.members = members
        self.convert = convert

    def deliver(self, reply: Any) -> None:
        replies = self.convert(reply) if self.convert is not None else reply
        offset = 0
        for request in self.members:
            n = len(request.keys)
            request.result = replies[offset : offset + n]
            offset += n


def _set_reply(reply: Any) -> List[Any]:
    """A plain SET answers OK: its one key was written."""
    return [1]


def _set_get_reply(value: str) -> Callable[[Any], List[Any]]:
    """SET NX GET answers nil when it set the key; our own value means a repeated claim."""

    def convert(reply: Any) -> List[Any]:
        return [1 if reply is None or to_text(reply) == value else reply]

    return convert


def _claim_result(reply: Any) -> ClaimResult:
    if reply == 1:
        return CLAIMED
    return ClaimResult(False, parse_status(to_text(reply)))
