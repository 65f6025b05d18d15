"""The listener called from real native threads, as librocketmq calls it (rocketmq-client-python).

A ctypes callback arriving on a thread Python did not start runs on a fresh Python thread state
that is destroyed when it returns, so a ``threading.local`` is empty in every callback (proved
below). A store that keeps one connection per thread-local therefore opens one per message:
the user report this suite pins had 151 MySQL connections after 200 callbacks on one native
thread, then "Too many connections", dedup off and handlers running twice.

The C side (tests/native/callback_thread.c) starts pthreads that call the listener through a
``ctypes.CFUNCTYPE`` callback without holding the GIL, and records every returned status.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional

import MySQLdb
import pytest
import redis

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig
from rocketmq_dedup.testing import ClassicMessage
from tests.native import UNSET, run_callbacks
from tests.support import REDIS_URL, mysql_connect

pytestmark = pytest.mark.usefixtures("fresh_thread_states")

TABLE = "t_rocketmq_dedup_native"  # created if missing, never dropped: shared with other runs
THREADS = 4
#: Connections a store may open for any scenario here (MySQL: a small pool; Redis: the store's
#: own connection, plus one from the client's pool).
MAX_CONNECTIONS = {"mysql": THREADS, "redis": 2}
#: The connection factory refuses past this many open connections (as the server would at
#: max_connections), so a store leaking connections cannot exhaust the shared MariaDB.
CONNECTION_CAP = 64
SUCCESS, LATER = int(ConsumeStatus.CONSUME_SUCCESS), int(ConsumeStatus.RECONSUME_LATER)


# -- the native library and what crosses the boundary ------------------------------------


@pytest.fixture
def unraisable() -> Iterator[List[str]]:
    """Exceptions that escaped a ctypes callback: ctypes reports them as unraisable and hands
    the C side an undefined status (observed: a stale value; librocketmq then acks)."""
    seen: List[str] = []
    previous = sys.unraisablehook

    def hook(info: Any) -> None:
        seen.append(f"{info.err_msg}: {info.exc_type.__name__}: {info.exc_value}")

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        sys.unraisablehook = previous


@dataclass
class Run:
    """One run_callbacks call, as both sides saw it."""

    c_successes: int
    c_statuses: List[int]
    py_statuses: List[int]
    idents: List[int]


def drive(
    lib: ctypes.CDLL, consume: Callable[[int], ConsumeStatus], threads: int, calls: int
) -> Run:
    """Native threads call ``consume(index)``; record each status on both sides of the call.
    An exception escaping ``consume`` leaves its Python status UNSET (its C status undefined)."""
    py_statuses = [UNSET] * (threads * calls)
    idents = [0] * (threads * calls)

    def callback(index: int) -> int:
        idents[index] = threading.get_ident()
        status = int(consume(index))
        py_statuses[index] = status
        return status

    successes, c_statuses = run_callbacks(lib, callback, threads, calls)
    return Run(successes, c_statuses, py_statuses, idents)


def assert_clean_run(run: Run, unraisable: List[str], threads: int) -> None:
    """Every callback returned a status on its own native thread and nothing escaped to C."""
    assert unraisable == []
    assert run.c_statuses == run.py_statuses
    assert UNSET not in run.c_statuses
    assert run.c_successes == run.c_statuses.count(SUCCESS)
    assert len(set(run.idents)) == threads
    assert threading.get_ident() not in run.idents


# -- the stores, with their connections counted --------------------------------------------


class CountingConnect:
    """A MySQL connection factory (mysqlclient) that counts the connections asked of it."""

    def __init__(self, cap: int = CONNECTION_CAP) -> None:
        self._connect = mysql_connect()
        self._cap = cap
        self._lock = threading.Lock()
        self.calls = 0
        self.refused = 0
        self.opened: List[Any] = []
        self._reserved = 0  # connections opened or being opened

    def __call__(self) -> Any:
        with self._lock:
            self.calls += 1
            if self._reserved >= self._cap:
                self.refused += 1
                raise MySQLdb.OperationalError(1040, f"Too many connections (test cap {self._cap})")
            self._reserved += 1
        try:
            conn = self._connect()
        except BaseException:
            with self._lock:
                self._reserved -= 1
            raise
        with self._lock:
            self.opened.append(conn)
        return conn

    def close_all(self) -> None:
        for conn in self.opened:
            with contextlib.suppress(MySQLdb.Error):  # already closed by the store
                conn.close()


class CountingRedisConnection(redis.Connection):
    """A real redis-py connection that counts its socket connects, per client name."""

    opened: ClassVar[Dict[str, int]] = Counter()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def _connect(self) -> Any:
        with self._lock:
            self.opened[self.client_name or ""] += 1
        return super()._connect()


@dataclass
class StoreHarness:
    """One store kind under test: builds configs and reports the connections they opened."""

    kind: str
    app: str
    client_name: str = field(default_factory=lambda: f"native-{uuid.uuid4().hex[:12]}")
    mysql_factory: Optional[CountingConnect] = None
    redis_client: Optional[redis.Redis] = None
    configs: List[DedupConfig] = field(default_factory=list)

    def config(self) -> DedupConfig:
        options: Dict[str, Any] = {"dedup_record_reserve_minutes": 10}
        client: Any
        if self.kind == "mysql":
            self.mysql_factory = self.mysql_factory or CountingConnect()
            client, options["table_name"] = self.mysql_factory, TABLE
        else:
            self.redis_client = self.redis_client or redis.Redis.from_url(
                REDIS_URL, client_name=self.client_name, connection_class=CountingRedisConnection
            )
            client = self.redis_client
        config = DedupConfig.enable_dedup_consume_config(self.app, client, **options)
        self.configs.append(config)
        return config

    def connections_opened(self) -> int:
        """MySQL: how many connections the store asked the factory for; Redis: how many
        sockets the client's connection class opened."""
        if self.mysql_factory is not None:
            return self.mysql_factory.calls
        return CountingRedisConnection.opened[self.client_name]

    def connections_open(self) -> int:
        """Connections open right now (MySQL: the factory's still open; Redis: CLIENT LIST
        entries with this client's name)."""
        if self.mysql_factory is not None:
            return sum(1 for conn in self.mysql_factory.opened if conn.open)
        admin = redis.Redis.from_url(REDIS_URL)
        try:
            return sum(1 for c in admin.client_list() if c.get("name") == self.client_name)
        finally:
            admin.close()

    def describe(self) -> str:
        if self.mysql_factory is not None:
            f = self.mysql_factory
            return f"MySQL factory: {f.calls} calls, {len(f.opened)} opened, {f.refused} refused"
        return f"Redis: {self.connections_opened()} opened, {self.connections_open()} open"

    def close(self) -> None:
        for config in self.configs:
            if config.persist is not None:
                config.persist.close()
        if self.mysql_factory is not None:
            self.mysql_factory.close_all()
            conn = mysql_connect()()
            try:
                conn.cursor().execute(
                    f"DELETE FROM {TABLE} WHERE application_name = %s", (self.app,)
                )
                conn.commit()
            finally:
                conn.close()
        if self.redis_client is not None:
            keys = list(self.redis_client.scan_iter(match=f"MSGDEDUP:{self.app}:*", count=1000))
            if keys:
                self.redis_client.delete(*keys)
            self.redis_client.close()


