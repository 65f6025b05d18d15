"""Redis record store (``redis.Redis`` or ``redis.RedisCluster``); needs the ``[redis]`` extra.

Record key: ``{prefix}:{application}:{topic}:{tag}:{key}`` with every segment percent-escaped
(``%``, ``:``, ``{``, ``}``), so different elements never share a key and no key forms a
cluster hash tag by accident. Value: ``CONSUMING:<owner token>`` (TTL = the lease) or
``CONSUMED:<owner token>`` (TTL = the retention).

Round trips: a fresh message costs two (claim script, ``SET``), a duplicate one (claim
script). The batch methods cost one per batch on ``redis.Redis``; on a cluster they run one
script per key, since a script may only touch one slot.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from rocketmq_dedup.errors import DedupConfigError, MissingExtraError
from rocketmq_dedup.message import DedupElement, escape_segment, to_text
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import CLAIMED, ClaimResult, DedupStore, parse_status

try:  # the [redis] extra
    import redis
    from redis.cluster import RedisCluster
except ImportError:  # pragma: no cover - exercised by the no-extras import test
    redis = None  # type: ignore[assignment]
    RedisCluster = None  # type: ignore[assignment,misc]

DEFAULT_KEY_PREFIX = "MSGDEDUP"

# KEYS[i]: the record key of element i
# ARGV[1]: the lease, in milliseconds
# ARGV[i + 1]: the claim value of element i ("CONSUMING:<owner token>")
# Returns one entry per key: 1 when the claim was taken (the key was free), else the record's
# current value. GET and SET run in one script, so a record that vanishes in between cannot
# let a second claimer win.
CLAIM_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  if current then
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
# ARGV[i]: the claim value element i was claimed with ("CONSUMING:<owner token>")
# Deletes each key still holding exactly that claim; returns how many were deleted. A newer
# owner's claim or any CONSUMED record is left alone.
RELEASE_SCRIPT = """
local deleted = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then
    redis.call('DEL', key)
    deleted = deleted + 1
  end
end
return deleted
"""

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
    """

    driver_errors = (redis.RedisError,) if redis is not None else ()

    def __init__(self, client: Any, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
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
        self._claim = client.register_script(CLAIM_SCRIPT)
        self._mark = client.register_script(MARK_CONSUMED_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    def record_key(self, element: DedupElement) -> bytes:
        """The Redis key of ``element``."""
        app, topic, tag, key = element
        text = (
            f"{self._prefix}{escape_segment(app)}:{escape_segment(topic)}:"
            f"{escape_segment(tag)}:{escape_segment(key)}"
        )
        return text.encode("utf-8", "surrogateescape")

    def do_claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult:
        reply = self._claim(keys=[self.record_key(element)], args=[lease_ms, _CONSUMING + owner])
        return _claim_result(reply[0])

    def do_claim_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[ClaimResult]:
        if self._cluster:
            return [self.do_claim(e, o, lease_ms) for e, o in zip(elements, owners)]
        keys = [self.record_key(e) for e in elements]
        reply = self._claim(keys=keys, args=[lease_ms, *(_CONSUMING + o for o in owners)])
        return [_claim_result(r) for r in reply]

    def do_mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None:
        self.client.set(self.record_key(element), _CONSUMED + owner, px=retention_ms)

    def do_mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None:
        if self._cluster:
            for element, owner in zip(elements, owners):
                self.do_mark_consumed(element, owner, retention_ms)
            return
        keys = [self.record_key(e) for e in elements]
        self._mark(keys=keys, args=[retention_ms, *(_CONSUMED + o for o in owners)])

    def do_release(self, element: DedupElement, owner: str) -> bool:
        return int(self._release(keys=[self.record_key(element)], args=[_CONSUMING + owner])) == 1

    def do_release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int:
        if self._cluster:
            return sum(self.do_release(e, o) for e, o in zip(elements, owners))
        keys = [self.record_key(e) for e in elements]
        return int(self._release(keys=keys, args=[_CONSUMING + o for o in owners]))

    def do_get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        return parse_status(to_text(self.client.get(self.record_key(element))))


def _claim_result(reply: Any) -> ClaimResult:
    if reply == 1:
        return CLAIMED
    return ClaimResult(False, parse_status(to_text(reply)))
