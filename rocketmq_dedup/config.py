"""DedupConfig: which application dedups, where its records live, and the lease/retention."""

from __future__ import annotations

import math
import threading
from typing import Any, Optional, Union

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.lease import LeaseKeeper
from rocketmq_dedup.status import StoreFailurePolicy
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.stores.foreign import ForeignStore, looks_like_store
from rocketmq_dedup.stores.mysql import DEFAULT_TABLE_NAME, MySQLDedupStore
from rocketmq_dedup.stores.redis import DEFAULT_KEY_PREFIX, RedisDedupStore, is_redis_client

DEFAULT_PROCESSING_EXPIRE_MILLI_SECONDS = 60_000
DEFAULT_RECORD_RESERVE_MINUTES = 1440
DEFAULT_MAX_PROCESSING_MILLI_SECONDS = 900_000  # RocketMQ's consume timeout: 15 minutes

_COMMON_OPTIONS = frozenset(
    {
        "dedup_processing_expire_milli_seconds",
        "dedup_record_reserve_minutes",
        "store_failure_policy",
        "lease_renewal",
        "max_processing_milli_seconds",
    }
)


class DedupConfig:
    """Dedup settings of one application (one consumer group, usually).

    Build it with :meth:`enable_dedup_consume_config` or :meth:`disable_dedup_consume_config`,
    as in the Java original. Every setting is validated when set.

    Settings (also constructor/factory keywords):

    * ``dedup_processing_expire_milli_seconds`` - the CONSUMING lease in ms (default 60 000):
      a duplicate arriving while a handler runs is retried later; after the lease lapses a
      duplicate may run (dedup never blocks forever).
    * ``dedup_record_reserve_minutes`` - how long a CONSUMED record is kept (default 1440).
    * ``store_failure_policy`` - ``"consume"`` (default: run the handler without dedup and log a
      warning) or ``"reconsume_later"`` (leave the message to the broker's retry).
    * ``lease_renewal`` - renew the leases of handlers still running, every third of a lease
      (default True; see :mod:`rocketmq_dedup.lease`), for at most
      ``max_processing_milli_seconds`` after the claim (default 900 000: RocketMQ's consume
      timeout). A crashed consumer renews nothing: its claims lapse one lease later.
    """

    def __init__(
        self,
        application_name: str,
        persist: Optional[DedupStore] = None,
        *,
        enabled: bool = True,
        dedup_processing_expire_milli_seconds: float = DEFAULT_PROCESSING_EXPIRE_MILLI_SECONDS,
        dedup_record_reserve_minutes: float = DEFAULT_RECORD_RESERVE_MINUTES,
        store_failure_policy: Union[str, StoreFailurePolicy] = StoreFailurePolicy.CONSUME,
        lease_renewal: bool = True,
        max_processing_milli_seconds: float = DEFAULT_MAX_PROCESSING_MILLI_SECONDS,
    ) -> None:
        if not isinstance(application_name, str) or not application_name:
            raise DedupConfigError("application_name must be a non-empty string")
        if enabled and persist is None:
            raise DedupConfigError(
                "dedup is enabled but no store was given; use "
                "DedupConfig.disable_dedup_consume_config(name) to turn dedup off"
            )
        self.application_name = application_name
        self.persist = persist
        self.enabled = enabled
        self.dedup_processing_expire_milli_seconds = dedup_processing_expire_milli_seconds
        self.dedup_record_reserve_minutes = dedup_record_reserve_minutes
        self.store_failure_policy = store_failure_policy
        self.lease_renewal = bool(lease_renewal)
        self.max_processing_milli_seconds = max_processing_milli_seconds
        self._keeper: Optional[LeaseKeeper] = None
        self._keeper_lock = threading.Lock()

    # -- factories (the Java names) ------------------------------------------------------

    @classmethod
    def enable_dedup_consume_config(
        cls, application_name: str, client: Any, **options: Any
    ) -> DedupConfig:
        """Dedup with records in ``client``'s store.

        :param client: a ``redis.Redis`` / ``redis.RedisCluster``; a zero-argument callable
            returning a new MySQL DB-API connection (e.g. ``functools.partial(MySQLdb.connect,
            ...)``); or a store object (a :class:`DedupStore`, or any object with ``claim``,
            ``mark_consumed`` and ``release``).
        :param options: the settings above, plus ``table_name`` (MySQL) or ``key_prefix``
            (Redis).
        """
        unknown = set(options) - _COMMON_OPTIONS - {"table_name", "key_prefix"}
        if unknown:
            raise DedupConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
        table_name = options.pop("table_name", None)
        key_prefix = options.pop("key_prefix", None)
        store = _make_store(client, table_name, key_prefix)
        return cls(application_name, store, **options)

    @classmethod
    def disable_dedup_consume_config(cls, application_name: str) -> DedupConfig:
        """Dedup off: every message goes to the handler, no store I/O."""
        return cls(application_name, None, enabled=False)

    # -- validated settings --------------------------------------------------------------

    @property
    def dedup_processing_expire_milli_seconds(self) -> float:
        return self._lease_ms_setting

    @dedup_processing_expire_milli_seconds.setter
    def dedup_processing_expire_milli_seconds(self, value: float) -> None:
        self._lease_ms_setting = _positive("dedup_processing_expire_milli_seconds", value)
        self.lease_ms = max(1, round(self._lease_ms_setting))

    @property
    def dedup_record_reserve_minutes(self) -> float:
        return self._retention_minutes_setting

    @dedup_record_reserve_minutes.setter
    def dedup_record_reserve_minutes(self, value: float) -> None:
        self._retention_minutes_setting = _positive("dedup_record_reserve_minutes", value)
        self.retention_ms = max(1, round(self._retention_minutes_setting * 60_000))

    @property
    def max_processing_milli_seconds(self) -> float:
        return self._max_processing_setting

    @max_processing_milli_seconds.setter
    def max_processing_milli_seconds(self, value: float) -> None:
        self._max_processing_setting = _positive("max_processing_milli_seconds", value)
        self.max_processing_ms = max(1, round(value))

    def lease_keeper(self) -> Optional[LeaseKeeper]:
        """The lease keeper for the current settings, or None when renewal is off or the
        store cannot renew."""
        if not (self.enabled and self.lease_renewal and self.persist is not None):
            return None
        if not self.persist.supports_renewal:
            return None
        keeper = self._keeper
        if not self._keeper_fits(keeper):
            with self._keeper_lock:
                keeper = self._keeper
                if not self._keeper_fits(keeper):
                    keeper = LeaseKeeper(self.persist, self.lease_ms, self.max_processing_ms)
                    self._keeper = keeper
        return keeper

    def _keeper_fits(self, keeper: Optional[LeaseKeeper]) -> bool:
        return (
            keeper is not None
            and keeper.lease_ms == self.lease_ms
            and keeper.max_processing_ms == self.max_processing_ms
        )

    @property
    def store_failure_policy(self) -> StoreFailurePolicy:
        return self._policy

    @store_failure_policy.setter
    def store_failure_policy(self, value: Union[str, StoreFailurePolicy]) -> None:
        try:
            self._policy = StoreFailurePolicy(value)
        except ValueError:
            choices = ", ".join(repr(p.value) for p in StoreFailurePolicy)
            raise DedupConfigError(
                f"store_failure_policy must be one of {choices}; got {value!r}"
            ) from None

    def __repr__(self) -> str:
        return (
            f"DedupConfig(application_name={self.application_name!r}, enabled={self.enabled}, "
            f"persist={type(self.persist).__name__}, lease_ms={self.lease_ms}, "
            f"retention_ms={self.retention_ms}, store_failure_policy={self._policy.value!r})"
        )


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DedupConfigError(f"{name} must be a number; got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise DedupConfigError(f"{name} must be positive and finite; got {value!r}")
    return value


def _make_store(client: Any, table_name: Optional[str], key_prefix: Optional[str]) -> DedupStore:
    if client is None:
        raise DedupConfigError(
            "client is None: pass a redis client, a MySQL connection factory or a store; "
            "use disable_dedup_consume_config(name) to turn dedup off"
        )
    if is_redis_client(client):
        if table_name is not None:
            raise DedupConfigError("table_name applies to the MySQL store, not to Redis")
        return RedisDedupStore(client, DEFAULT_KEY_PREFIX if key_prefix is None else key_prefix)
    if table_name is None and key_prefix is None and isinstance(client, DedupStore):
        return client
    if table_name is None and key_prefix is None and looks_like_store(client):
        return ForeignStore(client)
    if key_prefix is not None:
        raise DedupConfigError("key_prefix applies to the Redis store only")
    if callable(client):
        return MySQLDedupStore(client, DEFAULT_TABLE_NAME if table_name is None else table_name)
    raise DedupConfigError(
        f"unsupported client {type(client).__module__}.{type(client).__qualname__}: expected "
        "redis.Redis/RedisCluster, a zero-argument callable returning a new MySQL DB-API "
        "connection (e.g. functools.partial(MySQLdb.connect, ...)), or a store object"
    )
