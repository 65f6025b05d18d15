"""Where the servers are (the same environment variables as the tests) and bench-only names."""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from tests.support import ROCKETMQ_NAMESRV, ROCKETMQ_PROXY

#: Every Redis key the bench writes starts with one of these prefixes (cleaned between reps).
LIBRARY_KEY_PREFIX = "DEDUPBENCH"
NAIVE_KEY_PREFIX = "DEDUPBENCH-NAIVE"
POWERTOOLS_KEY_PREFIX = "DEDUPBENCH-PT"
BENCH_KEY_PATTERNS = (f"{LIBRARY_KEY_PREFIX}*",)  # the other two prefixes start with this one

#: Appended to every bench table's name (DEDUP_BENCH_TABLE_SUFFIX, e.g. "_ab"): a run recreates
#: its tables, so two runs on one database at once need tables of their own.
TABLE_SUFFIX = os.environ.get("DEDUP_BENCH_TABLE_SUFFIX", "")
#: Bench-only MySQL and PostgreSQL tables (the library's schema, and the Java original's for the
#: baseline).
LIBRARY_TABLE = "t_rocketmq_dedup_bench" + TABLE_SUFFIX
NAIVE_TABLE = "t_rocketmq_dedup_bench_naive" + TABLE_SUFFIX
#: The drain and paced cases' dedup table (bench.drain): their own, so that another run of the
#: in-process cases, which recreates LIBRARY_TABLE, never drops it under a live consumer.
CONSUMER_TABLE = "t_rocketmq_dedup_bench_consumer" + TABLE_SUFFIX
#: The business tables of the exactly-once cases (mysql_tx_*): accounts updated and a ledger
#: appended to by one business transaction per message.
TX_ACCOUNT_TABLE = "t_rocketmq_dedup_bench_account" + TABLE_SUFFIX
TX_LEDGER_TABLE = "t_rocketmq_dedup_bench_ledger" + TABLE_SUFFIX

TOPIC = "DEDUP-BENCH"
TAG = "TagBench"
LEASE_MS = 60_000
RESERVE_MINUTES = 1440

NAMESRV_ADDR = os.environ.get("DEDUP_NAMESRV_ADDR") or ROCKETMQ_NAMESRV
PROXY_ADDR = ROCKETMQ_PROXY  # the 5.x client's gRPC endpoint


class BenchSetupError(RuntimeError):
    """A server the selected cases need is unreachable or misconfigured."""


@dataclass(frozen=True)
class Servers:
    """Connection settings, read from the environment with ``scripts/services.sh`` defaults."""

    redis_url: str
    mysql: dict[str, Any]
    namesrv_addr: str
    postgres_dsn: str = "postgresql://dedup:dedup@127.0.0.1:15432/dedup_test"
    proxy_addr: str = PROXY_ADDR

    @classmethod
    def from_env(cls) -> Servers:
        env = os.environ.get
        return cls(
            redis_url=env("DEDUP_REDIS_URL", "redis://127.0.0.1:16379/0"),
            mysql={
                "host": env("DEDUP_MYSQL_HOST", "127.0.0.1"),
                "port": int(env("DEDUP_MYSQL_PORT", "13306")),
                "user": env("DEDUP_MYSQL_USER", "dedup"),
                "password": env("DEDUP_MYSQL_PASSWORD", "dedup"),
                "database": env("DEDUP_MYSQL_DATABASE", "dedup_test"),
            },
            namesrv_addr=NAMESRV_ADDR,
            postgres_dsn=env("DEDUP_PG_DSN", "postgresql://dedup:dedup@127.0.0.1:15432/dedup_test"),
        )

    def redis_client(self) -> Any:
        """A new ``redis.Redis`` (its own connection pool) for one case."""
        import redis

        return redis.Redis.from_url(self.redis_url)

    def mysql_connect(self) -> Callable[[], Any]:
        """A zero-argument mysqlclient connection factory, as users pass it to DedupConfig."""
        import MySQLdb

        return functools.partial(MySQLdb.connect, **self.mysql)

    def postgres_connect(self) -> Callable[[], Any]:
        """A zero-argument psycopg connection factory, as users pass it to DedupConfig."""
        import psycopg

        return functools.partial(psycopg.connect, self.postgres_dsn)

    def check_postgres(self) -> str:
        """Connect to PostgreSQL; return its version. Raises BenchSetupError when not."""
        import psycopg

        try:
            with self.postgres_connect()() as conn:
                return str(conn.execute("SHOW server_version").fetchone()[0])
        except psycopg.Error as exc:
            where = urlsplit(self.postgres_dsn)
            raise BenchSetupError(
                f"PostgreSQL at {where.hostname}:{where.port}{where.path} is unreachable "
                f"({exc}); start it with `scripts/services.sh up postgres` or set DEDUP_PG_DSN"
            ) from exc

    def check_redis(self) -> str:
        """Ping Redis; return its version. Raises BenchSetupError when unreachable."""
        import redis

        try:
            return str(self.redis_client().info("server")["redis_version"])
        except redis.RedisError as exc:
            raise BenchSetupError(
                f"Redis at {self.redis_url} is unreachable ({exc}); start it with "
                "`scripts/services.sh up` or set DEDUP_REDIS_URL"
            ) from exc

    def check_mysql(self) -> str:
        """Connect to MariaDB/MySQL; return its version. Raises BenchSetupError when not."""
        import MySQLdb

        try:
            conn = self.mysql_connect()()
        except MySQLdb.Error as exc:
            where = f"{self.mysql['host']}:{self.mysql['port']}/{self.mysql['database']}"
            raise BenchSetupError(
                f"MySQL at {where} is unreachable ({exc}); start it with "
                "`scripts/services.sh up` or set DEDUP_MYSQL_HOST/PORT/USER/PASSWORD/DATABASE"
            ) from exc
        try:
            cur = conn.cursor()
            cur.execute("SELECT VERSION()")
            return str(cur.fetchone()[0])
        finally:
            conn.close()

    def check_namesrv(self) -> str:
        """TCP-connect to the RocketMQ name server. Raises BenchSetupError when closed."""
        host, _, port = self.namesrv_addr.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
        except OSError as exc:
            raise BenchSetupError(
                f"no RocketMQ name server at {self.namesrv_addr} ({exc}); start the broker "
                "with `scripts/rocketmq.sh up` (scripts/bench.sh does), or leave out the e2e "
                "cases (--quick, or --cases without e2e_*)"
            ) from exc
        return self.namesrv_addr

    def redis_where(self) -> str:
        parts = urlsplit(self.redis_url)
        return f"{parts.hostname}:{parts.port}"