@pytest.fixture(scope="module")
def native_table() -> str:
    """The dedup table of this module (created if missing; records are per application)."""
    try:
        mysql_connect()().close()
    except MySQLdb.Error as exc:
        pytest.fail(f"MariaDB is not reachable: run scripts/services.sh up ({exc})")
    config = DedupConfig.enable_dedup_consume_config("setup", mysql_connect(), table_name=TABLE)
    assert config.persist is not None
    try:
        config.persist.create_table()  # type: ignore[attr-defined]
    finally:
        config.persist.close()
    return TABLE


@pytest.fixture(params=["redis", "mysql"])
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    """Each shared store, under a unique application name; records deleted afterwards."""
    if request.param == "mysql":
        request.getfixturevalue("native_table")
    else:
        request.getfixturevalue("redis_client")  # fails the test if Redis is unreachable
    store = StoreHarness(request.param, f"native-{uuid.uuid4().hex}")
    yield store
    store.close()


def assert_bounded_connections(harness: StoreHarness, calls: int) -> None:
    limit = MAX_CONNECTIONS[harness.kind]
    assert harness.connections_opened() <= limit, (
        f"the {harness.kind} store asked for {harness.connections_opened()} connections in "
        f"{calls} native callbacks (at most {limit} expected): {harness.describe()}"
    )
    assert harness.connections_open() <= limit, harness.describe()


