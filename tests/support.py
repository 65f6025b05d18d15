"""Test helpers: polling, server settings, a private PostgreSQL server, a duck-typed store,
metric readers, a fresh Python process. Messages of both client shapes and a clock the test
moves: rocketmq_dedup.testing (public)."""

from __future__ import annotations

import functools
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.stores.base import Claim

REPO = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("DEDUP_REDIS_URL", "redis://127.0.0.1:16379/0")
REDIS_CLUSTER_URL = os.environ.get("DEDUP_REDIS_CLUSTER_URL", "redis://127.0.0.1:17000/0")
REDIS_SENTINEL = os.environ.get("DEDUP_REDIS_SENTINEL", "127.0.0.1:26379")
REDIS_SENTINEL_MASTER = os.environ.get("DEDUP_REDIS_SENTINEL_MASTER", "mymaster")
MYSQL = {
    "host": os.environ.get("DEDUP_MYSQL_HOST", "127.0.0.1"),
    "port": int(os.environ.get("DEDUP_MYSQL_PORT", "13306")),
    "user": os.environ.get("DEDUP_MYSQL_USER", "dedup"),
    "password": os.environ.get("DEDUP_MYSQL_PASSWORD", "dedup"),
    "database": os.environ.get("DEDUP_MYSQL_DATABASE", "dedup_test"),
}


#: PostgreSQL as scripts/services.sh starts it (``services.sh env``: DEDUP_PG_DSN).
PG_DSN = os.environ.get("DEDUP_PG_DSN", "postgresql://dedup:dedup@127.0.0.1:15432/dedup_test")
STATE_ROOT = Path(os.environ.get("ROCKETMQ_DEDUP_STATE_ROOT", "/tmp/rocketmq-dedup"))


def _rocketmq_address(variable: str, port_variable: str, port: str) -> str:
    """``variable`` (``services.sh env`` sets it), else 127.0.0.1 and the port that
    ``scripts/rocketmq.sh`` used (its ``ROCKETMQ_DEDUP_*_PORT`` variable, or the default)."""
    return os.environ.get(variable) or f"127.0.0.1:{os.environ.get(port_variable) or port}"


ROCKETMQ_NAMESRV = _rocketmq_address("ROCKETMQ_NAMESRV", "ROCKETMQ_DEDUP_NAMESRV_PORT", "9876")
ROCKETMQ_PROXY = _rocketmq_address("ROCKETMQ_PROXY", "ROCKETMQ_DEDUP_GRPC_PORT", "8081")


def mysql_connect(driver: str = "mysqlclient", **overrides: Any) -> Callable[[], Any]:
    """A zero-argument connection factory, as users pass it to DedupConfig: ``driver`` is
    ``mysqlclient``, ``pymysql`` or ``mysql-connector`` (mysql-connector-python)."""
    params = {**MYSQL, **overrides}
    if driver == "pymysql":
        import pymysql

        return functools.partial(pymysql.connect, **params)
    if driver == "mysql-connector":
        import mysql.connector

        return functools.partial(mysql.connector.connect, **params)
    if driver != "mysqlclient":
        raise ValueError(f"unknown MySQL driver {driver!r}")
    import MySQLdb

    return functools.partial(MySQLdb.connect, **params)


def sql(query: str, *params: Any) -> List[Any]:
    """One statement on a new autocommit connection to the test database; its rows."""
    conn = mysql_connect()()
    try:
        conn.autocommit(True)
        cur = conn.cursor()
        cur.execute(query, params)
        return list(cur.fetchall())
    finally:
        conn.close()


def pg_connect(dsn: str = PG_DSN, **options: Any) -> Callable[[], Any]:
    """A zero-argument psycopg connection factory, as users pass it to DedupConfig (make_store
    recognises a partial of psycopg.connect)."""
    import psycopg

    return functools.partial(psycopg.connect, dsn, **options)


