"""PostgreSQL record store over psycopg 3 (the ``[postgres]`` extra): a connection factory, a
``psycopg_pool.ConnectionPool`` or a SQLAlchemy ``Engine`` on ``postgresql+psycopg``.

The same contract and the same row as the MySQL store (:mod:`rocketmq_dedup.stores.mysql`):

* Identity: ``dedup_key`` (``bytea``) = SHA-256 of the length-prefixed (application, topic, tag,
  key), so tags and keys of any length and any Unicode never truncate or collide. The readable
  columns keep the first 255 characters for operators (NUL, which a PostgreSQL text cannot
  hold, shown as U+FFFD).
* Time: ``expire_time`` is a ``timestamptz`` on the database server's clock (the statement's
  start); leases and retentions are milliseconds added to it there, never the client's clock.
* One statement per decision (:mod:`.sql`): a claim is one ``INSERT ... ON CONFLICT DO UPDATE``
  that creates the CONSUMING row, takes over an expired one or leaves a live one as it is, and
  returns the row as it then is (one round trip for a fresh message, a duplicate and a
  takeover alike; a duplicate writes a new version of its row, counted in ``deliveries``); a
  batch of claims is one such statement over arrays. Marking CONSUMED is one ``UPDATE`` (an
  upsert when the row is gone: a success is recorded whoever holds the row); releases and
  renewals are fenced by the owner token and the CONSUMING status.
* ``purge_expired()`` walks the table in primary-key order, ``batch_size`` rows at a time,
  and deletes the expired ones by key. No ``expire_time`` index, as on MySQL: every claim and
  mark would pay for it, and the purge is a background job.
* Connections (:mod:`.connections`): every statement in autocommit, so no transaction (nor an
  aborted one) outlives a statement; a factory's connections in the store's own bounded,
  fork-safe pool; an application's ``psycopg_pool`` pool borrowed per operation and left as
  found. A lost connection is replaced and the operation retried once.
* Errors: psycopg's ``OperationalError`` family is an outage
  (:class:`~rocketmq_dedup.errors.StoreUnavailableError`), but a lock wait or a deadlock
  (:data:`.connections.LOCK_CONFLICTS`) is not, nor a refusal a person must fix (:mod:`.errors`:
  a missing privilege, a read-only server, a refused login:
  :class:`~rocketmq_dedup.errors.StoreMisconfiguredError` naming the GRANT, the server or the
  login); a pool without a free connection in time is
  :class:`~rocketmq_dedup.errors.StorePoolExhaustedError` (not an outage); anything else, e.g. a
  missing table (named as such), a :class:`~rocketmq_dedup.errors.StoreError`. The start-up
  check proves the writes with probe records.
* Exactly-once mode (:mod:`rocketmq_dedup.transactional`): the store's ``transactions``
  (:class:`~.transaction.PostgresTransactions`, the port of
  :mod:`rocketmq_dedup.stores.transaction`), the record sent with the COMMIT in one pipeline;
  the sequence table ``<table>_seq`` created with the dedup table.

Modules, by concern: :mod:`.sql` (statements and tables), :mod:`.records` (the rows' values),
:mod:`.errors` (what a driver error means), :mod:`.connections` (sources, prepared connections,
runners), :mod:`.store`, :mod:`.purge` (a purge batch and the purger's session),
:mod:`.pipeline` (statements in one round trip) and :mod:`.transaction` (the exactly-once
port).
"""

from rocketmq_dedup.stores.postgres.connections import (
    is_psycopg_factory,
    is_psycopg_pool,
)
from rocketmq_dedup.stores.postgres.sql import (
    DEFAULT_TABLE_NAME,
    schema_statements,
    validate_table_name,
)
from rocketmq_dedup.stores.postgres.store import (
    DEFAULT_POOL_SIZE,
    DEFAULT_POOL_TIMEOUT,
    MAX_POOL_SIZE,
    PostgresDedupStore,
)

__all__ = [
    "DEFAULT_POOL_SIZE",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_TABLE_NAME",
    "MAX_POOL_SIZE",
    "PostgresDedupStore",
    "is_psycopg_factory",
    "is_psycopg_pool",
    "schema_statements",
    "validate_table_name",
]
