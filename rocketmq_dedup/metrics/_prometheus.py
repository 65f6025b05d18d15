"""Prometheus metrics (the ``[prometheus]`` extra: prometheus_client).

The hot path only appends (a decision to a deque, a store timing to a list: atomic, no lock);
they are folded into plain dicts in batches, counted and bucketed in C (``map``, ``Counter``,
``sum``), and a prometheus_client custom collector turns those into metric families when the
registry is scraped. A labelled ``Counter``/``Histogram`` costs several lock round trips per
observation (one per value and bucket): measured at 5 us per message, most of the listener's
own cost on a fast store.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import Counter
from operator import itemgetter
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import MissingExtraError
from rocketmq_dedup.metrics import Decision, DedupMetrics, Outcome, StoreOp

try:
    import prometheus_client
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
except ImportError as exc:  # pragma: no cover - exercised by the no-extras import test
    raise MissingExtraError("prometheus_client", "prometheus") from exc

#: Store round trips are sub-millisecond on a LAN; handlers take milliseconds to minutes.
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)


class _Histogram:
    """Bucket counts (not cumulative), sum and count of one label set."""

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def family_args(self) -> Tuple[List[Tuple[str, float]], float]:
        cumulative, total = [], 0
        for bound, n in zip(self.bounds, self.buckets, strict=False):
            total += n
            cumulative.append((repr(float(bound)), float(total)))
        cumulative.append(("+Inf", float(self.count)))
        return cumulative, self.sum


_APP_TOPIC = itemgetter(0, 1)  # of a pending entry
_HANDLER_SECONDS = itemgetter(3)  # of a kept decision


def _take(pending: List[Any]) -> List[Any]:
    """What ``pending`` holds now, taken off it in two atomic steps (an append or extend
    meanwhile lands after them and stays for the next time)."""
    n = len(pending)
    taken = pending[:n]
    del pending[:n]
    return taken


def _grouped(
    entries: Sequence[Tuple[Any, ...]], key: Any, column: Any
) -> Dict[Tuple[Any, ...], List[float]]:
    """``column`` of ``entries`` by ``key`` (an ``itemgetter``), Nones left out."""
    grouped: Dict[Tuple[Any, ...], List[float]] = {}
    for entry in entries:
        value = column(entry)
        if value is not None:
            grouped.setdefault(key(entry), []).append(value)
    return grouped


def _columns_by_app_topic(
    flat: List[Any],
) -> Iterator[Tuple[str, str, List[float], List[float], List[float]]]:
    """Handled messages, pending as ``_HANDLED_WIDTH`` values each in one flat list, as
    (application, topic, handler seconds, claim seconds, mark seconds) columns, one per
    (application, topic): slices of the list, so one pair (the usual batch) needs no Python
    loop over its entries."""
    if not flat:
        return
    width = _HANDLED_WIDTH
    apps, topics = flat[0::width], flat[1::width]
    if apps.count(apps[0]) == len(apps) and topics.count(topics[0]) == len(topics):
        yield apps[0], topics[0], flat[2::width], flat[3::width], flat[4::width]
        return
    grouped: Dict[Tuple[str, str], List[Any]] = {}  # the three timings of each entry, flat
    for start in range(0, len(flat), width):
        grouped.setdefault((flat[start], flat[start + 1]), []).extend(
            flat[start + 2 : start + width]
        )
    timings = width - 2
    for (app, topic), group in grouped.items():
        yield app, topic, group[0::timings], group[1::timings], group[2::timings]


#: Pending entries that make a consumer thread fold them into the totals. Small: a long
#: backlog outlives young GC collections and is walked again by older ones (4096 cost 0.04 of
#: memory_fresh's rate).
FOLD_AT = 512

#: Values a handled message adds to the flat pending list: application, topic, handler,
#: claim and mark seconds. Flat, not a tuple per message: a pending tuple would be a
#: container the cyclic GC counts and walks until the fold (0.08 us a message measured); a
#: tuple extended into the list and dropped at once is not.
_HANDLED_WIDTH = 5
_FOLD_AT_HANDLED_VALUES = FOLD_AT * _HANDLED_WIDTH  # (computed once, not per message)

#: What is kept of a Decision until the fold: (application, topic, outcome, handler seconds),
#: not the message (a pending decision must not keep a message's body alive).
_KEPT = itemgetter(0, 1, 2, 5)
_LABELS = itemgetter(0, 1, 2)  # of a kept decision


def _histogram(
    histograms: Dict[Tuple[Any, ...], _Histogram], key: Tuple[Any, ...], bounds: Sequence[float]
) -> _Histogram:
    histogram = histograms.get(key)
    if histogram is None:
        histogram = histograms[key] = _Histogram(bounds)
    return histogram


def _observe_all(histogram: _Histogram, seconds: Sequence[float]) -> None:
    """Count observations into ``histogram`` (the caller holds the lock), in C: when the
    smallest and the largest fall in one bucket (the usual batch: a store or a handler that
    takes about the same time each call) that bucket gets them all; else they are sorted once
    and each bucket's count is a bisection. Either costs a fraction of bisecting the bounds
    once per value. A value equal to a bound is in that bound's bucket (``le``)."""
    if not seconds:
        return
    bounds, buckets = histogram.bounds, histogram.buckets
    last = bisect_left(bounds, max(seconds))
    if last == 0 or last == bisect_left(bounds, min(seconds)):  # (0: the first bucket holds all)
        buckets[last] += len(seconds)
    else:
        ordered = sorted(seconds)
        below = 0
        for index, bound in enumerate(bounds):
            upto = bisect_right(ordered, bound, below)
            buckets[index] += upto - below
            below = upto
        buckets[-1] += len(ordered) - below
    histogram.sum += sum(seconds)
    histogram.count += len(seconds)