# -- listeners -------------------------------------------------------------------------------


class RecordingListener(DedupConcurrentListener):
    """Dedups on the business key in the body; records every key its handler ran."""

    def __init__(self, config: DedupConfig, work_seconds: float = 0.0) -> None:
        super().__init__(config)
        self.work_seconds = work_seconds
        self.failing = True  # bodies starting with b"boom" raise while True
        self.runs: Counter[str] = Counter()
        self._lock = threading.Lock()

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        if msg.body == b"bad-key":
            raise ValueError("no dedup key in this message")
        return str(msg.body.decode())

    def do_handle_msg(self, msg: Any) -> bool:
        with self._lock:
            self.runs[msg.body.decode()] += 1
        if self.work_seconds:
            time.sleep(self.work_seconds)  # the handler's work: lets the other threads in
        if self.failing and msg.body.startswith(b"boom"):
            raise ValueError(f"handler failed on {msg.body!r}")
        return True


class DefaultKeyListener(DedupConcurrentListener):
    """The library's default key (UNIQ_KEY, else the message id); records the key it ran."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.runs: Counter[Optional[str]] = Counter()
        self._lock = threading.Lock()

    def do_handle_msg(self, msg: Any) -> bool:
        with self._lock:
            self.runs[self.dedup_message_key(msg)] += 1
        return True


# -- the thread-state fact -------------------------------------------------------------------


def local_probe(local: threading.local, seen: List[Optional[int]]) -> Callable[[int], int]:
    """A callback recording what ``local.value`` held on entry, then setting it to its index."""

    def probe(index: int) -> int:
        seen[index] = getattr(local, "value", None)
        local.value = index
        return SUCCESS

    return probe


def test_threading_local_is_lost_between_native_callbacks(native_lib: ctypes.CDLL) -> None:
    """A threading.local set in one native callback is gone in the next on the same thread."""
    calls = 20
    local, seen = threading.local(), [None] * calls
    run = drive(native_lib, local_probe(local, seen), 1, calls)
    assert run.c_successes == calls
    assert len(set(run.idents)) == 1  # one native thread made every call...
    assert seen == [None] * calls  # ...yet every call found the thread-local empty


def test_threading_local_survives_on_a_python_thread() -> None:
    """Control: on a Python thread the same probe does see the previous call's value."""
    calls = 20
    local, seen = threading.local(), [None] * calls
    probe = local_probe(local, seen)
    thread = threading.Thread(target=lambda: [probe(i) for i in range(calls)])
    thread.start()
    thread.join(10)
    assert seen == [None, *range(calls - 1)]


# -- the stores behind native threads --------------------------------------------------------


def test_one_native_thread_runs_each_key_once(
    native_lib: ctypes.CDLL, harness: StoreHarness, unraisable: List[str]
) -> None:
    """One native thread, 200 keys each delivered twice: one run per key, few connections."""
    keys = 200
    listener = RecordingListener(harness.config())

    def consume(index: int) -> ConsumeStatus:
        key = f"key-{index % keys}"  # the second round re-sends every key (new message id)
        return listener(ClassicMessage(f"{harness.app}-{index}", body=key.encode()))

    run = drive(native_lib, consume, 1, 2 * keys)
    assert_clean_run(run, unraisable, 1)
    assert_bounded_connections(harness, 2 * keys)
    assert run.c_successes == 2 * keys
    assert listener.runs == Counter({f"key-{k}": 1 for k in range(keys)})


