"""A fake of the exactly-once mode's transaction port (rocketmq_dedup.stores.transaction) over
the memory store, for unit tests of the exactly-once decisions without a database, and its
asyncio face (the same fake, awaited). The real ports are tested against MariaDB and
PostgreSQL in tests/integration/exactly_once/ and tests/integration/test_aio_exactly_once.py.

The fake database: committed records are the memory store's (what the strategy reads), the
business writes a list of committed values, sequence numbers a dict, key locks a dict of their
holders. A transaction stages its writes and its sequence step, and applies them at commit.
Faults are injected per step (``FakeTransactions.fail``) and a handler's misuse through its
``conn`` (``conn.misuse``)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.aio import AsyncMemoryDedupStore
from rocketmq_dedup.stores.base import Claim, Record
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.stores.transaction import (
    AsyncTransaction,
    AsyncTransactionSource,
    Entity,
    KeyClaim,
    SequenceStep,
    Transaction,
    TransactionSource,
)


class FakeConn:
    """The handler's ``conn``: ``write(value)`` stages a business write; setting ``misuse``
    (e.g. "called commit() on its connection") makes the transaction report it."""

    def __init__(self) -> None:
        self.writes: List[Any] = []
        self.misuse: Optional[str] = None

    def write(self, value: Any) -> None:
        self.writes.append(value)


class FakeTransaction(Transaction):
    def __init__(self, source: FakeTransactions) -> None:
        self.source = source
        self.conn = FakeConn()
        self.committed = False
        self.closed = False
        self._lock: Optional[DedupElement] = None

    def _step(self, name: str) -> None:
        """Raise the fault injected for this step, if any (once)."""
        self.source.steps.append(name)
        fault = self.source.fail.pop(name, None)
        if fault is not None:
            raise fault

    def claim_key(self, element: DedupElement, entity: Optional[Entity]) -> KeyClaim:
        self._step("claim_key")
        with self.source.lock:
            holder = self.source.key_locks.get(element)
            if holder is not None and holder is not self:
                return KeyClaim(False)
            self.source.key_locks[element] = self
            self._lock = element
        last = self.source.sequences.get(entity) if entity is not None else None
        return KeyClaim(True, self.source.store.read(element), last)

    def lock_sequence(self, entity: Entity) -> Optional[int]:
        self._step("lock_sequence")
        return self.source.sequences.get(entity)

    def before_handler(self) -> None:
        self._step("before_handler")

    def run_handler(self, handler: Callable[[Any, Any], Any], msg: Any) -> Any:
        self.source.steps.append("run_handler")
        return handler(msg, self.conn)

    def misuse(self) -> Optional[str]:
        return self.conn.misuse

    def commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        applied: Optional[SequenceStep] = None,
    ) -> Optional[Record]:
        self._step("commit_record")
        store = self.source.store
        with self.source.lock:
            existing = store.read(element)
            if existing is not None:
                return existing
            store.mark_consumed(Claim(element, owner), retention_ms)
            if applied is not None:
                self.source.sequences[applied.entity] = applied.seq
            self._apply()
        self._step("after_commit")
        return None

    def commit_failure(
        self, element: DedupElement, owner: str, retention_ms: int, reason: str
    ) -> Optional[Record]:
        self._step("commit_failure")
        self.conn.writes.clear()  # the handler's writes, rolled back
        store = self.source.store
        with self.source.lock:
            existing = store.read(element)
            if existing is not None:
                return existing
            store.mark_failed(Claim(element, owner), retention_ms, reason)
            self.committed = True
        return None

    def commit(self) -> None:
        self._step("commit")
        with self.source.lock:
            self._apply()

    def _apply(self) -> None:
        self.source.committed += self.conn.writes
        self.committed = True

    def close(self) -> None:
        self.closed = True
        with self.source.lock:
            if self._lock is not None and self.source.key_locks.get(self._lock) is self:
                del self.source.key_locks[self._lock]
        self.source.open -= 1


class FakeTransactions(TransactionSource):
    """The fake database and its transactions (module docstring)."""

    def __init__(self, store: MemoryDedupStore) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.committed: List[Any] = []
        self.sequences: Dict[Entity, int] = {}
        self.key_locks: Dict[DedupElement, Any] = {}
        self.fail: Dict[str, BaseException] = {}
        self.steps: List[str] = []
        self.begun = 0
        self.open = 0

    def begin(self, hold_seconds: int) -> Transaction:
        self.steps.append("begin")
        fault = self.fail.pop("begin", None)
        if fault is not None:
            raise fault
        self.begun += 1
        self.open += 1
        return FakeTransaction(self)

    def hold_key(self, element: DedupElement) -> None:
        """Another consumer's transaction holds ``element``'s lock (in its handler)."""
        self.key_locks[element] = object()


class FakeTransactionalStore(MemoryDedupStore):
    """A memory store with the fake transaction port."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = FakeTransactions(self)


class AsyncFakeTransaction(AsyncTransaction):
    """A :class:`FakeTransaction`, awaited (the asyncio port); the handler is awaited."""

    def __init__(self, tx: FakeTransaction) -> None:
        self.tx = tx
        self.conn = tx.conn

    async def claim_key(self, element: DedupElement) -> KeyClaim:
        return self.tx.claim_key(element, None)

    async def before_handler(self) -> None:
        self.tx.before_handler()

    async def run_handler(self, handler: Callable[[Any, Any], Any], msg: Any) -> Any:
        self.tx.source.steps.append("run_handler")
        return await handler(msg, self.conn)

    async def misuse(self) -> Optional[str]:
        return self.tx.misuse()

    async def commit_record(
        self, element: DedupElement, owner: str, retention_ms: int
    ) -> Optional[Record]:
        return self.tx.commit_record(element, owner, retention_ms)

    async def commit(self) -> None:
        self.tx.commit()

    async def close(self) -> None:
        self.tx.close()


class AsyncFakeTransactions(AsyncTransactionSource):
    """:class:`FakeTransactions`' transactions, awaited."""

    def __init__(self, source: FakeTransactions) -> None:
        self.source = source

    async def begin(self, hold_seconds: int) -> AsyncTransaction:
        return AsyncFakeTransaction(self.source.begin(hold_seconds))  # type: ignore[arg-type]


class AsyncFakeTransactionalStore(AsyncMemoryDedupStore):
    """The asyncio memory store over a :class:`FakeTransactionalStore`, with the fake's
    transactions awaited."""

    def __init__(self) -> None:
        self.fake = FakeTransactionalStore()
        super().__init__(self.fake)
        self.transactions = AsyncFakeTransactions(self.fake.transactions)
