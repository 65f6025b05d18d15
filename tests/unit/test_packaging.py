"""Packaging: import without extras, the CLI, typing marker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rocketmq_dedup
from rocketmq_dedup.stores.mysql import schema_sql

BLOCK_EXTRAS = (
    "import sys\n"
    "for name in ('redis', 'MySQLdb', 'pymysql', 'mysql', 'rocketmq', 'click',\n"
    "             'prometheus_client', 'opentelemetry', 'sqlalchemy', 'psycopg', 'psycopg_pool'):\n"
    "    sys.modules[name] = None  # makes 'import name' raise ImportError\n"
)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_EXTRAS + code], capture_output=True, text=True, timeout=60
    )


def test_import_works_without_any_extra() -> None:
    """The package imports and the memory store and rocketmq_dedup.testing work with no
    optional dependency."""
    result = run_python(
        "from rocketmq_dedup import DedupConcurrentListener, DedupConfig, ConsumeStatus, "
        "MemoryDedupStore\n"
        "class L(DedupConcurrentListener):\n"
        "    def do_handle_msg(self, msg): return True\n"
        "from rocketmq_dedup.testing import ClassicMessage, deliver\n"
        "l = L(DedupConfig.enable_dedup_consume_config('a', MemoryDedupStore()))\n"
        "print(*map(int, deliver(l, ClassicMessage('x'), times=2).answers))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"]


def test_missing_extra_names_the_extra_to_install() -> None:
    """Using the Redis store without redis-py raises MissingExtraError naming [redis]."""
    result = run_python(
        "from rocketmq_dedup import RedisDedupStore, MissingExtraError\n"
        "try:\n    RedisDedupStore(object())\n"
        "except MissingExtraError as exc:\n    print(exc)\n"
    )
    assert "pip install 'rocketmq-dedup[redis]'" in result.stdout, result.stderr


def test_missing_postgres_extra_names_it() -> None:
    """The PostgreSQL store without psycopg raises MissingExtraError naming [postgres]."""
    result = run_python(
        "from rocketmq_dedup import PostgresDedupStore, MissingExtraError\n"
        "try:\n    PostgresDedupStore(lambda: None)\n"
        "except MissingExtraError as exc:\n    print(exc)\n"
    )
    assert "pip install 'rocketmq-dedup[postgres]'" in result.stdout, result.stderr


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m rocketmq_dedup ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "rocketmq_dedup", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_prints_the_mysql_schema() -> None:
    """python -m rocketmq_dedup schema mysql prints the DDL the store creates."""
    result = run_module("schema", "mysql", "--table", "my_t")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(schema_sql("my_t") + ";")
    assert "CREATE TABLE IF NOT EXISTS `my_t`" in result.stdout


def test_cli_rejects_a_bad_table_name() -> None:
    """An invalid table name exits 2 with an error message."""
    result = run_module("schema", "mysql", "--table", "x;y")
    assert result.returncode == 2
    assert "invalid table_name" in result.stderr


def test_package_is_typed() -> None:
    """py.typed ships with the package."""
    assert (Path(rocketmq_dedup.__file__).parent / "py.typed").is_file()


def test_missing_cli_extra_is_one_clear_line() -> None:
    """Without click, the command line says which extra to install (exit 2), no traceback."""
    result = run_python("import sys\nfrom rocketmq_dedup.__main__ import run\nsys.exit(run())")
    assert result.returncode == 2
    assert "pip install 'rocketmq-dedup[cli]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_writes_out_the_operator_kit(tmp_path: Path) -> None:
    """``ops export DIR``: the kit's files as the package holds them; an existing file is
    refused (exit 2) unless --force."""
    kit = Path(rocketmq_dedup.__file__).parent / "ops"
    result = run_module("ops", "export", str(tmp_path / "kit"))
    assert result.returncode == 0, result.stderr
    for name in ("prometheus/rocketmq-dedup.rules.yml", "grafana/rocketmq-dedup-dashboard.json"):
        assert (tmp_path / "kit" / name).read_bytes() == (kit / name).read_bytes()
        assert str(tmp_path / "kit" / name) in result.stdout.splitlines()
    again = run_module("ops", "export", str(tmp_path / "kit"))
    assert again.returncode == 2 and "--force overwrites" in again.stderr
    assert run_module("ops", "export", "--force", str(tmp_path / "kit")).returncode == 0
