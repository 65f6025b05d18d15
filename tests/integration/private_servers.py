"""Servers a test starts for itself, never the shared ones (no helpers here are tests): a
MariaDB and redis-servers on free ports, their state under a temporary directory, stopped by
their PID. For what must not happen to the shared servers: a read-only MariaDB, a Redis
replica, a Redis whose eviction policy a test sets."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, List

import redis

from tests.support import wait_for

DATABASE = "dedup_test"


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _program(name: str) -> str:
    """The path of a server program (Debian puts mariadbd in /usr/sbin); a missing one fails."""
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if path is None:
        raise AssertionError(f"{name} not found: scripts/services.sh installs it")
    return path


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a server this module started, by its PID: SIGTERM, then SIGKILL after 30 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class _ServerProcess:
    """A server process a test started: the faults it makes by PID, and :meth:`stop`."""

    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        """SIGKILL: connections cut, nothing flushed."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def freeze(self) -> None:
        """SIGSTOP: connections open, no answer."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.thaw()
        _stop(self.process)


class PrivateMariaDB(_ServerProcess):
    """A MariaDB of one test module: ``mariadb-install-db`` into ``root``, ``mariadbd`` on a
    free port with its socket in ``root``; root logs in without a password (over the socket),
    the database :data:`DATABASE` exists. :meth:`kill`, :meth:`freeze` and :meth:`start` make
    the faults; :meth:`stop` ends it by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.socket = str(root / "mariadb.sock")
        data = root / "data"
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        subprocess.run(
            [
                _program("mariadb-install-db"),
                "--no-defaults",
                *as_root,
                f"--datadir={data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self._data = data
        self.start()
        try:
            self.sql(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        except BaseException:
            self.stop()
            raise

    def start(self) -> None:
        """``mariadbd`` on this server's port, data directory and socket (again, after
        :meth:`kill`: InnoDB recovers what was committed)."""
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        self.process = subprocess.Popen(
            [
                _program("mariadbd"),
                "--no-defaults",
                *as_root,
                f"--datadir={self._data}",
                "--bind-address=127.0.0.1",
                f"--port={self.port}",
                f"--socket={self.socket}",
                f"--log-error={self.root / 'mariadb.err'}",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(self._answers, timeout=60, interval=0.05)
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            log = (self.root / "mariadb.err").read_text(errors="replace")[-2000:]
            raise AssertionError(f"mariadbd exited with {self.process.returncode}: {log}")
        try:
            self.sql("SELECT 1")
        except Exception:
            return False
        return True

    def admin(self) -> Any:
        """A root connection over the socket, in autocommit mode."""
        import MySQLdb

        conn = MySQLdb.connect(unix_socket=self.socket, user="root", autocommit=True)
        return conn

    def sql(self, statement: str) -> List[Any]:
        """Run one statement as root; its rows."""
        conn = self.admin()
        try:
            cursor = conn.cursor()
            cursor.execute(statement)
            return list(cursor.fetchall())
        finally:
            conn.close()

    def connect(self, driver: str, user: str, password: str) -> Any:
        """A connection factory of ``driver`` (as :func:`tests.support.mysql_connect` names
        them) for ``user`` over TCP; for ``"sqlalchemy"`` an engine (on mysqlclient)."""
        if driver == "sqlalchemy":
            import sqlalchemy

            url = sqlalchemy.URL.create(
                "mysql+mysqldb",
                username=user,
                password=password,
                host="127.0.0.1",
                port=self.port,
                database=DATABASE,
            )
            return sqlalchemy.create_engine(url, poolclass=sqlalchemy.NullPool)
        params = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": user,
            "password": password,
            "database": DATABASE,
        }
        if driver == "pymysql":
            import pymysql

            return functools.partial(pymysql.connect, **params)
        if driver == "mysql-connector":
            import mysql.connector

            return functools.partial(mysql.connector.connect, **params)
        import MySQLdb

        return functools.partial(MySQLdb.connect, **params)

    def url(self, user: str, password: str) -> str:
        """The CLI's ``--mysql`` URL for ``user``."""
        return f"mysql://{user}:{password}@127.0.0.1:{self.port}/{DATABASE}"


class PrivateRedis(_ServerProcess):
    """A redis-server of one test, on a free port, with no persistence; ``args`` are more
    options (``--replicaof``, ``--maxmemory-policy``). :meth:`kill`, :meth:`freeze` and
    :meth:`start` (again, on the same port) make the faults; :meth:`stop` ends it by PID."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self._args = args
        self._clients: List[redis.Redis] = []
        self.start()

    def start(self) -> None:
        """``redis-server`` on this server's port (again, after :meth:`kill`: empty)."""
        self.process = subprocess.Popen(
            [
                _program("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *self._args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(self._answers, timeout=30, interval=0.02)
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.process.returncode}")
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def client(self, **options: Any) -> redis.Redis:
        """A client of this server (closed by :meth:`stop`)."""
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **options)
        self._clients.append(client)
        return client

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        super().stop()
