"""DedupConfig: which application dedups, where its records live, and the lease/retention."""

from __future__ import annotations

import math
from typing import Any, Optional, Union

from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.metrics import DedupMetrics
from rocketmq_dedup.status import StoreFailurePolicy
from rocketmq_dedup.stores import STORE_OPTIONS, make_store
from rocketmq_dedup.stores.base import DedupStore

DEFAULT_PROCESSING_EXPIRE_MILLI_SECONDS = 60_000
DEFAULT_RECORD_RESERVE_MINUTES = 1440
DEFAULT_MAX_PROCESSING_MILLI_SECONDS = 900_000  # RocketMQ's consume timeout: 15 minutes

#: The longest lease, retention or processing time: 100 years. Every store accepts it with room
#: to spare (Redis ``PX`` takes a 64-bit count of ms; MySQL's BIGINT epoch-ms columns and its
#: DATETIME range end in year 9999), and so do the lease keeper's timers.
MAX_DURATION_MS = 36_525 * 86_400_000

_SETTINGS = frozenset(
    {
        "dedup_processing_expire_milli_seconds",
        "dedup_record_reserve_minutes",
        "store_failure_policy",
        "lease_renewal",
        "max_processing_milli_seconds",
        "metrics",
        "sequence_mode",
        "sequence_start",
        "payload_mismatch",
    }
)
#: ``payload_mismatch`` values: what a duplicate key with a different payload gets.
PAYLOAD_MISMATCH_ACTIONS = ("warn", "reject")
#: ``sequence_mode`` values (the exactly-once mode's sequence guard).
SEQUENCE_MODES = ("strict", "latest")
_BIGINT = 2**63
_METRICS_METHODS = ("message", "store_operation", "leases")


