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
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
# Sets every key to CONSUMED, whoever held it: a success is always recorded.
MARK_CONSUMED_SCRIPT = """
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
end
return #KEYS
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
            raise TypeError(f"expected redis.Redis or redis.RedisCluster, got {type(client)!r}")
        if not isinstance(key_prefix, str) or not key_prefix:
            raise DedupConfigError(f"key_prefix must be a non-empty string; got {key_prefix!r}")
        self.client = client
        self.key_prefix = key_prefix
        self._prefix = escape_segment(key_prefix) + ":"
        self._cluster = RedisCluster is not None and isinstance(client, RedisCluster)
        self._scripts = {
            _CLAIM: client.register_script(CLAIM_SCRIPT),
            _MARK: client.register_script(MARK_CONSUMED_SCRIPT),
            _RELEASE: client.register_script(RELEASE_SCRIPT),
            _RENEW: client.register_script(RENEW_SCRIPT),
        }
        self._coalescer = Coalescer(self._execute) if coalesce and not self._cluster else None
        self._set_nx_get = True  # until the server says it has no SET NX GET

    def record_key(self, element: DedupElement) -> bytes:
        """The Redis key of ``element``."""
        app, topic, tag, key = element
        text = (
            f"{self._prefix}{escape_segment(app)}:{escape_segment(topic)}:"
            f"{escape_segment(tag)}:{escape_segment(key)}"
        )
        return text.encode("utf-8", "surrogateescape")

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
        """Run one script request (through the coalescer when enabled); returns its
        per-key replies."""
        if self._coalescer is None:
            if self._cluster and len(keys) > 1:  # a script may only touch one slot
                return [self._run_one(kind, millis, [k], [v])[0] for k, v in zip(keys, values)]
            return self._run_one(kind, millis, keys, values)
        request = self._coalescer.run(Request(kind, millis, keys, values))
        if request.error is not None:
            raise StoreError(
                f"RedisDedupStore: {type(request.error).__name__}: {request.error}"
            ) from request.error
        return request.result

    def _run_one(self, kind: str, millis: int, keys: List[bytes], values: List[str]) -> Any:
        """One request in one round trip; single keys use plain commands where they can."""
        if len(keys) == 1:
            if kind == _MARK:  # a plain SET is the cheapest write
                self.client.execute_command("SET", keys[0], values[0], "PX", millis)
                return [1]
            if kind == _CLAIM and self._set_nx_get:
                return [self._claim_with_set(keys[0], values[0], millis)]
        return self._evalsha(self._scripts[kind], keys, [millis, *values])

    def _claim_with_set(self, key: bytes, value: str, millis: int) -> Any:
        """``SET key value NX PX lease GET`` (Redis >= 7.0): the claim script's semantics in
        one plain command. Falls back to the script for good on older servers."""
        try:
            current = self.client.execute_command(
                "SET", key, value, "NX", "PX", millis, "GET", get=True
            )
        except redis.ResponseError as exc:
            if "syntax" not in str(exc).lower():
                raise
            logger.info("Redis has no SET NX GET (< 7.0); claiming with a Lua script")
            self._set_nx_get = False
            return self._evalsha(self._scripts[_CLAIM], [key], [millis, value])[0]
        if current is None or to_text(current) == value:
            return 1
        return current

    def _evalsha(self, script: Any, keys: List[bytes], args: List[Any]) -> Any:
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    def _execute(self, batch: List[Request]) -> None:
        """The coalescer's executor: one round trip for the whole batch."""
        try:
            if len(batch) == 1:
                only = batch[0]
                only.result = self._run_one(
                    only.kind, only.millis, list(only.keys), list(only.values)
                )
                return
            groups: Dict[Tuple[str, int], List[Request]] = {}
            for request in batch:
                groups.setdefault((request.kind, request.millis), []).append(request)
            calls = []
            for (kind, millis), members in groups.items():
                keys = [k for r in members for k in r.keys]
                values = [v for r in members for v in r.values]
                calls.append((kind, millis, keys, values, members))
            if len(calls) == 1:
                kind, millis, keys, values, _ = calls[0]
                replies = [self._evalsha(self._scripts[kind], keys, [millis, *values])]
            else:
                replies = self._pipeline(calls)
            for (_, _, _, _, members), reply in zip(calls, replies):
                offset = 0
                for request in members:
                    n = len(request.keys)
                    request.result = (
                        reply[offset : offset + n] if isinstance(reply, list) else reply
                    )
                    offset += n
        except Exception as exc:
            for request in batch:
                request.error = exc

    def _pipeline(self, calls: List[Tuple[str, int, List[bytes], List[str], Any]]) -> List[Any]:
        """Run several script calls in one pipelined round trip (reloading the scripts once if
        the server lost them; every script is safe to run twice)."""
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for kind, millis, keys, values, _ in calls:
                pipe.execute_command(
                    "EVALSHA", self._scripts[kind].sha, len(keys), *keys, millis, *values
                )
            replies = pipe.execute(raise_on_error=False)
            missing = [r for r in replies if isinstance(r, redis.exceptions.NoScriptError)]
            if not missing or attempt == 2:
                break
            for script in self._scripts.values():
                script.sha = self.client.script_load(script.script)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return list(replies)


def _claim_result(reply: Any) -> ClaimResult:
    if reply == 1:
        return CLAIMED
    return ClaimResult(False, parse_status(to_text(reply)))
