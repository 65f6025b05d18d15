"""The MySQL store's SQL text: the table, and one statement per operation (``{table}`` is
the quoted table name, ``{rows}``/``{marks}`` the placeholders of a multi-row statement)."""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from rocketmq_dedup.errors import DedupConfigError

DEFAULT_TABLE_NAME = "t_rocketmq_dedup"
_TABLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,63}(\.[A-Za-z_][A-Za-z0-9_$]{0,63})?$")

# The database server's clock, in epoch milliseconds (the session time zone is UTC).
NOW_MS = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  dedup_key        BINARY(32)      NOT NULL COMMENT 'SHA-256 of (application, topic, tag, key)',
  application_name VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  topic            VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  tag              VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  msg_uniq_key     VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  status           VARCHAR(16)     NOT NULL COMMENT 'CONSUMING, CONSUMED or FAILED',
  owner_token      VARCHAR(64)     NOT NULL COMMENT 'the claim that wrote the row',
  expire_time      BIGINT          NOT NULL COMMENT 'epoch ms, database server clock',
  deliveries       BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'claims since last settled',
  failure_reason   VARCHAR(255)    NULL     COMMENT 'why a FAILED message never succeeds',
  PRIMARY KEY (dedup_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

_COLUMNS = "dedup_key, application_name, topic, tag, msg_uniq_key, status, owner_token, expire_time"

# One row per element: a fresh CONSUMING claim, or the takeover of an expired record.
# Assignments run left to right, so status and expire_time are compared before they are
# overwritten. `deliveries` counts the claims since the record was last settled: the takeover
# of an expired CONSUMING claim (its consumer never settled it: a lapsed claim) adds one, that
# of an expired CONSUMED or FAILED record starts again at 1, a live row keeps it (and is left
# unchanged: rowcount 0, so the rows are read again after this statement, never counted).
# A release deletes the row (the count with it); a mark keeps it until the record expires.
CLAIM_SQL = f"""\
INSERT INTO {{table}} ({_COLUMNS}) VALUES {{rows}}
ON DUPLICATE KEY UPDATE
  deliveries = IF(expire_time <= {NOW_MS}, IF(status = 'CONSUMING', deliveries + 1, 1), deliveries),
  status = IF(expire_time <= {NOW_MS}, VALUES(status), status),
  owner_token = IF(expire_time <= {NOW_MS}, VALUES(owner_token), owner_token),
  expire_time = IF(expire_time <= {NOW_MS}, VALUES(expire_time), expire_time)"""

# Claims fresh elements only: rows that exist (live or expired) are skipped, not touched.
INSERT_CLAIM_SQL = f"INSERT IGNORE INTO {{table}} ({_COLUMNS}) VALUES {{rows}}"

CLAIM_ROW = f"(%s, %s, %s, %s, %s, 'CONSUMING', %s, {NOW_MS} + %s)"

# A success is always recorded, whoever holds the row now.
MARK_CONSUMED_SQL = f"""\
INSERT INTO {{table}} ({_COLUMNS}) VALUES {{rows}}
ON DUPLICATE KEY UPDATE
  status = VALUES(status), owner_token = VALUES(owner_token), expire_time = VALUES(expire_time)"""

MARK_CONSUMED_ROW = f"(%s, %s, %s, %s, %s, 'CONSUMED', %s, {NOW_MS} + %s)"

# The live records of some keys: status, owner, time left (ms), claims since last settled.
SELECT_SQL = (
    f"SELECT dedup_key, status, owner_token, expire_time - {NOW_MS}, deliveries FROM {{table}} "
    f"WHERE dedup_key IN ({{marks}}) AND expire_time > {NOW_MS}"
)
# A FAILED record, whoever holds the row, unless it is a live CONSUMED one (a success is never
# downgraded). Assignments run left to right: status and expire_time, which the condition reads,
# come last (expire_time after status: a row just turned FAILED takes the new expiry). The
# reason's column came with FAILED records: a table made before has none (MISSING_COLUMN), and
# then the row is written by MARK_FAILED_SQL_NO_REASON.
_KEEP = f"status = 'CONSUMED' AND expire_time > {NOW_MS}"
MARK_FAILED_SQL = f"""\
INSERT INTO {{table}} ({_COLUMNS}, failure_reason) VALUES
  (%s, %s, %s, %s, %s, 'FAILED', %s, {NOW_MS} + %s, %s)
ON DUPLICATE KEY UPDATE
  failure_reason = IF({_KEEP}, failure_reason, VALUES(failure_reason)),
  owner_token = IF({_KEEP}, owner_token, VALUES(owner_token)),
  deliveries = IF({_KEEP}, deliveries, 1),
  status = IF({_KEEP}, status, 'FAILED'),
  expire_time = IF({_KEEP}, expire_time, VALUES(expire_time))"""
MARK_FAILED_SQL_NO_REASON = f"""\
INSERT INTO {{table}} ({_COLUMNS}) VALUES
  (%s, %s, %s, %s, %s, 'FAILED', %s, {NOW_MS} + %s)
ON DUPLICATE KEY UPDATE
  owner_token = IF({_KEEP}, owner_token, VALUES(owner_token)),
  deliveries = IF({_KEEP}, deliveries, 1),
  status = IF({_KEEP}, status, 'FAILED'),
  expire_time = IF({_KEEP}, expire_time, VALUES(expire_time))"""
# The reasons of FAILED records (read only for those: a table made before FAILED records has
# no such column, and every other statement works without it).
REASONS_SQL = (
    "SELECT dedup_key, failure_reason FROM {table} "
    "WHERE dedup_key IN ({marks}) AND status = 'FAILED'"
)
#: "Unknown column" (ER_BAD_FIELD_ERROR): a table made before a column was added.
MISSING_COLUMN = 1054
#: The column FAILED records keep their reason in, and what adds it to a table made before.
REASON_COLUMN = "failure_reason"
ADD_REASON_SQL = (
    "ALTER TABLE {table} ADD COLUMN failure_reason VARCHAR(255) NULL "
    "COMMENT 'why a FAILED message never succeeds'"
)
RELEASE_SQL = (
    "DELETE FROM {table} WHERE dedup_key = %s AND owner_token = %s AND status = 'CONSUMING'"
)
MARK_SQL = (
    f"UPDATE {{table}} SET status = 'CONSUMED', owner_token = %s, "
    f"expire_time = {NOW_MS} + %s WHERE dedup_key = %s"
)
# Several claims' rows at once, each with its owner (``{cases}``: one ``WHEN %s THEN %s`` per
# claim: key, owner); the rows matched are counted, and a row that vanished is written by
# MARK_CONSUMED_SQL after (an UPDATE of existing rows costs the server about 60 % of the upsert).
MARK_MANY_SQL = (
    "UPDATE {table} SET status = 'CONSUMED', owner_token = CASE dedup_key {cases} END, "
    f"expire_time = {NOW_MS} + %s WHERE dedup_key IN ({{marks}})"
)
# The lease runs ``%s`` ms from now, and at least 1 ms past where it ran: a renewal in the same
# server millisecond as the claim (or the last renewal) would otherwise set the same value, and
# an UPDATE that changes nothing reports 0 rows (no CLIENT_FOUND_ROWS): read as "taken over".
RENEW_SQL = (
    f"UPDATE {{table}} SET expire_time = GREATEST({NOW_MS} + %s, expire_time + 1) "
    "WHERE dedup_key = %s AND owner_token = %s AND status = 'CONSUMING'"
)
# The purge's scan: the next batch of keys after a key, in primary-key order (a consistent,
# unlocked read), each with how long ago it expired on the server's clock (ms; >= 0: expired).
PURGE_SCAN_SQL = (
    f"SELECT dedup_key, {NOW_MS} - expire_time FROM {{table}} "
    "WHERE dedup_key > %s ORDER BY dedup_key LIMIT %s"
)
# Deletes the listed rows that are still expired (one may have been taken over since the scan).
PURGE_SQL = f"DELETE FROM {{table}} WHERE dedup_key IN ({{marks}}) AND expire_time <= {NOW_MS}"
# The operator's view of listed records (rocketmq-dedup stats): readable columns, time left.
_RECORD_COLUMNS = (
    f"application_name, topic, tag, msg_uniq_key, status, owner_token, expire_time - {NOW_MS}"
)
# Deletes a live record only if it still has the status the operator saw.
DELETE_SQL = (
    f"DELETE FROM {{table}} WHERE dedup_key = %s AND status = %s AND expire_time > {NOW_MS}"
)
STATS_SQL = (
    f"SELECT status, COUNT(*) FROM {{table}} "
    f"WHERE application_name = %s AND expire_time > {NOW_MS} GROUP BY status"
)
CLAIMS_SQL = (
    f"SELECT {_RECORD_COLUMNS} FROM {{table}} "
    f"WHERE application_name = %s AND status = 'CONSUMING' AND expire_time > {NOW_MS}"
)
# The live CONSUMED record with the least time left (rocketmq-dedup stats: its age).
OLDEST_CONSUMED_SQL = (
    f"SELECT {_RECORD_COLUMNS} FROM {{table}} "
    f"WHERE application_name = %s AND status = 'CONSUMED' AND expire_time > {NOW_MS} "
    "ORDER BY expire_time LIMIT 1"
)
# The columns and primary key the store needs (rocketmq-dedup check).
COLUMNS_SQL = (
    "SELECT column_name, column_key FROM information_schema.columns "
    "WHERE table_schema = COALESCE(%s, DATABASE()) AND table_name = %s"
)
REQUIRED_COLUMNS = (*(c.strip() for c in _COLUMNS.split(",")), "deliveries")
VERSION_SQL = "SELECT VERSION()"
# The account the server matched the login to (what a GRANT names) and the session's database.
ACCOUNT_SQL = "SELECT CURRENT_USER(), DATABASE()"
# Run on every new connection, after the driver switched the session to utf8mb4.
SESSION_SQL = "SET time_zone = '+00:00'"
CHECK_SQL = "SELECT 1"


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a plain (optionally schema-qualified) identifier."""
    if not isinstance(name, str) or not _TABLE_NAME_RE.match(name):
        raise DedupConfigError(
            f"invalid table_name {name!r}: use letters, digits, _ or $ (optionally db.table)"
        )
    return name


def schema_sql(table_name: str = DEFAULT_TABLE_NAME) -> str:
    """The ``CREATE TABLE IF NOT EXISTS`` statement for the dedup table."""
    return SCHEMA_SQL.format(table=quote_table(validate_table_name(table_name)))


def quote_table(table_name: str) -> str:
    """The (validated) name as an identifier: each dot-separated part in backquotes."""
    return ".".join(f"`{part}`" for part in table_name.split("."))


# -- exactly-once mode (rocketmq_dedup.transactional) --------------------------------------------

#: The sequence table is named after the dedup table: ``<table>_seq``.
SEQUENCE_TABLE_SUFFIX = "_seq"

SEQUENCE_SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  entity_key       BINARY(32)   NOT NULL COMMENT 'SHA-256 of (application, entity)',
  application_name VARCHAR(255) NOT NULL COMMENT 'first 255 characters, for operators',
  entity           VARCHAR(255) NOT NULL COMMENT 'first 255 characters, for operators',
  last_seq         BIGINT       NULL     COMMENT 'last sequence number applied; NULL: none yet',
  PRIMARY KEY (entity_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

# Inside the business transaction: lock the entity's row, creating it when it is new. An upsert
# takes an exclusive lock on an existing row at once (INSERT IGNORE would take a shared one,
# and two transactions upgrading shared locks to exclusive ones deadlock).
SEQUENCE_LOCK_SQL = (
    "INSERT INTO {table} (entity_key, application_name, entity, last_seq) "
    "VALUES (%s, %s, %s, NULL) ON DUPLICATE KEY UPDATE last_seq = last_seq"
)
SEQUENCE_READ_SQL = "SELECT last_seq FROM {table} WHERE entity_key = %s FOR UPDATE"
SEQUENCE_SET_SQL = "UPDATE {table} SET last_seq = %s WHERE entity_key = %s"

# The dedup record, written in the business transaction and sent with its COMMIT: the primary
# key lets one copy of a message commit, whatever the others did (the statement fails with
# ER_DUP_ENTRY when any record of the key exists, and the COMMIT after it is not run).
RECORD_INSERT_SQL = f"INSERT INTO {{table}} ({_COLUMNS}) VALUES {MARK_CONSUMED_ROW}"
# A permanent failure's record, committed alone after the handler's writes were rolled back
# (without the reason on a table made before FAILED records: MISSING_COLUMN).
RECORD_FAILED_SQL = (
    f"INSERT INTO {{table}} ({_COLUMNS}, failure_reason) "
    f"VALUES (%s, %s, %s, %s, %s, 'FAILED', %s, {NOW_MS} + %s, %s)"
)
RECORD_FAILED_SQL_NO_REASON = (
    f"INSERT INTO {{table}} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, 'FAILED', %s, {NOW_MS} + %s)"
)
# After ER_DUP_ENTRY, in the same transaction: the record in the way, locked, and whether it
# has expired (an expired one is deleted and the record written again).
RECORD_LOCK_SQL = (
    f"SELECT status, owner_token, expire_time <= {NOW_MS} FROM {{table}} "
    "WHERE dedup_key = %s FOR UPDATE"
)
RECORD_DELETE_EXPIRED_SQL = (
    f"DELETE FROM {{table}} WHERE dedup_key = %s AND expire_time <= {NOW_MS}"
)
# The live record of one key: status, owner, and time left (ms). Inside a transaction it reads
# from the transaction's snapshot, so it runs only after the waits for locks (see
# rocketmq_dedup.stores.transaction, "no snapshot before a wait").
RECORD_READ_SQL = (
    f"SELECT status, owner_token, expire_time - {NOW_MS} FROM {{table}} "
    f"WHERE dedup_key = %s AND expire_time > {NOW_MS}"
)
# claim="before_handler": the key's named lock, taken without waiting (1: taken; 0: another
# session holds it), before anything is read. It writes nothing, needs no renewal, and is freed
# with the COMMIT or ROLLBACK (KEY_UNLOCK_SQL) or when its session ends (a killed consumer's).
# A SELECT without a table opens no InnoDB snapshot.
KEY_LOCK_SQL = "SELECT GET_LOCK(%s, 0)"
KEY_UNLOCK_SQL = "DO RELEASE_LOCK(%s)"
# Whether the session is in autocommit mode: asked only of a driver that keeps no status of it
# (mysql-connector-python), after a handler that left no transaction open.
AUTOCOMMIT_SQL = "SELECT @@session.autocommit"


def sequence_table_name(table_name: str = DEFAULT_TABLE_NAME) -> Optional[str]:
    """The sequence table that goes with the dedup table ``table_name`` (same schema); None
    when ``<table>_seq`` would be longer than an identifier may be (a table name of 61-64
    characters: the exactly-once mode then has no sequence guard)."""
    name = validate_table_name(table_name) + SEQUENCE_TABLE_SUFFIX
    return name if _TABLE_NAME_RE.match(name) else None


def schema_statements(table_name: str = DEFAULT_TABLE_NAME) -> List[str]:
    """The ``CREATE TABLE IF NOT EXISTS`` statements of every table the store uses: the dedup
    table, the exactly-once mode's sequence table and the outbox's two tables, each when its
    name fits (see :func:`sequence_table_name`, :func:`outbox_table_names`). What
    ``create_table()`` runs and ``rocketmq-dedup schema mysql`` prints."""
    statements = [schema_sql(table_name)]
    sequence = sequence_table_name(table_name)
    if sequence is not None:
        statements.append(SEQUENCE_SCHEMA_SQL.format(table=quote_table(sequence)))
    outbox = outbox_table_names(table_name)
    if outbox is not None:
        statements.append(OUTBOX_SCHEMA_SQL.format(table=quote_table(outbox[0])))
        statements.append(OUTBOX_LANE_SCHEMA_SQL.format(table=quote_table(outbox[1])))
    return statements


# -- the outbox (rocketmq_dedup.outbox; the port: rocketmq_dedup.stores.outbox) -----------------

#: The outbox tables are named after the dedup table: ``<table>_outbox`` and
#: ``<table>_outbox_lane``.
OUTBOX_TABLE_SUFFIX = "_outbox"
OUTBOX_LANE_TABLE_SUFFIX = "_outbox_lane"

# One row per message a handler sends. `id` orders a sharding key's rows (assigned under the
# key's lock in <table>_outbox_lane, so in commit order); `due_at` is when a relay may take the
# row (0 at first: at once; a backoff after a failed send; the end of a claim's lease), and
# `claimed_by` the claim that holds it. (lane, status, id): each sharding key's first PENDING
# row in one index dive per key (a loose index scan), and its next ones; (status, lane, id):
# the PENDING rows without a sharding key in order, the backlog, the operators' lists.
OUTBOX_SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  status        VARCHAR(8)      NOT NULL COMMENT 'PENDING, SENT, PARKED or DROPPED',
  lane          VARCHAR(64)     NULL     COMMENT 'the sharding key: rows sent in commit order',
  topic         VARCHAR(127)    NOT NULL,
  tag           VARCHAR(128)    NULL,
  message_key   VARCHAR(128)    NOT NULL COMMENT 'the message key, the same on every send',
  other_keys    VARCHAR(2048)   NOT NULL DEFAULT '' COMMENT 'further keys, space-separated',
  properties    TEXT            NULL     COMMENT 'user properties, a JSON object',
  body          MEDIUMBLOB      NOT NULL,
  created_at    BIGINT          NOT NULL COMMENT 'epoch ms, database server clock',
  due_at        BIGINT          NOT NULL DEFAULT 0 COMMENT 'epoch ms: no relay takes it before',
  claimed_by    VARCHAR(64)     NULL     COMMENT 'the relay claim holding it',
  attempts      INT UNSIGNED    NOT NULL DEFAULT 0 COMMENT 'sends tried',
  failing_since BIGINT          NULL     COMMENT 'epoch ms of the first failed send',
  sent_at       BIGINT          NULL     COMMENT 'epoch ms: sent (or dropped)',
  broker_msg_id VARCHAR(128)    NULL     COMMENT 'the message id the broker acknowledged',
  last_error    VARCHAR(1024)   NULL,
  PRIMARY KEY (id),
  KEY status_lane_id (status, lane, id),
  KEY lane_status_id (lane, status, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

# A sharding key's lock: a row written with the key's first outbox row, updated by every later
# one, locked until the handler's transaction ends.
OUTBOX_LANE_SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  lane    VARCHAR(64) NOT NULL COMMENT 'a sharding key',
  used_at BIGINT      NOT NULL COMMENT 'epoch ms of its last outbox row',
  PRIMARY KEY (lane)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

# In the handler's transaction. The lock first (an upsert takes an exclusive lock at once), so a
# second transaction writing for the same key waits for the first to end, and its row's id is
# assigned after the first one's commit.
OUTBOX_LANE_LOCK_SQL = (
    f"INSERT INTO {{lanes}} (lane, used_at) VALUES (%s, {NOW_MS}) "
    "ON DUPLICATE KEY UPDATE used_at = VALUES(used_at)"
)
OUTBOX_INSERT_SQL = (
    "INSERT INTO {table} (status, lane, topic, tag, message_key, other_keys, properties, body, "
    f"created_at) VALUES ('PENDING', %s, %s, %s, %s, %s, %s, %s, {NOW_MS})"
)
# The relays' connections read committed: no gap locks (a relay never blocks a handler's INSERT).
RELAY_SESSION_SQL = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
# The claim, the settle and the operators' statements are the shared ones
# (rocketmq_dedup.stores.sql_outbox.portable_statements), with this clock and these below.
# Runs: the PENDING rows that follow a head in its sharding key, in order, with whether each
# is sendable now (due): a run is the head and the sendable rows right after it. One index range
# per key (lane, status, id), UNION ALL'd. (A PARKED row is always its key's first unsent row:
# only heads are sent, so only heads fail; the rows after a head are all PENDING.)
OUTBOX_RUN_SQL = (
    f"(SELECT id, lane, due_at <= {NOW_MS} FROM {{table}} "
    "WHERE lane = %s AND status = 'PENDING' AND id > %s ORDER BY id LIMIT %s)"
)
# SENT, each row with its broker message id; only rows the claim still holds.
OUTBOX_SENT_SQL = (
    f"UPDATE {{table}} SET status = 'SENT', sent_at = {NOW_MS}, claimed_by = NULL, "
    "attempts = attempts + 1, broker_msg_id = ELT(FIELD(id, {marks}), {marks}) "
    "WHERE id IN ({marks}) AND claimed_by = %s"
)
OUTBOX_PURGE_SQL = (
    "DELETE FROM {table} WHERE status IN ('SENT', 'DROPPED') "
    f"AND sent_at <= {NOW_MS} - %s LIMIT %s"
)
# A sharding key's lock row, unused for the retention and with no unsent row: a transaction
# that takes the lock meanwhile updates used_at first (the DELETE waits for it, then skips it).
OUTBOX_LANE_PURGE_SQL = (
    f"DELETE FROM {{lanes}} WHERE used_at <= {NOW_MS} - %s AND NOT EXISTS ("
    "SELECT 1 FROM {table} o WHERE o.lane = {lanes}.lane AND o.status IN ('PENDING', 'PARKED')) "
    "LIMIT %s"
)


def outbox_table_names(table_name: str = DEFAULT_TABLE_NAME) -> Optional[Tuple[str, str]]:
    """The outbox tables that go with the dedup table ``table_name`` (same schema): the outbox
    and its sharding-key locks; None when ``<table>_outbox_lane`` would be longer than an
    identifier may be (a table name over 52 characters: no outbox then)."""
    name = validate_table_name(table_name)
    lanes = name + OUTBOX_LANE_TABLE_SUFFIX
    if not _TABLE_NAME_RE.match(lanes):
        return None
    return name + OUTBOX_TABLE_SUFFIX, lanes
