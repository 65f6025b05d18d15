"""The ``rocketmq-dedup`` command line (also ``python -m rocketmq_dedup``); needs the ``[cli]``
extra (click).

Stores are named by URL: ``--redis redis://[:password@]host:port/db`` (also ``rediss://`` and
``unix://``, as redis-py reads them), ``--mysql mysql://user[:password]@host[:port]/database``
(``?unix_socket=/path`` accepted) or ``--postgres postgresql://user[:password]@host[:port]/dbname``
(any libpq URL, ``?sslmode=...`` and the like included). Each may come from the environment
instead (``ROCKETMQ_DEDUP_REDIS_URL``, ``ROCKETMQ_DEDUP_MYSQL_URL``,
``ROCKETMQ_DEDUP_POSTGRES_URL``), and so may the passwords (``REDISCLI_AUTH``,
``ROCKETMQ_DEDUP_MYSQL_PASSWORD``, ``ROCKETMQ_DEDUP_POSTGRES_PASSWORD``; libpq's own
``PGPASSWORD`` and ``~/.pgpass`` work too), to keep them off the command line.

Exit status: 0 done; 1 a check failed (``check``: e.g. the table is missing or lacks a column,
or the user may not write it; a ``warn`` line, e.g. a Redis that evicts keys, is not a failure)
or ``release`` refused a CONSUMED record without ``--force``; 2 bad input (a bad URL, an
unknown table outside ``check``, a key with no live record) or an unreachable store.
"""

from __future__ import annotations

from typing import List, Optional

from rocketmq_dedup.errors import DedupError, MissingExtraError

try:
    import click
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise MissingExtraError("click", "cli") from exc

from rocketmq_dedup.cli import dlq, kit, outbox, records
from rocketmq_dedup.cli._options import one_line


def _version() -> str:
    from rocketmq_dedup import __version__

    return __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="rocketmq-dedup")
def cli() -> None:
    """Look at and repair rocketmq-dedup's records in Redis, MySQL or PostgreSQL; relay its
    outbox."""


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the process exit status. Errors are one line, never a
    traceback."""
    try:
        cli.main(args=argv, prog_name="rocketmq-dedup", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("aborted", err=True)
        return 130
    except (DedupError, NotImplementedError) as exc:
        click.echo(f"Error: {one_line(exc)}", err=True)
        return 2
    except Exception as exc:  # a server error mid-command: one line, not a traceback
        click.echo(f"Error: {type(exc).__name__}: {one_line(exc)}", err=True)
        return 2
    return 0


for command in (
    records.check,
    records.inspect,
    records.release,
    records.stats,
    records.purge,
    records.schema,
    kit.ops,
    dlq.dlq,
    outbox.relay,
    outbox.outbox,
):
    cli.add_command(command)

__all__ = ["cli", "main"]
