"""The abstract record store: the I/O the dedup strategies need, and nothing else.

Its vocabulary: a :class:`Claim` (an element and the owner token of the attempt that claimed it,
the unit of every claim operation, as redis-py keeps the token with its lock) and a
:class:`Record` (a live record, whichever way it was read: a claim refused by it, an operator's
look-up, the exactly-once mode's check).

Decisions (what a status means, what to do on failure) live in :mod:`rocketmq_dedup.strategy`;
a concrete store only implements the ``do_*`` hooks. The public methods wrap every error once:
a refusal a person must fix (what :meth:`DedupStore.misconfiguration` explains: a missing
privilege or ACL rule, a read-only server) becomes
:class:`~rocketmq_dedup.errors.StoreMisconfiguredError`, an outage (what
:meth:`DedupStore.is_outage` says) :class:`~rocketmq_dedup.errors.StoreUnavailableError`,
anything else (a missing table, a bug) :class:`~rocketmq_dedup.errors.StoreError`, with the
original chained as ``__cause__``; and they check that a store answered one result per claim (a
store that answers fewer is a defect, never a message run without dedup).

The start-up check (:func:`rocketmq_dedup.stores.check_usable`) reaches the store
(:meth:`DedupStore.check`), proves a server store can claim and release
(:meth:`DedupStore.prove_writes`: probe records through the store's own write path) and logs
what puts its records at risk (:meth:`DedupStore.risks`).

Contract every store honours (tested in ``tests/shared/store_contract.py``):

* ``claim`` is atomic: it either creates a CONSUMING record owned by the claim's owner (or takes
  over an expired one) and reports ``claimed=True``, or reports the live record. There is no
  window in which a vanished record lets two claimers both win.
* ``mark_consumed`` always leaves a CONSUMED record that lives ``retention_ms``, whoever owned
  the claim (a success is never lost, and a CONSUMED record is never downgraded).
* ``release`` deletes the record only if it is still a CONSUMING claim of that owner;
  ``renew_many`` extends a lease under the same condition.
* ``mark_failed`` leaves a FAILED record with its reason (at most :data:`MAX_REASON_LENGTH`
  characters) that lives ``retention_ms``, unless the record is CONSUMED (a success is never
  downgraded); a FAILED record refuses claims like a CONSUMED one.
* A claim reports how many claims of its element before it lapsed with their consumer gone
  (:attr:`ClaimResult.lapsed`: an expired CONSUMING claim taken over), since the record was
  last settled (marked, failed or released; a record that expired settled counts from 0).
"""

from __future__ import annotations

import abc
import logging
import time
from typing import (
    Any,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
)

