"""MySQL / MariaDB record store over a DB-API driver: mysqlclient (the ``[mysql]`` extra),
PyMySQL or mysql-connector-python.

* Identity: ``dedup_key`` = SHA-256 of the length-prefixed (application, topic, tag, key), so
  tags and keys of any length and any Unicode never truncate or collide, and comparisons are
  binary (case-sensitive). The readable columns keep the first 255 characters for operators.
* Time: leases and retention are computed from the database server's clock (the session time
  zone is set to UTC so epoch conversions are exact), never the client's.
* A fresh claim is one ``INSERT IGNORE``; a duplicate costs one more ``SELECT``; an expired
  record is taken over by one ``INSERT ... ON DUPLICATE KEY UPDATE`` that only overwrites
  a row whose lease or retention has passed (checked in the same statement). Marking CONSUMED
  is one ``UPDATE`` of the claimed row.
* ``purge_expired()`` walks the table in primary-key order, ``batch_size`` rows at a time, and
  deletes the expired ones: one pass reads every row once. The table has no ``expire_time``
  index: it would cost every claim and every CONSUMED mark an index write (measured: 4 % of a
  message's time, BENCHMARKS.md), and the purge is a background job.
* Connections: a small bounded pool (:class:`ConnectionPool`), not one per thread. The classic
  RocketMQ client calls listeners from native threads whose Python thread state is new in every
  callback, so thread-locals leaked one connection per message (151 after 200 callbacks). An
  operation takes a connection and gives it back when it is done; a connection that raised is
  closed, never reused; no connection crosses a ``fork()``. A lost connection (server restart)
  is replaced and the operation retried once: every statement is idempotent for its owner
  token, so the retry is safe.
* Drivers: each new connection is put in autocommit mode and the session character set is set
  to utf8mb4 through the driver's own API (so the driver encodes with it too), whatever the
  factory asked for; rows that come back as bytes (``use_unicode=False``) are decoded. On
  mysqlclient statements run through its connection API (same escaping, no cursor
  bookkeeping); other drivers go through DB-API cursors.
* Errors: the PEP 249 ``OperationalError``/``InterfaceError`` families of any driver are
  outages (:class:`~rocketmq_dedup.errors.StoreUnavailableError`); anything else, e.g. a
  ``ProgrammingError`` for a missing table, is a :class:`~rocketmq_dedup.errors.StoreError`;
  so is a pool whose connections all stayed busy for ``pool_timeout``
  (:class:`~rocketmq_dedup.errors.StorePoolExhaustedError`: consumed later, not an outage).
* Errors (:mod:`.errors`): lock wait timeouts and deadlocks (1205, 1213) are
  :class:`~rocketmq_dedup.errors.StoreLockConflictError`, never outages.
* Exactly-once mode (:mod:`rocketmq_dedup.transactional`): one business transaction per
  message on the same database, opened by the store's ``transactions``
  (:class:`MySQLTransactions`, the port of :mod:`rocketmq_dedup.stores.transaction`), the
  dedup record written with its COMMIT; a sequence table ``<table>_seq`` created with the dedup
  table; :meth:`MySQLDedupStore.from_engine` builds the store on a SQLAlchemy ``Engine``.

* The outbox (:mod:`rocketmq_dedup.outbox`): ``<table>_outbox`` and ``<table>_outbox_lane``,
  created with the dedup table; the store's ``outbox`` (:class:`MySQLOutboxTables`, the port of
  :mod:`rocketmq_dedup.stores.outbox`) writes rows in the handler's transaction and claims,
  settles and lists them for the relays and the operators.

Modules, by concern: :mod:`.sql` (statements and tables), :mod:`.rows` (the values of their
rows), :mod:`.errors` (what a driver error means), :mod:`.connection` (a prepared connection
and its statement runner), :mod:`.pool`, :mod:`.store`, :mod:`.transaction` (the exactly-once
port), :mod:`.handler_connection` and :mod:`.sqlalchemy_guard` (what a handler may not do to
its transaction), :mod:`.outbox` (the outbox's port).
"""

from rocketmq_dedup.stores.mysql.errors import is_connection_error
from rocketmq_dedup.stores.mysql.handler_connection import HandlerConnection
from rocketmq_dedup.stores.mysql.outbox import MySQLOutboxTables
from rocketmq_dedup.stores.mysql.pool import ConnectionPool
from rocketmq_dedup.stores.mysql.sql import (
    CLAIM_SQL,
    DEFAULT_TABLE_NAME,
    INSERT_CLAIM_SQL,
    MARK_CONSUMED_SQL,
    MARK_SQL,
    PURGE_SCAN_SQL,
    PURGE_SQL,
    RELEASE_SQL,
    RENEW_SQL,
    SCHEMA_SQL,
    SELECT_SQL,
    outbox_table_names,
    schema_sql,
    schema_statements,
    sequence_table_name,
    validate_table_name,
)
from rocketmq_dedup.stores.mysql.store import (
    DEFAULT_POOL_SIZE,
    DEFAULT_POOL_TIMEOUT,
    MAX_POOL_SIZE,
    MySQLDedupStore,
    describe_factory,
)
from rocketmq_dedup.stores.mysql.transaction import MySQLTransactions

__all__ = [
    "CLAIM_SQL",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_TABLE_NAME",
    "INSERT_CLAIM_SQL",
    "MARK_CONSUMED_SQL",
    "MARK_SQL",
    "MAX_POOL_SIZE",
    "PURGE_SCAN_SQL",
    "PURGE_SQL",
    "RELEASE_SQL",
    "RENEW_SQL",
    "SCHEMA_SQL",
    "SELECT_SQL",
    "ConnectionPool",
    "HandlerConnection",
    "MySQLDedupStore",
    "MySQLOutboxTables",
    "MySQLTransactions",
    "describe_factory",
    "is_connection_error",
    "outbox_table_names",
    "schema_sql",
    "schema_statements",
    "sequence_table_name",
    "validate_table_name",
]
