"""DedupConfig: which application dedups, where its records live, and how.

Each setting is declared once, as a :class:`Setting` on :class:`DedupConfig`: its default, its
check (which also turns it into what the listener uses, e.g. minutes into milliseconds) and its
documentation. The constructor's and the factories' keywords, the Java-style setters
(``config.dedup_record_reserve_minutes = 60``) and :meth:`DedupConfig.settings` all come from
those declarations. A listener reads a :class:`Snapshot` (one attribute read per batch): a
setting assigned while messages flow applies from the next batch, never half-way through one.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Optional,
    Type,
    TypeVar,
    Union,
    overload,
)

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.horizon import DEFAULT_MAX_RECONSUME_TIMES, redelivery_horizon_ms
from rocketmq_dedup.metrics import DedupMetrics
from rocketmq_dedup.metrics.meter import Meter, meter_for
from rocketmq_dedup.status import (
    ExactlyOnceClaim,
    PayloadMismatch,
    PermanentFailurePolicy,
    SequenceMode,
    StoreFailurePolicy,
)
from rocketmq_dedup.stores import STORE_OPTIONS, check_usable, make_store
from rocketmq_dedup.stores.base import DedupStore

T = TypeVar("T")

DEFAULT_PROCESSING_EXPIRE_MILLI_SECONDS = 60_000
DEFAULT_RECORD_RESERVE_MINUTES = 1440
DEFAULT_MAX_PROCESSING_MILLI_SECONDS = 900_000  # RocketMQ's consume timeout: 15 minutes

#: The longest lease, retention or processing time: 100 years. Every store accepts it with room
#: to spare (Redis ``PX`` takes a 64-bit count of ms; MySQL's BIGINT epoch-ms columns and its
#: DATETIME range end in year 9999), and so do the lease keeper's timers.
MAX_DURATION_MS = 36_525 * 86_400_000

#: The range of a signed 64-bit integer (MySQL's BIGINT): sequence numbers and their start.
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1

#: The most ``local_retries`` a message may get before RECONSUME_LATER.
MAX_LOCAL_RETRIES = 100
#: The largest ``max_reconsume_times`` (past the last delay level each retry waits 2 h: this
#: many is over 14 years of retries).
MAX_RECONSUME_TIMES = 65_535
#: The largest ``max_lapsed_claims``.
MAX_LAPSED_CLAIMS = 1000
_METRICS_METHODS = ("message", "store_operation", "leases")


def fits_bigint(value: int) -> bool:
    """True if ``value`` fits a signed 64-bit integer (the one bound of sequence numbers)."""
    return BIGINT_MIN <= value <= BIGINT_MAX


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The settings as a listener uses them, read once per batch (:meth:`DedupConfig.snapshot`):
    durations in whole milliseconds, choices as enums or flags. Frozen, with slots: a message
    reads several of its fields, each as fast as an attribute can be read (a NamedTuple's
    field is a descriptor call)."""

    application_name: str
    lease_ms: int
    retention_ms: int
    max_processing_ms: int
    hold_ms: int
    """The longest an attempt holds its key without renewal: ``max_processing_ms`` with lease
    renewal, else ``lease_ms``."""
    store_failure_policy: StoreFailurePolicy
    lease_renewal: bool
    metrics: Optional[DedupMetrics]
    meter: Meter
    """What the consume path reports to ``metrics`` (:mod:`rocketmq_dedup.metrics.meter`):
    chosen here, once, so that a message without metrics has no metrics branch."""
    payload_mismatch: PayloadMismatch
    sequence_mode: SequenceMode
    sequence_start: int
    exactly_once_claim: ExactlyOnceClaim
    in_progress_wait_ms: int
    local_retries: int
    local_retry_backoff_ms: int
    max_reconsume_times: int
    max_delivery_delay_ms: int
    permanent_failure: PermanentFailurePolicy
    max_lapsed_claims: int
    """0: never park a message for its lapsed claims."""