from rocketmq_dedup.errors import (
    DedupError,
    StoreError,
    StoreMisconfiguredError,
    StoreUnavailableError,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at, new_owner_token
from rocketmq_dedup.status import DedupStatus

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: The probe records of :meth:`DedupStore.prove_writes` live under this topic, in the key space
#: of the application that checks (an ACL rule that lets it write its own records lets it write
#: them), and last at most :data:`PROBE_LEASE_MS` if the process dies before it releases them.
PROBE_TOPIC = "rocketmq-dedup-probe"
#: The application of the probe records when none is named (``rocketmq-dedup check``).
PROBE_APPLICATION = "rocketmq-dedup"
PROBE_LEASE_MS = 60_000

#: The longest reason a FAILED record keeps, in characters (a ``VARCHAR(255)`` column).
MAX_REASON_LENGTH = 255


def bounded_reason(reason: object) -> str:
    """A FAILED record's reason as the stores keep it: its text, whitespace runs (line breaks
    too) as one space, at most :data:`MAX_REASON_LENGTH` characters (the last one an ellipsis
    when cut; a NUL, which PostgreSQL's text refuses, as U+FFFD)."""
    text = " ".join(str(reason).replace("\x00", "\ufffd").split())
    if len(text) > MAX_REASON_LENGTH:
        text = text[: MAX_REASON_LENGTH - 1] + "\u2026"
    return text


class Claim(NamedTuple):
    """One attempt's hold on an element: what a claim creates, and what marking, releasing and
    renewing it need (the owner token proves the record is still this attempt's)."""

    element: DedupElement
    owner: str
    """The attempt's owner token (:mod:`rocketmq_dedup.owner`)."""


class Record(NamedTuple):
    """A live record, as any store reads it (one value for claims, operators and the
    exactly-once mode, as Powertools' ``DataRecord``)."""

    status: Optional[DedupStatus]
    """CONSUMING or CONSUMED; None when the store holds a value this library cannot read (e.g.
    written by another program)."""
    owner: Optional[str] = None
    """The owner token of the claim that wrote it, when the store reports it."""
    expires_in_ms: Optional[int] = None
    """Time left before the lease or the retention ends; None when unknown or never."""
    element: Optional[DedupElement] = None
    """Its element, when read by element or listed (on MySQL a listed record has the readable
    columns: the first 255 characters of each field)."""
    reason: Optional[str] = None
    """A FAILED record's reason, when the store reports it (``read``)."""


class ClaimResult(NamedTuple):
    """The outcome of a claim: claimed, or refused by a live record."""

    claimed: bool
    """True when this caller now owns a CONSUMING record for the element."""
    record: Optional[Record] = None
    """When not claimed: the live record in the way."""
    lapsed: int = 0
    """When claimed: how many claims of the element before this one lapsed with their
    consumer gone (an expired CONSUMING claim taken over: its handler never ended, the process
    died in it), since the record was last settled. 0 for a fresh claim, and from a store that
    does not count them (a Redis store counts only once :meth:`DedupStore.count_lapses` was
    called)."""

    @property
    def status(self) -> Optional[DedupStatus]:
        """CONSUMING when claimed, else the refusing record's status (None: unreadable)."""
        if self.claimed:
            return DedupStatus.CONSUMING
        return self.record.status if self.record is not None else None

    @property
    def holder(self) -> Optional[str]:
        """When not claimed: the owner token of the record in the way, if reported."""
        return self.record.owner if self.record is not None else None


class StoreStats(NamedTuple):
    """Live records of one application, by status, its longest-held claims, and its oldest
    CONSUMED record."""

    counts: Dict[str, int]
    """Records by status (``CONSUMING``, ``CONSUMED``; ``other`` for unreadable values)."""
    oldest_claims: List[Record]
    """CONSUMING records, longest held first (claims made by this library carry their time)."""
    oldest_consumed: Optional[Record] = None
    """The CONSUMED record with the least time left (the oldest, when every record has the
    same retention: its age is the retention less its time left, or its owner token's time);
    None when there is none."""


class Diagnosis(NamedTuple):
    """One check of ``rocketmq-dedup check``."""

    name: str
    ok: bool
    detail: str
    warning: bool = False
    """Passed, but names a setting that puts records at risk (a Redis that evicts keys)."""


# -- per-message values, built without the class call ---------------------------------------
# The one speed choice of issue 23's hot-path work that is kept, here and nowhere else.
# ``Claim(...)`` runs the NamedTuple's ``__new__``, a Python function entered from C: on CPython
# 3.11 about 0.1 us (1,200 instructions), where ``tuple.__new__(cls, values)`` is one C call. A
# fresh message builds its element and its claim, a duplicate on the memory store also the
# store's refusal (a record and a result). On a real path that is well under 1 % (a message
# through the broker costs 52-75 us of consumer CPU); it is kept for the listener's own cost,
# which the benchmarks hold to at most 1.25 times what it was before the consume path was made
# one (BENCHMARKS.md, "Issue 32": without these, 8 % more per fresh message and 13 % more per
# duplicate). Each function is typed like the class it builds and builds what the class would.


def new_element(application: str, topic: str, tag: str, key: str) -> DedupElement:
    """``DedupElement(application, topic, tag, key)``, for the path of every message."""
    return tuple.__new__(DedupElement, (application, topic, tag, key))


def new_claim(element: DedupElement, owner: str) -> Claim:
    """``Claim(element, owner)``, for the path of every message."""
    return tuple.__new__(Claim, (element, owner))


def refused_by(status: Optional[DedupStatus], owner: Optional[str]) -> ClaimResult:
    """``ClaimResult(False, Record(status, owner))``, a claim refused by a live record: for a
    store's path of every duplicate."""
    record = tuple.__new__(Record, (status, owner, None, None, None))
    return tuple.__new__(ClaimResult, (False, record, 0))


CLAIMED = ClaimResult(True)
HELD_BY_OTHER = ClaimResult(False, Record(DedupStatus.CONSUMING))
ALREADY_CONSUMED = ClaimResult(False, Record(DedupStatus.CONSUMED))


class DedupStore(abc.ABC):
    """Base class of the record stores (Redis, MySQL, memory)."""

    #: Exceptions of the underlying driver that mean "the store is unavailable" (an outage).
    outage_errors: Tuple[Type[BaseException], ...] = ()

    #: Whether :meth:`renew_many` works (lease renewal is skipped otherwise).
    supports_renewal = True

    #: Whether :meth:`prove_writes` probes the store (the server stores do; a store in memory
    #: cannot be misconfigured, and a user's store's claims may do what the library cannot
    #: know).
    proves_writes = False

    # -- public API: wraps driver errors, checks the number of results --------------------

    def claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        """Atomically claim ``claim.element`` for ``claim.owner`` for ``lease_ms`` ms."""
        return self._call(self.do_claim, claim, lease_ms)

    def claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        """Claim several elements at once: one result per claim, in order."""
        if len(claims) == 1:  # stores have cheaper single-element paths
            return [self._call(self.do_claim, claims[0], lease_ms)]
        if not claims:
            return []
        return self._one_each(self._call(self.do_claim_many, claims, lease_ms), claims, "claim")

    def mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        """Record the claim's element as CONSUMED for ``retention_ms`` milliseconds."""
        self._call(self.do_mark_consumed, claim, retention_ms)

    def mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        """Record several elements as CONSUMED at once."""
        if len(claims) == 1:  # stores have cheaper single-element paths
            self._call(self.do_mark_consumed, claims[0], retention_ms)
        elif claims:
            self._call(self.do_mark_consumed_many, claims, retention_ms)

    def mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        """Record the claim's element FAILED with ``reason`` (:func:`bounded_reason`) for
        ``retention_ms`` milliseconds, whoever holds it now, unless it is CONSUMED (a success
        is never downgraded). Settles the record: its lapsed claims count from 0 again."""
        self._call(self.do_mark_failed, claim, retention_ms, bounded_reason(reason))

    def count_lapses(self) -> None:  # noqa: B027 - optional hook
        """Count lapsed claims from now on (:attr:`ClaimResult.lapsed`; the config calls it
        when ``max_lapsed_claims`` is set). The SQL and memory stores always count (the record
        of a lapsed claim stays until it is purged or swept); the Redis store's record vanishes
        with its lease, so it keeps a counter beside it, at a cost, only once asked."""

    def release(self, claim: Claim) -> bool:
        """Delete the CONSUMING claim; False if it is no longer this owner's."""
        return bool(self._call(self.do_release, claim))

    def release_many(self, claims: Sequence[Claim]) -> int:
        """Release several claims; return how many were still owned and got deleted."""
        if len(claims) == 1:
            return int(self.release(claims[0]))
        if not claims:
            return 0
        released = int(self._call(self.do_release_many, claims))
        if not 0 <= released <= len(claims):
            raise StoreError(
                f"{self.describe()}: released {released} of {len(claims)} claims (a store defect)"
            )
        return released

    def renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        """Extend each claim still CONSUMING by its owner to ``lease_ms`` from now; return,
        per claim, whether it was still owned."""
        if not claims:
            return []
        return self._one_each(self._call(self.do_renew_many, claims, lease_ms), claims, "renew")

    def read(self, element: DedupElement) -> Optional[Record]:
        """The live record of ``element``, or None: the one reader (the CLI's ``inspect``,
        the exactly-once mode's checks, tests)."""
        return self._call(self.do_read, element)

    def read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        """The live records of several elements (one round trip where the store can)."""
        if len(elements) == 1:
            return [self.read(elements[0])]
        return self._one_each(self._call(self.do_read_many, elements), elements, "read")

    def get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        """The live record's status, or None when there is none (``read`` for the rest)."""
        record = self.read(element)
        return record.status if record is not None else None

    def check(self) -> None:
        """One round trip that proves the store is reachable (Redis: PING; MySQL: connect and
        ``SELECT CURRENT_USER()``); nothing is written. Raises :class:`StoreError`."""
        self._call(self.do_check)

    def prove_writes(self, application: str = PROBE_APPLICATION) -> None:
        """Prove the store can claim and release, through its own write path: claim a probe
        record alone and two more in one call, renew them, read one and release them
        (Redis: the commands and scripts a message costs; MySQL: INSERT, UPDATE, SELECT and
        DELETE on the table). The records live in ``application``'s key space under
        :data:`PROBE_TOPIC` and are gone afterwards. Raises
        :class:`~rocketmq_dedup.errors.StoreMisconfiguredError` naming the missing
        privilege, ACL rule or the read-only server, else :class:`StoreError`. Does nothing
        for a store that does not prove its writes (:attr:`proves_writes`)."""
        if not self.proves_writes:
            return
        owner = new_owner_token()
        elements = [DedupElement(application, PROBE_TOPIC, "", f"{owner}-{n}") for n in (1, 2, 3)]
        self._call(self.do_prove_writes, [Claim(element, owner) for element in elements])

    def risks(self) -> List[str]:
        """Settings of the server that put records at risk without failing any operation (a
        Redis ``maxmemory-policy`` that evicts keys), one sentence each: the start-up check
        logs them at WARNING. What the store may not read is logged at INFO and left out;
        never raises."""
        try:
            return self.do_risks()
        except Exception as exc:
            logger.info("%s: could not read the server's settings (%s)", self.describe(), exc)
            return []

    # -- operator API (the CLI) ---------------------------------------------------------

    def delete(self, element: DedupElement, force: bool = False) -> Optional[DedupStatus]:
        """Delete the live record of ``element`` if it is CONSUMING (a stuck claim; any owner),
        or whatever it is with ``force``. Returns the status of the record deleted, or None
        when nothing was deleted (no record; or CONSUMED without ``force``)."""
        return self._call(self.do_delete, element, force)

    def stats(self, application: str, limit: int = 10) -> StoreStats:
        """Live records of ``application`` by status, and its ``limit`` longest-held claims."""
        return self._call(self.do_stats, application, limit)

    def diagnose(self, application: str = PROBE_APPLICATION) -> List[Diagnosis]:
        """Checks of the server and the features this store uses (version, scripts, table
        layout, round-trip time) and, when they pass, of its writes
        (:meth:`prove_writes` in ``application``'s key space), for ``rocketmq-dedup check``."""
        checks = self._call(self.do_diagnose)
        # (after a failed check, e.g. a missing table, the probe would only repeat it)
        if self.proves_writes and all(check.ok for check in checks):
            checks.append(self._writes_diagnosis(application))
        return checks

    def _writes_diagnosis(self, application: str) -> Diagnosis:
        try:
            self.prove_writes(application)
        except StoreMisconfiguredError as exc:
            return Diagnosis("writes", False, f"{exc.fix} ({exc.__cause__ or exc})")
        except StoreError as exc:
            return Diagnosis("writes", False, str(exc.__cause__ or exc))
        return Diagnosis("writes", True, "claimed, renewed, read and released probe records")

    def describe(self) -> str:
        """Where the records live, for messages (an address; never a password)."""
        return type(self).__name__

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release client resources the store created itself (never the user's client)."""

    def is_outage(self, exc: BaseException) -> bool:
        """True if ``exc`` means the store is unavailable (an outage), not a defect; never
        for a :meth:`misconfiguration`."""
        return isinstance(exc, self.outage_errors)

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        """What a person must fix when ``exc`` is the server refusing for a reason that will
        not pass by itself (a missing privilege or ACL rule, a read-only server, refused
        credentials); None for anything else. The default knows none."""
        return None

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, its errors wrapped once (:meth:`wrap_error`)."""
        try:
            return fn(*args)
        except DedupError:
            raise
        except Exception as exc:
            raise self.wrap_error(exc) from exc

    def wrap_error(self, exc: Exception) -> StoreError:
        """The error a hook's ``exc`` becomes: :class:`StoreMisconfiguredError` for a refusal
        a person must fix (:meth:`misconfiguration`), :class:`StoreUnavailableError` for an
        outage (:meth:`is_outage`), else :class:`StoreError`; a store may tell more kinds apart
        (the Redis store: an exhausted client pool)."""
        message = f"{self.describe()}: {type(exc).__name__}: {exc}"
        fix = self.misconfiguration(exc)
        if fix is not None:
            return StoreMisconfiguredError(message, fix)
        kind = StoreUnavailableError if self.is_outage(exc) else StoreError
        return kind(message)

    def _one_each(self, results: List[T], asked: Sequence[Any], op: str) -> List[T]:
        """``results`` if it has one entry per item ``asked``; else a store defect (never a
        message left unclaimed and run without dedup)."""
        try:
            count = len(results)
        except TypeError:
            count = -1
        if count != len(asked):
            raise StoreError(
                f"{self.describe()}: {op} answered {count if count >= 0 else 'no list of'} "
                f"result(s) for {len(asked)} (a store defect)"
            )
        return results

    # -- I/O hooks -----------------------------------------------------------------------
    # The single-element hooks default to the batch ones; stores override them when one
    # element can be done cheaper.

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self._one_each(self.do_claim_many([claim], lease_ms), [claim], "claim")[0]

    @abc.abstractmethod
    def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]: ...

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        self.do_mark_consumed_many([claim], retention_ms)

    @abc.abstractmethod
    def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None: ...

    def do_release(self, claim: Claim) -> bool:
        return self.do_release_many([claim]) == 1

    @abc.abstractmethod
    def do_release_many(self, claims: Sequence[Claim]) -> int: ...

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot record FAILED")

    @abc.abstractmethod
    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]: ...

    @abc.abstractmethod
    def do_read(self, element: DedupElement) -> Optional[Record]: ...

    def do_read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        return [self.do_read(element) for element in elements]

    def do_check(self) -> None:  # noqa: B027 - optional hook
        """Prove the store is reachable; the default has nothing to check."""

    def do_prove_writes(self, claims: List[Claim]) -> None:
        """Claim the first probe alone and the others in one call, renew them all, read the
        first and release them all (the store's single and batch paths); raise what the store
        raised, or :class:`StoreError` when it answered wrong."""
        lease = PROBE_LEASE_MS
        try:
            results = [self.do_claim(claims[0], lease), *self.do_claim_many(claims[1:], lease)]
            if not all(result.claimed for result in results):
                raise StoreError(f"{self.describe()}: a new probe record was not claimed")
            # A longer lease than the claim's: a renewal that rewrites the same expiry in the
            # same millisecond changes no row, and MySQL counts only changed rows.
            if self.supports_renewal and not all(self.do_renew_many(claims, 2 * lease)):
                raise StoreError(f"{self.describe()}: a claimed probe record was not renewed")
            record = self.do_read(claims[0].element)
            if (
                record is None
                or record.status is not DedupStatus.CONSUMING
                or record.owner not in (None, claims[0].owner)
            ):
                raise StoreError(f"{self.describe()}: a claimed probe record reads {record}")
        except BaseException:
            try:  # best effort: the first error is the one to report
                self.do_release_many(claims)
            except Exception:
                logger.debug("releasing the probe records failed", exc_info=True)
            raise
        released = self.do_release_many(claims)
        if released != len(claims):
            raise StoreError(f"{self.describe()}: released {released} of {len(claims)} probes")

    def do_risks(self) -> List[str]:
        """Settings that put records at risk (see :meth:`risks`); the default knows none."""
        return []

    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]:
        raise NotImplementedError(f"{type(self).__name__} cannot delete records")

    def do_stats(self, application: str, limit: int) -> StoreStats:
        raise NotImplementedError(f"{type(self).__name__} cannot list records")

    def do_diagnose(self) -> List[Diagnosis]:
        begin = time.perf_counter()
        self.do_check()
        return [Diagnosis("reachable", True, round_trip(time.perf_counter() - begin))]


class PerElementStore(DedupStore):
    """A store whose batch hooks loop over its single-element hooks (memory, user stores):
    implement ``do_claim``, ``do_mark_consumed``, ``do_release`` and ``do_read``."""

    @abc.abstractmethod
    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult: ...

    @abc.abstractmethod
    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None: ...

    @abc.abstractmethod
    def do_release(self, claim: Claim) -> bool: ...

    def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return [self.do_claim(claim, lease_ms) for claim in claims]

    def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        for claim in claims:
            self.do_mark_consumed(claim, retention_ms)

    def do_release_many(self, claims: Sequence[Claim]) -> int:
        return sum(bool(self.do_release(claim)) for claim in claims)


def round_trip(seconds: float) -> str:
    """A round-trip time for a diagnosis line."""
    return f"round trip {seconds * 1000:.2f} ms"


def oldest_claims(records: List[Record], limit: int) -> List[Record]:
    """The CONSUMING records among ``records``, longest held first (then least time left)."""
    claims = [r for r in records if r.status is DedupStatus.CONSUMING]
    claims.sort(key=lambda r: (claimed_at(r.owner or "") or float("inf"), r.expires_in_ms or 0))
    return claims[:limit]


def oldest_consumed(records: List[Record]) -> Optional[Record]:
    """The CONSUMED record among ``records`` with the least time left, or None."""
    consumed = [r for r in records if r.status is DedupStatus.CONSUMED]
    return min(consumed, key=lambda r: r.expires_in_ms or 0, default=None)


def records_stats(records: List[Record], limit: int) -> StoreStats:
    """:class:`StoreStats` of the listed ``records`` of one application (the stores that list
    every record: Redis, memory)."""
    return StoreStats(
        count_statuses(records), oldest_claims(records, limit), oldest_consumed(records)
    )


def count_statuses(records: List[Record]) -> Dict[str, int]:
    """Records by status value (``other`` for unreadable ones)."""
    counts: Dict[str, int] = {}
    for record in records:
        name = record.status.value if record.status is not None else "other"
        counts[name] = counts.get(name, 0) + 1
    return counts


def parse_status(value: Optional[str]) -> Optional[DedupStatus]:
    """Map a stored status text (``CONSUMING``, ``CONSUMED``, ``FAILED``, optionally
    ``:owner``) to the enum."""
    if not value:
        return None
    if value.startswith("CONSUMED"):
        return DedupStatus.CONSUMED
    if value.startswith("CONSUMING"):
        return DedupStatus.CONSUMING
    if value.startswith("FAILED"):
        return DedupStatus.FAILED
    return None
