"""The relay: sends what the outbox holds, after the commit, and marks each row sent once the
broker acknowledged it.

A relay runs in a thread of its own, in the consumer process (``outbox.relay(producer)
.start()``, stopped with the listener's config) or alone (``rocketmq-dedup relay``). Any number
of relays may serve one outbox at once, on any hosts. Its loop:

1. **Claim** up to ``batch_size`` rows (:meth:`OutboxTables.claim
   <rocketmq_dedup.stores.outbox.OutboxTables.claim>`): rows without a sharding key, and the
   head of each sharding key with up to ``run - 1`` rows that follow it. A claim holds its rows
   for ``lease_s``: other relays skip them.
2. **Send** them, ``concurrency`` at a time (a sharding key's run one after the other: a row is
   sent only once the one before it was acknowledged), each with its message key.
3. **Settle**: acknowledged rows SENT (with the broker's message id); failed rows back to
   PENDING after a backoff, or PARKED (below); rows not tried (the lease running out, the relay
   stopping, an outage) released at once.
4. Claim again at once while rows come; else wait for a wake-up (the exactly-once listener
   wakes the relays of this process after a transaction that sent commits) or
   ``poll_interval_s`` (rows written elsewhere).

**On each fault** (:class:`~rocketmq_dedup.outbox.senders.FailureKind`):

* *Broker or proxy down, timeouts, busy* (``OUTAGE``): the row waits, the rest of the batch is
  released untried, and the relay pauses, doubling from 0.5 s up to 30 s while sends keep
  failing (reset by a success). Never parked: nothing is lost, the rows go once it is back.
* *The message refused for good* (``REFUSED``: too large, a FIFO/NORMAL topic mismatch, a
  forbidden topic...): PARKED at once with the client's reason; the rows of its sharding key
  wait behind it (``outbox retry`` or ``outbox drop`` releases them), all others go on.
* *No route for the topic* (``UNROUTABLE``: missing topic, or the cluster restarting; the
  classic client also says so for a message its broker refused, and for a route briefly
  missing): retried with backoff (0.2 s doubling to 60 s per attempt); PARKED once another
  send succeeded since its first failure (the cluster is up: this topic is the problem) and it
  failed ``proof_attempts`` times, or after ``give_up_after_s`` in any case.
* *Anything else* (``UNKNOWN``): retried with backoff, PARKED after ``give_up_after_s``.
* *The database down*: the claim or the settle fails; the relay retries (backoff up to 30 s).
  A settle that cannot be written before the lease ends leaves its sent rows to be sent again
  after the lease (same message key).
* *The relay killed* (SIGKILL, a crash) between a send and its settle: its claimed rows go back
  to the relays when their lease ends, and are sent again **with the same message key**: at
  least once on the wire; a listener downstream that dedups on the key applies them once.
* *A relay frozen past its lease* (SIGSTOP, a long GC pause): another relay may send its rows
  too (same key); before each send a relay checks that its lease has at least a fifth left,
  and stops its batch otherwise.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.metrics import DedupMetrics
from rocketmq_dedup.outbox.outbox import Outbox
from rocketmq_dedup.outbox.senders import FailureKind, Sender, SendFailure, sender_for
from rocketmq_dedup.owner import owner_tokens
from rocketmq_dedup.stores.outbox import ClaimedRow, Failure

logger = logging.getLogger(__name__)

#: The relay-wide pause after an outage: from this, doubling, up to the next.
PAUSE_S = (0.5, 30.0)
#: A row's backoff after a failed send: from this, doubling per attempt, up to the next.
BACKOFF_S = (0.2, 60.0)


@dataclass
class _Batch:
    """One claim's rows and what became of them."""

    rows: List[ClaimedRow]
    deadline: float  # time.monotonic() after which no row of the claim is sent
    sent: List[Tuple[int, str]] = field(default_factory=list)
    failed: List[Failure] = field(default_factory=list)
    released: List[int] = field(default_factory=list)
    outage: bool = False  # a send met an outage: the rest is released untried
    topics: Dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def groups(self) -> List[List[ClaimedRow]]:
        """Rows sent one after the other: a sharding key's run, or a row without one."""
        groups: List[List[ClaimedRow]] = []
        for row in self.rows:
            lane = row.message.sharding_key
            if lane is not None and groups and groups[-1][0].message.sharding_key == lane:
                groups[-1].append(row)
            else:
                groups.append([row])
        return groups