class Setting(Generic[T]):
    """One setting of :class:`DedupConfig`, declared once: its default, the check that
    validates a value and returns what the :class:`Snapshot` field ``field`` holds, and its
    documentation. Validated when set, at construction or later by assignment (the Java
    setters), so a bad value never reaches a message."""

    def __init__(
        self,
        default: T,
        check: Callable[[str, Any], Any],
        field: str,
        doc: str,
        reads_checked: bool = False,
    ) -> None:
        self.default = default
        self.check = check
        self.field = field
        self.__doc__ = doc
        self.reads_checked = reads_checked  # the getter returns the checked value, not the raw
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, config: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, config: DedupConfig, owner: type) -> T: ...

    def __get__(self, config: Optional[DedupConfig], owner: type) -> Union[T, Setting[T]]:
        if config is None:
            return self
        value: T = config._values[self.name]
        return value

    def __set__(self, config: DedupConfig, value: T) -> None:
        used = self.check(self.name, value)
        config._values[self.name] = used if self.reads_checked else value
        config._used[self.field] = used
        config._snapshot = None


# -- checks: each validates a value and returns what the listener uses ---------------------------


def _duration(unit_ms: int, zero: bool = False) -> Callable[[str, Any], int]:
    """A number of ``unit_ms`` units, positive (or zero with ``zero``), finite, at most 100
    years; as whole milliseconds (at least 1 unless zero)."""

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DedupConfigError(f"{name} must be a number; got {value!r}")
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            bound = "zero or more" if zero else "positive"
            raise DedupConfigError(f"{name} must be {bound} and finite; got {value!r}")
        if value * unit_ms > MAX_DURATION_MS:
            raise DedupConfigError(
                f"{name} must be at most {MAX_DURATION_MS // unit_ms:,} (100 years); got {value!r}"
            )
        return 0 if value == 0 else max(1, round(value * unit_ms))

    return check


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DedupConfigError(f"{name} must be True or False; got {value!r}")
    return value


E = TypeVar("E", bound=enum.Enum)


def _choice(kind: Type[E]) -> Callable[[str, Any], E]:
    """One of the enum's members, given as the member or as its value (the strings users
    write: ``"reconsume_later"``, ``"before_handler"``)."""

    def check(name: str, value: Any) -> E:
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(repr(member.value) for member in kind)
            raise DedupConfigError(f"{name} must be one of {choices}; got {value!r}") from None

    return check


def _metrics(name: str, value: Any) -> Optional[DedupMetrics]:
    if value is not None and not all(
        callable(getattr(value, method, None)) for method in _METRICS_METHODS
    ):
        raise DedupConfigError(
            f"{name} must be None or a rocketmq_dedup.metrics.DedupMetrics (methods "
            f"{', '.join(_METRICS_METHODS)}); got {type(value).__qualname__}"
        )
    return value  # type: ignore[no-any-return]


def _bigint(name: str, value: Any) -> int:
    if type(value) is not int or not fits_bigint(value):
        raise DedupConfigError(f"{name} must be an int (a signed 64-bit number); got {value!r}")
    return value


def _count(most: int) -> Callable[[str, Any], int]:
    """An int from 0 to ``most``."""

    def check(name: str, value: Any) -> int:
        if type(value) is not int or not 0 <= value <= most:
            raise DedupConfigError(f"{name} must be an int from 0 to {most:,}; got {value!r}")
        return value

    return check