def test_default_key_from_native_callbacks(
    native_lib: ctypes.CDLL, harness: StoreHarness, unraisable: List[str]
) -> None:
    """The default key (UNIQ_KEY, else the message id) dedups redeliveries on a native thread."""
    messages = 100

    def message(index: int) -> ClassicMessage:
        n, delivery = index % messages, index // messages
        if n % 2:  # a producer resend: a new message id, the same UNIQ_KEY
            return ClassicMessage(f"{harness.app}-{n}-{delivery}", uniq_key=f"{harness.app}-u{n}")
        return ClassicMessage(f"{harness.app}-{n}")  # a redelivery: the same message id

    listener = DefaultKeyListener(harness.config())
    run = drive(native_lib, lambda index: listener(message(index)), 1, 2 * messages)
    assert_clean_run(run, unraisable, 1)
    assert_bounded_connections(harness, 2 * messages)
    assert run.c_successes == 2 * messages
    expected = {f"{harness.app}-u{n}" if n % 2 else f"{harness.app}-{n}" for n in range(messages)}
    assert listener.runs == Counter(dict.fromkeys(expected, 1))


def test_native_threads_race_on_overlapping_keys(
    native_lib: ctypes.CDLL, harness: StoreHarness, unraisable: List[str]
) -> None:
    """4 native threads x 100 calls on shared keys: one run per key, connections bounded."""
    calls, keys = 100, 100
    listener = RecordingListener(harness.config(), work_seconds=0.001)

    def key_of(index: int) -> str:  # threads 0 and 2 (1 and 3) send the keys in the same order
        thread, call = divmod(index, calls)
        return f"key-{(call + 50 * thread) % keys}"

    def consume(index: int) -> ConsumeStatus:
        return listener(ClassicMessage(f"{harness.app}-{index}", body=key_of(index).encode()))

    run = drive(native_lib, consume, THREADS, calls)
    assert_clean_run(run, unraisable, THREADS)
    assert_bounded_connections(harness, THREADS * calls)
    assert set(run.c_statuses) <= {SUCCESS, LATER}
    assert listener.runs == Counter({f"key-{k}": 1 for k in range(keys)})

    # The broker redelivers what was answered RECONSUME_LATER (a copy still in its handler).
    def redeliver(indexes: List[int]) -> List[int]:
        retry = drive(native_lib, lambda n: consume(indexes[n]), 1, len(indexes))
        assert_clean_run(retry, unraisable, 1)
        return [indexes[n] for n, status in enumerate(retry.c_statuses) if status == LATER]

    pending = [i for i, status in enumerate(run.c_statuses) if status == LATER]
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        pending = redeliver(pending)
    assert pending == []
    assert listener.runs == Counter({f"key-{k}": 1 for k in range(keys)})
    assert_bounded_connections(harness, THREADS * calls)


def test_failures_in_native_callbacks_answer_reconsume_later(
    native_lib: ctypes.CDLL, harness: StoreHarness, unraisable: List[str]
) -> None:
    """A raising handler or dedup_message_key answers RECONSUME_LATER; nothing escapes to C."""
    groups = 20
    listener = RecordingListener(harness.config())
    bodies = [b"ok-%d", b"boom-%d", b"bad-key"]

    def body(index: int) -> bytes:
        template = bodies[index % 3]
        return template % (index // 3) if b"%d" in template else template

    def consume(index: int) -> ConsumeStatus:
        return listener(ClassicMessage(f"{harness.app}-{index}", body=body(index)))

    run = drive(native_lib, consume, 1, 3 * groups)
    assert_clean_run(run, unraisable, 1)
    assert run.c_statuses == [SUCCESS, LATER, LATER] * groups
    assert run.c_successes == groups
    expected = {**{f"ok-{g}": 1 for g in range(groups)}, **{f"boom-{g}": 1 for g in range(groups)}}
    assert listener.runs == Counter(expected)

    # The failed handlers' claims were released: their redeliveries run (and now succeed).
    listener.failing = False
    retry = drive(native_lib, lambda n: consume(3 * n + 1), 1, groups)
    assert_clean_run(retry, unraisable, 1)
    assert retry.c_successes == groups
    assert listener.runs == Counter({k: 2 if k.startswith("boom") else 1 for k in expected})
    assert_bounded_connections(harness, 4 * groups)
