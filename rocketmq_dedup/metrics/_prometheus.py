"""Prometheus metrics (the ``[prometheus]`` extra: prometheus_client).

The hot path appends an event to a deque (atomic, no lock); events are folded into plain dicts
in batches, and a prometheus_client custom collector turns those into metric families when the
registry is scraped. A labelled ``Counter``/``Histogram`` costs several lock round trips per
observation (one per value and bucket): measured at 5 us per message, most of the listener's
own cost on a fast store.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import MissingExtraError
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp

try:
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
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

    def observe(self, seconds: float) -> None:
        """Count one observation (the caller holds the lock)."""
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def family_args(self) -> Tuple[List[Tuple[str, float]], float]:
        cumulative, total = [], 0
        for bound, n in zip(self.bounds, self.buckets, strict=False):
            total += n
            cumulative.append((repr(float(bound)), float(total)))
        cumulative.append(("+Inf", float(self.count)))
        return cumulative, self.sum


#: Pending events that make a consumer thread fold them into the totals.
FOLD_AT = 4096
_MESSAGE, _STORE = "message", "store"


def _histogram(
    histograms: Dict[Tuple[str, Any], _Histogram], key: Tuple[str, Any], bounds: Sequence[float]
) -> _Histogram:
    histogram = histograms.get(key)
    if histogram is None:
        histogram = histograms[key] = _Histogram(bounds)
    return histogram


class PrometheusMetrics(DedupMetrics):
    """Counters and histograms in a prometheus_client registry (the default one if None).

    * ``rocketmq_dedup_messages_total{app, topic, outcome}``
    * ``rocketmq_dedup_lease_renewals_total{app}``, ``rocketmq_dedup_leases_lost_total{app}``
    * ``rocketmq_dedup_store_seconds{app, op}`` (histogram; ``op``: claim, mark_consumed,
      release, renew)
    * ``rocketmq_dedup_handler_seconds{app, topic}`` (histogram)

    Labels never carry a key or a message id. Serve them as usual, e.g.
    ``prometheus_client.start_http_server(8000)``.
    """

    def __init__(self, registry: Optional[Any] = None) -> None:
        self._lock = threading.Lock()  # held while folding events into the totals
        self._events: Deque[Tuple[Any, ...]] = deque()
        self._messages: Dict[Tuple[str, str, Any], int] = {}
        self._renewals: Dict[str, int] = {}
        self._lost: Dict[str, int] = {}
        self._store: Dict[Tuple[str, Any], _Histogram] = {}  # (app, StoreOp)
        self._handler: Dict[Tuple[str, Any], _Histogram] = {}  # (app, topic)
        target = prometheus_client.REGISTRY if registry is None else registry
        target.register(self)

    # -- DedupMetrics --------------------------------------------------------------------
    # A consumer thread only appends an event (deque.append is atomic); events are folded into
    # the totals in batches, under the lock, when a message finds FOLD_AT of them pending, and
    # at each scrape. (Store operations come with messages, so messages bound the backlog.)

    def message(self, decision: Decision) -> None:
        events = self._events
        events.append((_MESSAGE, decision))
        if len(events) >= FOLD_AT:
            self._fold()

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        self._events.append((_STORE, application, op, seconds))  # folded with the next message

    def _fold(self) -> None:
        """Move the pending events into the totals."""
        events, messages = self._events, self._messages
        with self._lock:
            while events:
                try:
                    event = events.popleft()
                except IndexError:  # taken by a concurrent fold
                    break
                if event[0] is _MESSAGE:
                    app, topic, outcome, _, _, seconds = event[1]
                    key = (app, topic, outcome)
                    messages[key] = messages.get(key, 0) + 1
                    if seconds is not None:
                        _histogram(self._handler, (app, topic), HANDLER_BUCKETS).observe(seconds)
                else:
                    _, app, op, seconds = event
                    _histogram(self._store, (app, op), STORE_BUCKETS).observe(seconds)

    def leases(self, application: str, renewed: int, lost: int) -> None:
        with self._lock:
            self._renewals[application] = self._renewals.get(application, 0) + renewed
            self._lost[application] = self._lost.get(application, 0) + lost

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
            store = {(a, op.value): h.family_args() for (a, op), h in self._store.items()}
            handler = {k: h.family_args() for k, h in self._handler.items()}
        family = CounterMetricFamily(
            "rocketmq_dedup_messages",
            "Messages by what the dedup listener did with them",
            labels=["app", "topic", "outcome"],
        )
        for (app, topic, outcome), value in messages.items():
            family.add_metric([app, topic, outcome.value], value)
        yield family
        for name, doc, values in (
            ("rocketmq_dedup_lease_renewals", "CONSUMING leases extended", renewals),
            ("rocketmq_dedup_leases_lost", "Claims found taken over at renewal", lost),
        ):
            family = CounterMetricFamily(name, doc, labels=["app"])
            for app, value in values.items():
                family.add_metric([app], value)
            yield family
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