class DedupConfig:
    """Dedup settings of one application (one consumer group, usually).

    Build it with :meth:`enable_dedup_consume_config` or :meth:`disable_dedup_consume_config`,
    as in the Java original; every setting below is a keyword of both and of the constructor,
    and an attribute that may be assigned later (validated when set). :meth:`settings` lists
    them with their defaults.
    """

    dedup_processing_expire_milli_seconds = Setting[float](
        DEFAULT_PROCESSING_EXPIRE_MILLI_SECONDS,
        _duration(1),
        "lease_ms",
        "The CONSUMING lease in ms: a duplicate arriving while a handler runs is retried "
        "later; after the lease lapses a duplicate may run (dedup never blocks forever).",
    )
    dedup_record_reserve_minutes = Setting[float](
        DEFAULT_RECORD_RESERVE_MINUTES,
        _duration(60_000),
        "retention_ms",
        "How long a CONSUMED record is kept, in minutes.",
    )
    store_failure_policy = Setting[Union[str, StoreFailurePolicy]](
        StoreFailurePolicy.CONSUME,
        _choice(StoreFailurePolicy),
        "store_failure_policy",
        "What a message gets when the store is unavailable: 'consume' (run the handler "
        "without dedup, a warning logged) or 'reconsume_later' (leave it to the broker's "
        "retry).",
        reads_checked=True,
    )
    lease_renewal = Setting[bool](
        True,
        _flag,
        "lease_renewal",
        "Renew the leases of handlers still running, every third of a lease, for at most "
        "max_processing_milli_seconds after the claim. A crashed consumer renews nothing: "
        "its claims lapse one lease later.",
    )
    max_processing_milli_seconds = Setting[float](
        DEFAULT_MAX_PROCESSING_MILLI_SECONDS,
        _duration(1),
        "max_processing_ms",
        "No lease renewal past this long after the claim, in ms (RocketMQ's consume "
        "timeout, 15 minutes, by default).",
    )
    metrics = Setting[Optional[DedupMetrics]](
        None,
        _metrics,
        "metrics",
        "Where decisions and timings are reported: None (no metrics call at all) or a "
        "rocketmq_dedup.metrics.DedupMetrics, e.g. PrometheusMetrics.",
    )
    payload_mismatch = Setting[Union[str, PayloadMismatch]](
        PayloadMismatch.WARN,
        _choice(PayloadMismatch),
        "payload_mismatch",
        "What a duplicate key whose payload fingerprint differs from the first copy's gets "
        "(listeners that define payload_fingerprint): 'warn' (logged and counted, then "
        "answered as the duplicate it claims to be) or 'reject' (also RECONSUME_LATER, so it "
        "ends in the DLQ for a human to look at).",
        reads_checked=True,
    )
    in_progress_wait_milli_seconds = Setting[float](
        0,
        _duration(1, zero=True),
        "in_progress_wait_ms",
        "A duplicate whose twin is in its handler in this same process waits up to this "
        "long (ms) for the twin's outcome and is answered from it (acked if the twin "
        "succeeded), instead of going back to the broker with RECONSUME_LATER; 0 (the "
        "default) does not wait.",
    )
    local_retries = Setting[int](
        0,
        _count(MAX_LOCAL_RETRIES),
        "local_retries",
        "How many more times a failed handler runs in place (the claim still held) before "
        "the message is answered RECONSUME_LATER; 0 (the default) leaves every retry to the "
        "broker.",
    )
    local_retry_backoff_milli_seconds = Setting[float](
        100,
        _duration(1),
        "local_retry_backoff_ms",
        "The wait before the first local retry, in ms; each next one waits twice as long.",
    )
    exactly_once_claim = Setting[Union[str, ExactlyOnceClaim]](
        ExactlyOnceClaim.AT_COMMIT,
        _choice(ExactlyOnceClaim),
        "exactly_once_claim",
        "When TransactionalDedupListener claims a key: 'at_commit' (the record is written "
        "with the COMMIT, no round trip before the handler) or 'before_handler' (a named "
        "lock and a look-up before the handler: a duplicate from any consumer is answered "
        "at once). Ignored by the plain listener.",
    )
    sequence_mode = Setting[Union[str, SequenceMode]](
        SequenceMode.STRICT,
        _choice(SequenceMode),
        "sequence_mode",
        "The sequence guard's rule (TransactionalDedupListener.sequence_key): 'strict' "
        "(apply in order, wait for gaps) or 'latest' (apply anything newer, skip the rest).",
        reads_checked=True,
    )
    sequence_start = Setting[int](
        1,
        _bigint,
        "sequence_start",
        "The sequence number an entity never seen expects under 'strict' (a signed 64-bit int).",
    )

    max_reconsume_times = Setting[int](
        DEFAULT_MAX_RECONSUME_TIMES,
        _count(MAX_RECONSUME_TIMES),
        "max_reconsume_times",
        "How many times the broker retries a failed message before the DLQ (the Java "
        "consumer's maxReconsumeTimes; the consumer group's retryMaxTimes on the server): with "
        "max_delivery_delay_minutes it gives the redelivery horizon, and a listener warns when "
        "it is made if dedup_record_reserve_minutes is shorter. Changes nothing on the broker.",
    )
    max_delivery_delay_minutes = Setting[float](
        0,
        _duration(60_000, zero=True),
        "max_delivery_delay_ms",
        "The longest delay your producers give a message (delayed and timer messages), in "
        "minutes: added to the redelivery horizon (max_reconsume_times). 0 by default.",
    )

    permanent_failure = Setting[Union[str, PermanentFailurePolicy]](
        PermanentFailurePolicy.DLQ,
        _choice(PermanentFailurePolicy),
        "permanent_failure",
        "What a message that can never succeed gets (its handler raised PermanentFailure, or "
        "it was parked by max_lapsed_claims), once recorded FAILED, and every copy of it "
        "after, without the handler: 'dlq' (RECONSUME_LATER until the broker's retries are "
        "spent and it dead-letters the message) or 'ack' (CONSUME_SUCCESS; the FAILED record "
        "keeps the reason for the retention).",
        reads_checked=True,
    )
    max_lapsed_claims = Setting[int](
        0,
        _count(MAX_LAPSED_CLAIMS),
        "max_lapsed_claims",
        "Park a message whose handler kills its consumer (SIGKILL, OOM, a native fault): when "
        "this many claims of it lapsed with their consumer gone (taken over after their "
        "lease, never settled), it is recorded FAILED and answered as permanent_failure "
        "says instead of run again. 0 (the default): never; 3 is a sound value with lease "
        "renewal on (a stalled process whose lease lapsed once is not parked for it).",
    )

    def __init__(
        self,
        application_name: str,
        persist: Optional[DedupStore] = None,
        *,
        enabled: bool = True,
        **settings: Any,
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
        unknown = set(settings) - set(_SETTINGS)
        if unknown:
            raise DedupConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        self._values: Dict[str, Any] = {}
        self._used: Dict[str, Any] = {}
        self._snapshot: Optional[Snapshot] = None
        self.application_name = application_name
        #: Where the records live (None with dedup disabled); ``persist``, the Java name.
        self.store: Optional[DedupStore] = persist if enabled else None
        self.enabled = bool(enabled)
        for name, setting in _SETTINGS.items():
            setattr(self, name, settings.get(name, setting.default))

    @property
    def persist(self) -> Optional[DedupStore]:
        """The store (:attr:`store`), by the Java original's name."""
        return self.store

    @classmethod
    def settings(cls) -> Dict[str, Any]:
        """Every setting's name and default (the keywords the constructor and the factories
        take, besides the stores' own options)."""
        return {name: setting.default for name, setting in _SETTINGS.items()}

    # -- factories (the Java names) ------------------------------------------------------

    @classmethod
    def enable_dedup_consume_config(
        cls, application_name: str, client: Any, *, check_store: bool = True, **options: Any
    ) -> DedupConfig:
        """Dedup with records in ``client``'s store.

        :param client: a ``redis.Redis`` / ``redis.RedisCluster`` (also from a Sentinel's
            ``master_for``); a zero-argument callable returning a new MySQL DB-API connection
            (e.g. ``functools.partial(MySQLdb.connect, ...)``); a SQLAlchemy ``Engine``; or a
            store object (a :class:`DedupStore`, or any object with ``claim``,
            ``mark_consumed`` and ``release``).
        :param check_store: check the store now: reach it (Redis ``PING``; MySQL connect),
            prove it can claim and release (probe records of this application, claimed and
            released through the store's own writes; on MySQL once the table exists, else in
            ``create_table()``) and log at WARNING a setting that puts records at risk (a
            Redis ``maxmemory-policy`` that evicts keys). A failure raises
            :class:`DedupConfigError` naming the address, the missing privilege or ACL rule,
            or the read-only server, so it is found at start-up. ``False`` starts without the
            check (an outage then follows ``store_failure_policy`` per message; a refusal a
            person must fix is answered RECONSUME_LATER).
        :param options: the settings (:meth:`settings`), plus the store's: ``table_name``,
            ``pool_size`` and ``pool_timeout`` (MySQL), ``key_prefix`` (Redis).
        """
        unknown = set(options) - set(_SETTINGS) - STORE_OPTIONS
        if unknown:
            raise DedupConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
        _flag("check_store", check_store)
        store = make_store(client, **{k: v for k, v in options.items() if k in STORE_OPTIONS})
        settings = {k: v for k, v in options.items() if k in _SETTINGS}
        config = cls(application_name, store, **settings)  # settings fail before any I/O
        if check_store:
            check_usable(store, application_name)
        return config

    @classmethod
    def disable_dedup_consume_config(cls, application_name: str) -> DedupConfig:
        """Dedup off: every message goes to the handler, no store I/O."""
        return cls(application_name, None, enabled=False)

    # -- what the listener reads ---------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The settings as the listener uses them, built once per change of a setting."""
        snapshot = self._snapshot
        if snapshot is None:
            used = self._used
            hold_ms = used["max_processing_ms"] if used["lease_renewal"] else used["lease_ms"]
            snapshot = self._snapshot = Snapshot(
                application_name=self.application_name,
                hold_ms=hold_ms,
                meter=meter_for(used["metrics"], self.application_name),
                **used,
            )
            if snapshot.max_lapsed_claims and self.store is not None:
                self.store.count_lapses()  # (a Redis store counts only once asked)
        return snapshot

    @property
    def lease_ms(self) -> int:
        """``dedup_processing_expire_milli_seconds`` in whole milliseconds."""
        return self.snapshot().lease_ms

    @property
    def retention_ms(self) -> int:
        """``dedup_record_reserve_minutes`` in whole milliseconds."""
        return self.snapshot().retention_ms

    @property
    def max_processing_ms(self) -> int:
        """``max_processing_milli_seconds`` in whole milliseconds."""
        return self.snapshot().max_processing_ms

    @property
    def redelivery_horizon_ms(self) -> int:
        """How long after a message is consumed the broker may still deliver a copy of it
        (:mod:`rocketmq_dedup.horizon`): ``max_reconsume_times`` retries on RocketMQ's
        default delay levels, plus ``max_delivery_delay_minutes``. Keep CONSUMED records at
        least this long (``dedup_record_reserve_minutes``)."""
        snap = self.snapshot()
        return redelivery_horizon_ms(snap.max_reconsume_times, snap.max_delivery_delay_ms)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections the store opened itself (never the user's client). The store
        reconnects if it is used again."""
        if self.store is not None:
            self.store.close()

    def __enter__(self) -> DedupConfig:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        snap = self.snapshot()
        store = self.store.describe() if self.store is not None else None
        return (
            f"DedupConfig(application_name={self.application_name!r}, enabled={self.enabled}, "
            f"persist={store!r}, lease_ms={snap.lease_ms}, retention_ms={snap.retention_ms}, "
            f"store_failure_policy={snap.store_failure_policy.value!r})"
        )


#: Every setting, by name, in declaration order.
_SETTINGS: Dict[str, Setting[Any]] = {
    name: value for name, value in vars(DedupConfig).items() if isinstance(value, Setting)
}
