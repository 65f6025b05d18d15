"""The Redis record store, by concern: :mod:`.records` (keys, values, Lua scripts, replies),
:mod:`.transport` (RESP packing, the store's connection, cluster fan-out) and :mod:`.store`
(:class:`RedisDedupStore`); the shared round trips of concurrent threads are
:mod:`rocketmq_dedup.stores.coalesce`'s."""

from rocketmq_dedup.stores.redis.records import (
    CLAIM_SCRIPT,
    DEFAULT_KEY_PREFIX,
    MARK_CONSUMED_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
)
from rocketmq_dedup.stores.redis.store import RedisDedupStore, is_redis_client
from rocketmq_dedup.stores.redis.transport import pack_commands

__all__ = [
    "CLAIM_SCRIPT",
    "DEFAULT_KEY_PREFIX",
    "MARK_CONSUMED_SCRIPT",
    "RELEASE_SCRIPT",
    "RENEW_SCRIPT",
    "RedisDedupStore",
    "is_redis_client",
    "pack_commands",
]