class DedupConfig:
    """Dedup settings of one application (one consumer group, usually).

    Build it with :meth:`enable_dedup_consume_config` or :meth:`disable_dedup_consume_config`,
    as in the Java original. Every setting is validated when it is set (at construction, or
    later by assignment, the Java setters), so a bad value never reaches a message.

    Settings (also keywords of the constructor and of the factories):

    * ``dedup_processing_expire_milli_seconds`` - the CONSUMING lease in ms (default 60 000):
      a duplicate arriving while a handler runs is retried later; after the lease lapses a
      duplicate may run (dedup never blocks forever).
    * ``dedup_record_reserve_minutes`` - how long a CONSUMED record is kept (default 1440).
    * ``store_failure_policy`` - ``"consume"`` (default: run the handler without dedup and log a
      warning) or ``"reconsume_later"`` (leave the message to the broker's retry).
    * ``lease_renewal`` - ``True`` (default) or ``False``: renew the leases of handlers still
      running, every third of a lease (see :mod:`rocketmq_dedup.lease`), for at most
      ``max_processing_milli_seconds`` after the claim (default 900 000: RocketMQ's consume
      timeout). A crashed consumer renews nothing: its claims lapse one lease later.
    * ``metrics`` - None (default: no metrics call at all) or a
      :class:`~rocketmq_dedup.metrics.DedupMetrics`, e.g.
      :class:`~rocketmq_dedup.metrics.PrometheusMetrics`.
    * ``sequence_mode`` - ``"strict"`` (default) or ``"latest"``, and ``sequence_start`` - the
      sequence number an entity never seen expects (an int, default 1): the sequence guard of
      :class:`~rocketmq_dedup.transactional.TransactionalDedupListener`; ignored by the plain
      listener.

    Durations are positive, finite and at most 100 years (:data:`MAX_DURATION_MS`).
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
        metrics: Optional[DedupMetrics] = None,
        sequence_mode: str = "strict",
        payload_mismatch: str = "warn",
        sequence_start: int = 1,
    ) -> None:
        if not isinstance(application_name, str) or not application_name:
            raise DedupConfigError("application_name must be a non-empty string")
        if enabled and persist is None:
            raise DedupConfigError(
                "dedup is enabled but no store was given; use "
                "DedupConfig.disable_dedup_consume_config(name) to turn dedup off"
            )
        if persist is not None and not isinstance(persist, DedupStore):
            raise DedupConfigError(
                f"persist must be a DedupStore; got {type(persist).__qualname__} (pass clients "
                "to DedupConfig.enable_dedup_consume_config, which builds the store)"
            )
        self.application_name = application_name
        self.persist = persist if enabled else None
        self.enabled = bool(enabled)
        self.dedup_processing_expire_milli_seconds = dedup_processing_expire_milli_seconds
        self.dedup_record_reserve_minutes = dedup_record_reserve_minutes
        self.store_failure_policy = store_failure_policy
        self.lease_renewal = lease_renewal
        self.max_processing_milli_seconds = max_processing_milli_seconds
        self.metrics = metrics
        self.sequence_mode = sequence_mode
        self.payload_mismatch = payload_mismatch
        self.sequence_start = sequence_start

    # -- factories (the Java names) ------------------------------------------------------

    @classmethod
    def enable_dedup_consume_config(
        cls, application_name: str, client: Any, *, check_store: bool = True, **options: Any
    ) -> DedupConfig:
        """Dedup with records in ``client``'s store.

        :param client: a ``redis.Redis`` / ``redis.RedisCluster`` (also from a Sentinel's
            ``master_for``); a zero-argument callable returning a new MySQL DB-API connection
            (e.g. ``functools.partial(MySQLdb.connect, ...)``); or a store object (a
            :class:`DedupStore`, or any object with ``claim``, ``mark_consumed`` and
            ``release``).
        :param check_store: reach the store once now (Redis ``PING``; MySQL connect and
            ``SELECT 1``) and raise :class:`DedupConfigError` naming its address if that fails,
            so a wrong address is found at start-up. ``False`` starts without the store (the
            ``store_failure_policy`` then applies per message until it is reachable).
        :param options: the settings above, plus the store's: ``table_name`` and ``pool_size``
            (MySQL), ``key_prefix`` (Redis).
        """
        unknown = set(options) - _SETTINGS - STORE_OPTIONS
        if unknown:
            raise DedupConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
        if not isinstance(check_store, bool):
            raise DedupConfigError(f"check_store must be True or False; got {check_store!r}")
        store_options = {k: v for k, v in options.items() if k in STORE_OPTIONS}
        store = make_store(client, **store_options)
        settings = {k: v for k, v in options.items() if k in _SETTINGS}
        config = cls(application_name, store, **settings)  # settings fail before any I/O
        if check_store:
            try:
                store.check()
            except StoreError as exc:
                raise DedupConfigError(
                    f"the dedup store {store.describe()} is not usable: {exc.__cause__ or exc}; "
                    "fix the address, or pass check_store=False to start without it"
                ) from exc
        return config

    @classmethod
    def disable_dedup_consume_config(cls, application_name: str) -> DedupConfig:
        """Dedup off: every message goes to the handler, no store I/O."""
        return cls(application_name, None, enabled=False)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections the store opened itself (never the user's client). The store
        reconnects if it is used again."""
        if self.persist is not None:
            self.persist.close()

    def __enter__(self) -> DedupConfig:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- validated settings --------------------------------------------------------------

    @property
    def dedup_processing_expire_milli_seconds(self) -> float:
        """The CONSUMING lease, in milliseconds."""
        return self._lease_setting

    @dedup_processing_expire_milli_seconds.setter
    def dedup_processing_expire_milli_seconds(self, value: float) -> None:
        self._lease_ms = _duration_ms("dedup_processing_expire_milli_seconds", value, 1)
        self._lease_setting = value

    @property
    def dedup_record_reserve_minutes(self) -> float:
        """How long a CONSUMED record is kept, in minutes."""
        return self._retention_setting

    @dedup_record_reserve_minutes.setter
    def dedup_record_reserve_minutes(self, value: float) -> None:
        self._retention_ms = _duration_ms("dedup_record_reserve_minutes", value, 60_000)
        self._retention_setting = value

    @property
    def max_processing_milli_seconds(self) -> float:
        """No lease renewal past this long after the claim, in milliseconds."""
        return self._max_processing_setting

    @max_processing_milli_seconds.setter
    def max_processing_milli_seconds(self, value: float) -> None:
        self._max_processing_ms = _duration_ms("max_processing_milli_seconds", value, 1)
        self._max_processing_setting = value

    @property
    def lease_renewal(self) -> bool:
        """Whether the leases of running handlers are renewed."""
        return self._lease_renewal

    @lease_renewal.setter
    def lease_renewal(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise DedupConfigError(f"lease_renewal must be True or False; got {value!r}")
        self._lease_renewal = value

    @property
    def metrics(self) -> Optional[DedupMetrics]:
        """Where decisions and timings are reported (None: nowhere)."""
        return self._metrics

    @metrics.setter
    def metrics(self, value: Optional[DedupMetrics]) -> None:
        if value is not None and not all(
            callable(getattr(value, name, None)) for name in _METRICS_METHODS
        ):
            raise DedupConfigError(
                f"metrics must be None or a rocketmq_dedup.metrics.DedupMetrics (methods "
                f"{', '.join(_METRICS_METHODS)}); got {type(value).__qualname__}"
            )
        self._metrics = value

    @property
    def sequence_mode(self) -> str:
        """The sequence guard's rule: ``"strict"`` (apply in order, wait for gaps) or
        ``"latest"`` (apply anything newer, skip the rest)."""
        return self._sequence_mode

    @sequence_mode.setter
    def sequence_mode(self, value: str) -> None:
        if value not in SEQUENCE_MODES or not isinstance(value, str):
            raise DedupConfigError(
                f"sequence_mode must be one of {', '.join(map(repr, SEQUENCE_MODES))}; "
                f"got {value!r}"
            )
        self._sequence_mode = value

    @property
    def payload_mismatch(self) -> str:
        """What a duplicate key whose payload fingerprint differs from the first copy's gets
        (listeners that define ``payload_fingerprint``): ``"warn"`` (logged and counted, then
        answered as the duplicate it claims to be) or ``"reject"`` (also RECONSUME_LATER, so
        it ends in the DLQ for a human to look at)."""
        return self._payload_mismatch

    @payload_mismatch.setter
    def payload_mismatch(self, value: str) -> None:
        if not isinstance(value, str) or value not in PAYLOAD_MISMATCH_ACTIONS:
            raise DedupConfigError(
                f"payload_mismatch must be one of {', '.join(map(repr, PAYLOAD_MISMATCH_ACTIONS))}"
                f"; got {value!r}"
            )
        self._payload_mismatch = value

    @property
    def sequence_start(self) -> int:
        """The sequence number an entity never seen expects under ``"strict"``."""
        return self._sequence_start

    @sequence_start.setter
    def sequence_start(self, value: int) -> None:
        if type(value) is not int or not -_BIGINT < value < _BIGINT:
            raise DedupConfigError(
                f"sequence_start must be an int (a signed 64-bit number); got {value!r}"
            )
        self._sequence_start = value

    @property
    def store_failure_policy(self) -> StoreFailurePolicy:
        """What a message gets when the store is unavailable."""
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

    # The settings in whole milliseconds, as the stores take them (read on every message, so
    # a setting assigned later applies to the next message).

    @property
    def lease_ms(self) -> int:
        """``dedup_processing_expire_milli_seconds`` in whole milliseconds."""
        return self._lease_ms

    @property
    def retention_ms(self) -> int:
        """``dedup_record_reserve_minutes`` in whole milliseconds."""
        return self._retention_ms

    @property
    def max_processing_ms(self) -> int:
        """``max_processing_milli_seconds`` in whole milliseconds."""
        return self._max_processing_ms

    def __repr__(self) -> str:
        store = self.persist.describe() if self.persist is not None else None
        return (
            f"DedupConfig(application_name={self.application_name!r}, enabled={self.enabled}, "
            f"persist={store!r}, lease_ms={self._lease_ms}, retention_ms={self._retention_ms}, "
            f"store_failure_policy={self._policy.value!r})"
        )


def _duration_ms(name: str, value: Any, unit_ms: int) -> int:
    """``value`` (in units of ``unit_ms``) as whole milliseconds, validated."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DedupConfigError(f"{name} must be a number; got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise DedupConfigError(f"{name} must be positive and finite; got {value!r}")
    if value * unit_ms > MAX_DURATION_MS:
        raise DedupConfigError(
            f"{name} must be at most {MAX_DURATION_MS // unit_ms:,} (100 years); got {value!r}"
        )
    return max(1, round(value * unit_ms))