def pg_query(sql: str, *params: Any, dsn: str = PG_DSN) -> List[Any]:
    """Run one statement on a connection of its own (autocommit); its rows, if any."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def pg_bindir() -> str:
    """The PostgreSQL server's binaries (``services.sh env``: DEDUP_PG_BINDIR; else the
    newest Debian keeps under /usr/lib/postgresql)."""
    found = os.environ.get("DEDUP_PG_BINDIR") or max(
        (os.path.dirname(p) for p in glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")),
        key=lambda p: int(p.split("/")[-2]),
        default="",
    )
    if not found:
        raise AssertionError("no PostgreSQL server binaries: run scripts/services.sh up postgres")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """A PostgreSQL server of a test's own, for tests that stop or kill it (never the shared
    one): its own cluster under the state directory, a free port on 127.0.0.1, trust
    authentication for the superuser ``postgres``, run as the ``postgres`` OS user when the
    tests run as root (the server refuses root), stopped by the PID in its postmaster.pid."""

    def __init__(self, name: str) -> None:
        self.home = STATE_ROOT / "pg-private" / f"{name}-{os.getpid()}"
        self.data = self.home / "data"
        self.port = free_port()
        self.pid: Optional[int] = None
        self.reaped_in = 0.0
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._bin = pg_bindir()

    def _run(self, *command: str) -> None:
        prefix = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
        argv = [*(prefix if os.geteuid() == 0 else []), *command]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{command[0]} failed: {result.stderr[-2000:]}"

    def create(self) -> PrivatePostgres:
        """initdb the cluster (once) and start the server."""
        subprocess.run(["rm", "-rf", str(self.home)], check=True)
        (self.home / "run").mkdir(parents=True)
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", str(self.home)], check=True)
        self._run(
            f"{self._bin}/initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C.UTF-8",
        )  # fmt: skip
        return self.start()

    def standby(self, name: str) -> PrivatePostgres:
        """A hot standby of this server, started: ``pg_basebackup -R`` (streaming replication,
        which ``initdb`` lets 127.0.0.1 do without a password) into a cluster of its own on
        its own port. It serves reads and refuses writes, as a replica does."""
        replica = PrivatePostgres(name)
        subprocess.run(["rm", "-rf", str(replica.home)], check=True)
        (replica.home / "run").mkdir(parents=True)
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", str(replica.home)], check=True)
        replica._run(
            f"{self._bin}/pg_basebackup", "-D", str(replica.data), "-R", "-X", "stream",
            "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
        )  # fmt: skip
        return replica.start()

    def start(self) -> PrivatePostgres:
        """Start the server on its port and wait until it takes connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.home / 'run'} -c fsync=off"
        )
        log = self.home / "postgres.log"
        try:
            self._run(
                f"{self._bin}/pg_ctl", "-D", str(self.data), "-l", str(log),
                "-w", "-t", "60", "-s", "-o", options, "start",
            )  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log}:\n{log.read_text()[-2000:]}") from None
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return self

    def _signal(self, send: Callable[[int], None]) -> None:
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            send(pid)
        except ProcessLookupError:
            return
        # the backends too: a new server refuses to start while one still holds the old
        # server's shared memory
        wait_for(lambda: not _group_alive(pid), timeout=60, interval=0.05)
        # A killed server leaves its lock files (postmaster.pid, the socket's), which a new one
        # trusts while their PID exists, a zombie included: wait until its reaper (PID 1, which
        # may take a while) has reaped it.
        begin = time.monotonic()
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=60, interval=0.05)
        self.reaped_in = time.monotonic() - begin

    def stop(self) -> None:
        """Stop the server (SIGINT, a fast shutdown: its clients are disconnected)."""
        self._signal(lambda pid: os.kill(pid, signal.SIGINT))

    def kill(self) -> None:
        """SIGKILL the server and its backends at once (pg_ctl starts the server in a session
        of its own: its process group is the server's)."""
        self._signal(lambda pid: os.killpg(pid, signal.SIGKILL))

    def destroy(self) -> None:
        self.stop()
        subprocess.run(["rm", "-rf", str(self.home)], check=True)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies count as gone)."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(") ", 1)[-1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def fresh_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (this interpreter) in a fresh process at the repository's root, its
    output as text; the test fails with the process's stderr unless it exits 0."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def last_json_line(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON value a process printed last (its report)."""
    return json.loads(result.stdout.splitlines()[-1])


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


class DuckStore:
    """A user's own store, duck-typed (``claim``, ``mark_consumed``, ``release``, ``renew``,
    ``get_status``, ``mark_failed``, ``read``), as ``DedupConfig`` accepts it through the
    adapter; records in memory."""

    def __init__(self) -> None:
        from rocketmq_dedup import MemoryDedupStore

        self._records = MemoryDedupStore()

    def claim(self, element: Any, owner: str, lease_ms: int) -> Any:
        return self._records.claim(Claim(element, owner), lease_ms)

    def mark_consumed(self, element: Any, owner: str, retention_ms: int) -> None:
        self._records.mark_consumed(Claim(element, owner), retention_ms)

    def release(self, element: Any, owner: str) -> bool:
        return self._records.release(Claim(element, owner))

    def renew(self, element: Any, owner: str, lease_ms: int) -> bool:
        return self._records.renew_many([Claim(element, owner)], lease_ms)[0]

    def get_status(self, element: Any) -> Any:
        return self._records.get_status(element)

    def mark_failed(self, element: Any, owner: str, retention_ms: int, reason: str) -> None:
        self._records.mark_failed(Claim(element, owner), retention_ms, reason)

    def read(self, element: Any) -> Any:
        return self._records.read(element)


def outcome(result: Any) -> Any:
    """A claim result without its holder: what a claim decided."""
    return (result.claimed, result.status)


def claims(elements: Sequence[Any], owners: Sequence[str]) -> List[Claim]:
    """Claims of ``elements`` by ``owners`` (pairwise)."""
    return [Claim(e, o) for e, o in zip(elements, owners, strict=True)]


def prometheus_value(registry: Any, name: str, **labels: str) -> Optional[float]:
    """One sample of a prometheus_client ``CollectorRegistry``; None when it has none."""
    value: Optional[float] = registry.get_sample_value(name, labels)
    return value


def otel_points(reader: Any) -> Dict[Tuple[str, Optional[str]], float]:
    """The data points of an OpenTelemetry ``InMemoryMetricReader`` by (instrument, outcome
    attribute or None): a counter's value, a histogram's count, summed over other labels."""
    found: Dict[Tuple[str, Optional[str]], float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (m.name, dict(p.attributes or {}).get("outcome"))
                    value = getattr(p, "value", None)
                    found[key] = found.get(key, 0) + (value if value is not None else p.count)
    return found


def consume_in_threads(listener: Callable[[Any], Any], threads: int, each: int) -> List[Any]:
    """``threads`` threads, started together, each passing ``each`` messages ``"<t>-<i>"``
    (ClassicMessage) to ``listener``; every answer, once all threads ended (within a minute)."""
    from rocketmq_dedup.testing import ClassicMessage

    barrier = threading.Barrier(threads)
    answers: List[Any] = []

    def work(t: int) -> None:
        barrier.wait(10)
        for i in range(each):
            answers.append(listener(ClassicMessage(f"{t}-{i}")))

    started = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(60)
        assert not thread.is_alive()
    return answers
