"""Record stores. Redis and MySQL need their extras only when used."""

from rocketmq_dedup.stores.base import ClaimResult, DedupStore
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.redis import RedisDedupStore

__all__ = ["ClaimResult", "DedupStore", "MemoryDedupStore", "MySQLDedupStore", "RedisDedupStore"]