class OutboxRelay:
    """Sends an outbox's rows through a producer (module docstring); ``start()`` /
    ``close()``, or ``with``. One relay per producer; any number per outbox.

    :param outbox: the :class:`~rocketmq_dedup.outbox.Outbox` to relay.
    :param producer: a started classic ``rocketmq.client.Producer`` (name server set), a
        started 5.x ``rocketmq.Producer``, or a :class:`~.senders.Sender`. The relay never
        shuts it down.
    :param batch_size: rows claimed at a time.
    :param run: rows of one sharding key claimed together (sent in order, one after the
        other).
    :param concurrency: sends in flight at once (threads; both clients release the GIL while
        they wait for the broker).
    :param poll_interval_s: the longest wait for rows when nothing wakes the relay.
    :param lease_s: how long a claim holds its rows (another relay takes them after it).
    :param give_up_after_s: a row whose sends keep failing (no route, or an error the relay
        cannot place) is parked after this long.
    :param proof_attempts: a row without a route is parked after this many failed sends once
        another send succeeded since its first failure.
    :param backlog_interval_s: how often the backlog gauges are refreshed (one query).
    :param linger_s: after a claim that found rows but fewer than ``batch_size``, wait this
        long before the next one, so that under load a claim carries several rows (a claim
        costs the same round trips for one row as for 64); an idle relay woken by a commit
        claims at once.
    :param metrics: where the counts go (default: the outbox's config's ``metrics``).
    """

    def __init__(
        self,
        outbox: Outbox,
        producer: Any,
        *,
        batch_size: int = 64,
        run: int = 16,
        concurrency: int = 4,
        poll_interval_s: float = 1.0,
        lease_s: float = 30.0,
        give_up_after_s: float = 3600.0,
        proof_attempts: int = 3,
        backlog_interval_s: float = 10.0,
        linger_s: float = 0.005,
        metrics: Optional[DedupMetrics] = None,
    ) -> None:
        if not isinstance(outbox, Outbox):
            raise DedupConfigError(f"OutboxRelay needs an Outbox; got {outbox!r}")
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("run", run, 1),
            ("concurrency", concurrency, 1),
            ("proof_attempts", proof_attempts, 1),
        ):
            if type(value) is not int or value < low:
                raise DedupConfigError(f"{name} must be an int >= {low}; got {value!r}")
        for name, seconds in (
            ("poll_interval_s", poll_interval_s),
            ("lease_s", lease_s),
            ("give_up_after_s", give_up_after_s),
            ("backlog_interval_s", backlog_interval_s),
        ):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
                raise DedupConfigError(f"{name} must be positive seconds; got {seconds!r}")
        if isinstance(linger_s, bool) or not isinstance(linger_s, (int, float)) or linger_s < 0:
            raise DedupConfigError(f"linger_s must be seconds, 0 or more; got {linger_s!r}")
        self.outbox = outbox
        self.tables = outbox.tables
        self.sender: Sender = sender_for(producer)
        self.batch_size, self.run, self.concurrency = batch_size, run, concurrency
        self.poll_interval_s = float(poll_interval_s)
        self.lease_s = float(lease_s)
        self.give_up_after_s = float(give_up_after_s)
        self.proof_attempts = proof_attempts
        self.backlog_interval_s = float(backlog_interval_s)
        self.linger_s = float(linger_s)
        self.metrics = metrics if metrics is not None else outbox.metrics
        self._log = RateLimitedLog(logger)
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pause_s = 0.0  # the relay-wide pause after an outage (0: none)
        self._db_pause_s = 0.0  # the same after the database failed
        self._last_success: Optional[float] = None  # time.monotonic() of the last ack
        self._next_backlog = 0.0
        self._lifecycle = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> OutboxRelay:
        """Start the relay's thread (once; a closed relay does not start again). With an
        outbox made from a config, ``listener.close()`` (which closes the config) closes it."""
        with self._lifecycle:
            if self._thread is not None:
                return self
            if self.concurrency > 1:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix="rocketmq-dedup-relay-send"
                )
            self._thread = threading.Thread(
                target=self._loop, name=f"rocketmq-dedup-relay {self.outbox.name}", daemon=True
            )
            self.outbox._attach(self)
            if self.outbox.config is not None:
                self.outbox.config.on_close(self.close)
            self._thread.start()
        logger.info("relay of %s started (%s client)", self.outbox.describe(), self.sender.client)
        return self

    def wake(self) -> None:
        """Claim now instead of at the next poll (rows committed)."""
        self._wakeup.set()

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop: the sends in flight finish (each within its client's timeout) and are settled,
        the rows claimed and not tried are released to the other relays. Waits up to
        ``timeout`` seconds (default: the lease)."""
        self._stopping.set()
        self._wakeup.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.lease_s if timeout is None else timeout)
            if thread.is_alive():
                logger.warning("relay of %s did not stop in time", self.outbox.describe())
        self.outbox._detach(self)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> OutboxRelay:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                claimed = self.run_once()
            except Exception:  # never let the thread die: log, wait, go on
                self._log.log(logging.ERROR, "the relay's loop failed; going on", exc_info=True)
                claimed = 0
                self._stopping.wait(1.0)
            if self._stopping.is_set():
                break
            pause = max(self._pause_s, self._db_pause_s)
            if pause:
                self._stopping.wait(pause)
            elif not claimed:
                self._wakeup.wait(self.poll_interval_s)
            elif claimed < self.batch_size and self.linger_s:
                # busy: let the next commits gather, so the next claim carries more rows
                self._stopping.wait(self.linger_s)

    def run_once(self) -> int:
        """One round: claim, send, settle; returns how many rows were claimed (0: none
        waiting). The relay's thread runs it in a loop; a test or ``rocketmq-dedup relay
        --once`` may call it directly."""
        self._wakeup.clear()
        self._report_backlog()
        owner = owner_tokens.next()
        lease_ms = int(self.lease_s * 1000)
        try:
            rows = self.tables.claim(owner, self.batch_size, self.run, lease_ms)
        except StoreError as exc:
            self._database_failed("claiming rows", exc)
            return 0
        self._db_pause_s = 0.0
        if not rows:
            return 0
        # a fifth of the lease is kept for the last send and the settle
        batch = _Batch(rows, time.monotonic() + self.lease_s * 0.8)
        self._send_all(batch)
        self._settle(owner, batch)
        self._report(batch)
        return len(rows)

    def _send_all(self, batch: _Batch) -> None:
        """The batch's groups over ``concurrency`` senders, each taking its share in turn
        (one task per sender, not per row: a task costs a thread hand-off)."""
        groups = batch.groups()
        shares = [groups[i :: self.concurrency] for i in range(min(self.concurrency, len(groups)))]
        if self._pool is None or len(shares) == 1:
            self._send_share(batch, groups)
            return
        futures = [self._pool.submit(self._send_share, batch, share) for share in shares[1:]]
        self._send_share(batch, shares[0])  # the relay's thread sends a share too
        for future in futures:
            future.result()

    def _send_share(self, batch: _Batch, groups: List[List[ClaimedRow]]) -> None:
        for group in groups:
            self._send_group(batch, group)

    def _send_group(self, batch: _Batch, group: List[ClaimedRow]) -> None:
        """Send a run in order (or a single row); stop at its first failure: what follows a
        failed row of a sharding key must not go before it."""
        for index, row in enumerate(group):
            if batch.outage or self._stopping.is_set() or time.monotonic() > batch.deadline:
                with batch.lock:
                    batch.released += [r.id for r in group[index:]]
                return
            try:
                message_id = self.sender.send(row.message)
            except SendFailure as failure:
                self._failed(batch, row, failure)
                with batch.lock:
                    batch.released += [r.id for r in group[index + 1 :]]
                return
            except Exception as exc:  # a Sender of the user's that does not classify
                self._failed(batch, row, SendFailure(FailureKind.UNKNOWN, repr(exc)))
                with batch.lock:
                    batch.released += [r.id for r in group[index + 1 :]]
                return
            self._last_success = time.monotonic()
            with batch.lock:
                batch.sent.append((row.id, message_id))
                batch.topics[row.id] = row.message.topic

    def _failed(self, batch: _Batch, row: ClaimedRow, failure: SendFailure) -> None:
        decision = self.decide(row, failure)
        with batch.lock:
            batch.failed.append(decision)
            batch.topics[row.id] = row.message.topic
            if failure.kind is FailureKind.OUTAGE:
                batch.outage = True
        level = logging.ERROR if decision.park else logging.WARNING
        self._log.log(
            level,
            "outbox row %d (topic %s, key %s) not sent: %s; %s",
            row.id,
            row.message.topic,
            row.message.message_key,
            failure.reason,
            "parked" if decision.park else f"retried in {decision.retry_in_ms / 1000:.1f} s",
        )

    def decide(self, row: ClaimedRow, failure: SendFailure) -> Failure:
        """What becomes of a row whose send failed (module docstring, "on each fault")."""
        attempts = row.attempts + 1
        reason = f"{failure.kind.value}: {failure.reason}"
        if failure.kind is FailureKind.REFUSED:
            return Failure(row.id, reason, park=True)
        if failure.kind is FailureKind.OUTAGE:
            return Failure(row.id, reason, park=False, retry_in_ms=int(self._next_pause() * 1000))
        failing_s = (row.failing_for_ms or 0) / 1000
        if failing_s >= self.give_up_after_s:
            return Failure(row.id, f"{reason} (failing for {failing_s:.0f} s)", park=True)
        if failure.kind is FailureKind.UNROUTABLE and attempts >= self.proof_attempts:
            last = self._last_success
            # a send succeeded since this row first failed: the cluster is up, the topic is not
            if (
                last is not None
                and row.failing_for_ms is not None
                and (time.monotonic() - last < failing_s)
            ):
                return Failure(
                    row.id, f"{reason} (while other sends succeeded: the topic?)", park=True
                )
        backoff = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** min(row.attempts, 16))
        backoff *= random.uniform(0.8, 1.2)  # (relays out of step after an outage)
        return Failure(row.id, reason, park=False, retry_in_ms=int(backoff * 1000))

    def _next_pause(self) -> float:
        """The relay-wide pause after one more batch that met an outage."""
        return min(PAUSE_S[1], max(PAUSE_S[0], self._pause_s * 2))

    def _settle(self, owner: str, batch: _Batch) -> None:
        """Write what became of the batch; retried (the database may be down) until the lease
        is nearly over: then the sent rows are sent again after it (same message keys). A
        batch that met an outage pauses the relay (its untried rows wait as long); one without
        resets the pause."""
        if batch.outage:
            self._pause_s = self._next_pause()
        elif batch.sent:
            self._pause_s = 0.0
        release_in_ms = int(self._pause_s * 1000) if batch.outage else 0
        delay = 0.2
        while True:
            try:
                self.tables.settle(owner, batch.sent, batch.failed, batch.released, release_in_ms)
                return
            except StoreError as exc:
                if time.monotonic() + delay > batch.deadline + self.lease_s * 0.15:
                    self._log.log(
                        logging.ERROR,
                        "could not mark %d sent outbox row(s) (%s): they will be sent again "
                        "after their lease, with the same message keys",
                        len(batch.sent),
                        exc,
                    )
                    return
                self._database_failed("marking rows sent", exc)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _database_failed(self, what: str, exc: StoreError) -> None:
        self._db_pause_s = min(PAUSE_S[1], max(PAUSE_S[0], self._db_pause_s * 2))
        self._log.log(
            logging.WARNING,
            "outbox relay: %s failed (%s); retrying in %.1f s",
            what,
            exc,
            self._db_pause_s,
        )

    # -- metrics ------------------------------------------------------------------------------

    def _report(self, batch: _Batch) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        name = self.outbox.name
        sent = Counter(batch.topics[i] for i, _ in batch.sent)
        failed = Counter(batch.topics[f.id] for f in batch.failed if not f.park)
        parked = Counter(batch.topics[f.id] for f in batch.failed if f.park)
        try:
            for topic, n in sent.items():
                metrics.outbox_sent(name, topic, n)
            for topic, n in failed.items():
                metrics.outbox_failed(name, topic, n)
            for topic, n in parked.items():
                metrics.outbox_parked(name, topic, n)
        except Exception:
            self._log.log(logging.ERROR, "the metrics object raised; ignored", exc_info=True)

    def _report_backlog(self) -> None:
        metrics = self.metrics
        now = time.monotonic()
        if metrics is None or now < self._next_backlog:
            return
        self._next_backlog = now + self.backlog_interval_s
        try:
            backlog = self.tables.backlog()
        except StoreError as exc:
            self._log.log(logging.WARNING, "outbox relay: the backlog query failed (%s)", exc)
            return
        oldest = None if backlog.oldest_pending_ms is None else backlog.oldest_pending_ms / 1000
        try:
            metrics.outbox_backlog(self.outbox.name, backlog.pending, oldest, backlog.parked)
        except Exception:
            self._log.log(logging.ERROR, "the metrics object raised; ignored", exc_info=True)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<OutboxRelay {self.outbox.describe()} via {self.sender.client}, {state}>"


__all__ = ["OutboxRelay"]