class PrometheusMetrics(DedupMetrics):
    """Counters and histograms in a prometheus_client registry (the default one if None).

    * ``rocketmq_dedup_messages_total{app, topic, outcome}``
    * ``rocketmq_dedup_lease_renewals_total{app}``, ``rocketmq_dedup_leases_lost_total{app}``
    * ``rocketmq_dedup_store_seconds{app, op}`` (histogram of the calls that succeeded; ``op``:
      claim, mark_consumed, release, renew)
    * ``rocketmq_dedup_store_errors_total{app, op}`` (the calls that failed: an outage or a
      store defect; they are not in the histogram, where a call refused in a millisecond would
      pass for a fast one)
    * ``rocketmq_dedup_handler_seconds{app, topic}`` (histogram)
    * ``rocketmq_dedup_purge_deleted_total{table}`` and the gauge
      ``rocketmq_dedup_purge_lag_seconds{table}`` (a running :class:`~rocketmq_dedup.Purger`)

    Every outcome and the handler histogram of a topic, every op's error counter and histogram
    and both lease counters of an application are exported at 0 from its first message, so
    that ``increase()`` and ``rate()`` see an event's first occurrence. Labels never carry a
    key or a message id. Serve them as usual, e.g. ``prometheus_client.start_http_server(8000)``.
    """

    wants_start_time = False  # counters and histograms have no use for it

    def __init__(self, registry: Optional[Any] = None) -> None:
        self._lock = threading.Lock()  # held while folding events into the totals
        self._decisions: List[Tuple[str, str, Any, Optional[float]]] = []  # _KEPT
        #: handled(): application, topic, handler, claim and mark seconds, flat (_HANDLED_WIDTH)
        self._handled: List[Any] = []
        self._extend_handled = self._handled.extend
        self._timings: Dict[Tuple[str, Any], List[float]] = {}  # (app, StoreOp): pending
        self._messages: Dict[Tuple[str, str, Any], int] = {}
        self._renewals: Dict[str, int] = {}
        self._lost: Dict[str, int] = {}
        self._errors: Dict[Tuple[str, Any], int] = {}  # (app, StoreOp): failed calls
        self._store: Dict[Tuple[str, Any], _Histogram] = {}  # (app, StoreOp)
        self._handler: Dict[Tuple[str, Any], _Histogram] = {}  # (app, topic)
        self._purged: Dict[str, int] = {}  # table: rows deleted
        self._purge_lag: Dict[str, float] = {}  # table: seconds
        target = prometheus_client.REGISTRY if registry is None else registry
        target.register(self)

    # -- DedupMetrics --------------------------------------------------------------------
    # A consumer thread only appends (deque.append and list.append are atomic); the pending
    # decisions and timings are folded into the totals, under the lock, when a message finds
    # FOLD_AT decisions pending, and at each scrape. (Store operations come with messages, so
    # messages bound the backlog.)

    def message(self, decision: Decision) -> None:
        decisions = self._decisions
        decisions.append(_KEPT(decision))
        if len(decisions) >= FOLD_AT:
            self._fold()

    def handled(
        self,
        application: str,
        topic: str,
        message: Any,
        started_ns: int,
        handler_seconds: float,
        claim_seconds: float,
        mark_seconds: float,
    ) -> None:
        """:meth:`message` and the two :meth:`store_operation` calls of a handled message, in
        one call and one extend (atomic: a tuple's values land together), for the next fold."""
        self._extend_handled((application, topic, handler_seconds, claim_seconds, mark_seconds))
        if len(self._handled) >= _FOLD_AT_HANDLED_VALUES:
            self._fold()

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        if not ok:  # rare (an outage or a defect): counted at once, under the lock
            with self._lock:
                self._errors[application, op] = self._errors.get((application, op), 0) + 1
            return
        timings = self._timings.get((application, op))
        if timings is None:
            timings = self._timings.setdefault((application, op), [])
        timings.append(seconds)

    def _fold(self) -> None:
        """Move the pending decisions and timings into the totals. Only this method takes
        them off, under the lock, so what it counted at the start is there to take; what is
        appended meanwhile waits for the next fold. Grouped, counted and bucketed in C
        (``map``, slices, ``sorted``, ``bisect``): a batch of one label set, the usual one,
        needs no Python loop over its entries."""
        with self._lock:
            decisions = _take(self._decisions)
            handled = _take(self._handled)
            messages = self._messages
            if decisions:
                for labels, n in Counter(map(_LABELS, decisions)).items():
                    messages[labels] = messages.get(labels, 0) + n
                for key, durations in _grouped(decisions, _APP_TOPIC, _HANDLER_SECONDS).items():
                    _observe_all(_histogram(self._handler, key, HANDLER_BUCKETS), durations)
            for app, topic, handler, claim, mark in _columns_by_app_topic(handled):
                labels = (app, topic, Outcome.CONSUMED)
                messages[labels] = messages.get(labels, 0) + len(handler)
                _observe_all(_histogram(self._handler, (app, topic), HANDLER_BUCKETS), handler)
                _observe_all(_histogram(self._store, (app, StoreOp.CLAIM), STORE_BUCKETS), claim)
                _observe_all(
                    _histogram(self._store, (app, StoreOp.MARK_CONSUMED), STORE_BUCKETS), mark
                )
            for key, timings in list(self._timings.items()):
                if timings:
                    _observe_all(_histogram(self._store, key, STORE_BUCKETS), _take(timings))

    def leases(self, application: str, renewed: int, lost: int) -> None:
        with self._lock:
            self._renewals[application] = self._renewals.get(application, 0) + renewed
            self._lost[application] = self._lost.get(application, 0) + lost

    def purge(self, table: str, deleted: int, lag_seconds: float) -> None:
        with self._lock:
            self._purged[table] = self._purged.get(table, 0) + deleted
            self._purge_lag[table] = lag_seconds

    # -- prometheus_client collector -----------------------------------------------------

    def describe(self) -> List[Any]:
        """No families up front (they are labelled; the registry then calls collect)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families, for a scrape."""
        self._fold()
        with self._lock:
            messages = dict(self._messages)
            renewals, lost = dict(self._renewals), dict(self._lost)
            errors = dict(self._errors)
            apps = {app for app, _ in self._store} | {app for app, _ in errors}
            store = {(a, op.value): h.family_args() for (a, op), h in self._store.items()}
            handler = {k: h.family_args() for k, h in self._handler.items()}
            purged, purge_lag = dict(self._purged), dict(self._purge_lag)
        family = CounterMetricFamily(
            "rocketmq_dedup_messages",
            "Messages by what the dedup listener did with them",
            labels=["app", "topic", "outcome"],
        )
        topics = {(app, topic) for app, topic, _ in messages}
        for app, topic in sorted(topics):
            for outcome in Outcome:
                family.add_metric(
                    [app, topic, outcome.value], messages.get((app, topic, outcome), 0)
                )
        yield family
        apps |= {app for app, _ in topics} | renewals.keys() | lost.keys()
        for name, doc, values in (
            ("rocketmq_dedup_lease_renewals", "CONSUMING leases extended", renewals),
            ("rocketmq_dedup_leases_lost", "Claims found taken over at renewal", lost),
        ):
            family = CounterMetricFamily(name, doc, labels=["app"])
            for app in sorted(apps):
                family.add_metric([app], values.get(app, 0))
            yield family
        family = CounterMetricFamily(
            "rocketmq_dedup_store_errors",
            "Dedup store calls that failed (not in rocketmq_dedup_store_seconds)",
            labels=["app", "op"],
        )
        for app in sorted(apps):
            for op in StoreOp:
                family.add_metric([app, op.value], errors.get((app, op), 0))
        yield family
        for kind, name, doc, by_table in (
            (
                CounterMetricFamily,
                "rocketmq_dedup_purge_deleted",
                "Expired rows deleted by the in-process purger",
                purged,
            ),
            (
                GaugeMetricFamily,
                "rocketmq_dedup_purge_lag_seconds",
                "How long the longest-expired row the purge's current pass met had been expired",
                purge_lag,
            ),
        ):
            if by_table:  # a process whose purger never ran exports none
                table_family = kind(name, doc, labels=["table"])
                for table, value in sorted(by_table.items()):
                    table_family.add_metric([table], value)
                yield table_family
        empty_store, empty_handler = _Histogram(STORE_BUCKETS), _Histogram(HANDLER_BUCKETS)
        for app in apps:
            for op in StoreOp:
                store.setdefault((app, op.value), empty_store.family_args())
        for key in topics:
            handler.setdefault(key, empty_handler.family_args())
        for name, doc, labels, histograms in (
            ("rocketmq_dedup_store_seconds", "Duration of dedup store calls", ["app", "op"], store),
            (
                "rocketmq_dedup_handler_seconds",
                "Duration of do_handle_msg",
                ["app", "topic"],
                handler,
            ),
        ):
            hfamily = HistogramMetricFamily(name, doc, labels=labels)
            for label_values, (buckets, total) in histograms.items():
                hfamily.add_metric(list(label_values), buckets, total)
            yield hfamily
