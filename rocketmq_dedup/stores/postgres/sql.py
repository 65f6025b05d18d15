"""The PostgreSQL store's SQL text: the table, and one statement per operation (``{table}`` is
the quoted table name). Placeholders are psycopg's ``%s``; batches pass one array per column
(``unnest``), so a statement's text never depends on the batch size and is prepared once per
connection (psycopg prepares a statement after its ``prepare_threshold`` runs, 5 by default).

Time is the server's: :data:`NOW` (the statement's start, one value for a whole statement), and
leases and retentions are milliseconds added to it, so the expiry compared by the claim's
takeover and the one reported to the caller are the same instant.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from rocketmq_dedup.errors import DedupConfigError

DEFAULT_TABLE_NAME = "t_rocketmq_dedup"
#: A plain identifier, optionally schema-qualified, at most 63 bytes a part (NAMEDATALEN - 1).
#: It is quoted in every statement, so it is used exactly as written (case included).
_TABLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}(\.[A-Za-z_][A-Za-z0-9_$]{0,62})?$")

# The server's clock: the statement's start (not now(), the transaction's: the same in the
# store's autocommit statements, but a statement run inside a long transaction must not go by
# the time the transaction began).
NOW = "statement_timestamp()"
# ``%s`` milliseconds from NOW (the cast fixes the type whatever integer width psycopg sends).
_EXPIRY = f"{NOW} + %s::bigint * interval '1 millisecond'"
# Time left before an expire_time, in whole milliseconds.
_LEFT_MS = f"(extract(epoch FROM expire_time - {NOW}) * 1000)::bigint"

SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  dedup_key        bytea        NOT NULL,
  application_name varchar(255) NOT NULL,
  topic            varchar(255) NOT NULL,
  tag              varchar(255) NOT NULL,
  msg_uniq_key     varchar(255) NOT NULL,
  status           varchar(16)  NOT NULL,
  owner_token      varchar(64)  NOT NULL,
  expire_time      timestamptz  NOT NULL,
  deliveries       bigint       NOT NULL DEFAULT 1,
  failure_reason   varchar(255),
  PRIMARY KEY (dedup_key)
)"""

#: The comments of the table's columns (``COMMENT ON COLUMN``), for operators reading ``\\d+``.
COLUMN_COMMENTS = {
    "dedup_key": "SHA-256 of (application, topic, tag, key)",
    "application_name": "first 255 characters, for operators",
    "topic": "first 255 characters, for operators",
    "tag": "first 255 characters, for operators",
    "msg_uniq_key": "first 255 characters, for operators",
    "status": "CONSUMING, CONSUMED or FAILED",
    "owner_token": "the claim that wrote the row",
    "expire_time": "end of the lease or the retention, database server clock",
    "deliveries": "claims since the record was last settled (1 + those that lapsed)",
    "failure_reason": "why a FAILED message never succeeds",
}

COLUMNS = "dedup_key, application_name, topic, tag, msg_uniq_key, status, owner_token, expire_time"
REQUIRED_COLUMNS = (*(c.strip() for c in COLUMNS.split(",")), "deliveries")

# -- claims -------------------------------------------------------------------------------------
# One statement decides a claim, in one round trip whatever the record's state: an upsert that
# creates the CONSUMING row (a fresh element), or, on a key conflict, takes the row over only if
# it has expired (each assignment keeps the row's value unless expire_time has passed), and
# RETURNING gives the row as it now is. The claim is taken if the row returned carries the
# claim's owner token (tokens are unique per attempt) and is CONSUMING; else it is the live
# record that refused it, with its owner and time left.
#
# ON CONFLICT DO UPDATE locks and reads the latest committed version of the row, whatever the
# statement's snapshot (it waits for a row another session is inserting), so there is no window
# in which the refusing row cannot be seen. The price: a duplicate writes a new version of its
# row (a heap-only update, every value as it was). Measured against the alternative, a
# statement that leaves a live row unwritten (DO UPDATE ... WHERE expired, and the refusing
# row read in the same statement through a CTE): a fresh message's claim 147 against 186 us,
# a duplicate's 156 against 162 us (AMD EPYC, libpq-level loop, median of 15 interleaved runs).
#
# Batches: the rows come from ``unnest`` of one array per column (keys unique within a batch:
# ON CONFLICT cannot touch one row twice in a statement), in key order (concurrent batches lock
# rows in the same order: no deadlock).
#
# `deliveries` counts the claims since the record was last settled: taking over an expired
# CONSUMING claim (never settled: its consumer died in it, a lapsed claim) adds one, taking over
# an expired CONSUMED or FAILED record starts again at 1, a live row keeps it; the claim reads
# its lapsed claims as deliveries - 1. (A release deletes the row; a mark keeps the count until
# the record expires.) Every SET expression reads the row as it was.
_TAKEN_OVER = f"r.expire_time <= {NOW}"
_CLAIM_UPSERT = f"""\
ON CONFLICT (dedup_key) DO UPDATE SET
  deliveries = CASE WHEN {_TAKEN_OVER}
    THEN CASE WHEN r.status = 'CONSUMING' THEN r.deliveries + 1 ELSE 1 END
    ELSE r.deliveries END,
  status = CASE WHEN {_TAKEN_OVER} THEN EXCLUDED.status ELSE r.status END,
  owner_token = CASE WHEN {_TAKEN_OVER} THEN EXCLUDED.owner_token ELSE r.owner_token END,
  expire_time = CASE WHEN {_TAKEN_OVER} THEN EXCLUDED.expire_time ELSE r.expire_time END
RETURNING"""

# One element: parameters (key, application, topic, tag, key text, owner, lease ms); one row
# (status, owner, ms left, claims since last settled).
CLAIM_SQL = f"""\
INSERT INTO {{table}} AS r ({COLUMNS})
VALUES (%s, %s, %s, %s, %s, 'CONSUMING', %s, {_EXPIRY})
{_CLAIM_UPSERT} r.status, r.owner_token, {_LEFT_MS}, r.deliveries"""

# Several elements: parameters (lease ms, keys, applications, topics, tags, key texts, owners);
# one row (key, status, owner, ms left, claims since last settled) per key.
CLAIM_MANY_SQL = f"""\
INSERT INTO {{table}} AS r ({COLUMNS})
SELECT k, a, t, g, m, 'CONSUMING', o, {_EXPIRY}
FROM unnest(%s::bytea[], %s::varchar[], %s::varchar[], %s::varchar[], %s::varchar[],
            %s::varchar[]) AS v(k, a, t, g, m, o)
{_CLAIM_UPSERT} r.dedup_key, r.status, r.owner_token, {_LEFT_MS}, r.deliveries"""

# -- marks, releases, renewals --------------------------------------------------------------------
# A success is always recorded, whoever holds the row now. The row is normally still there (the
# claim's): one UPDATE, 3 parameters. Parameters (owner, retention ms, key).
MARK_SQL = (
    f"UPDATE {{table}} SET status = 'CONSUMED', owner_token = %s, expire_time = {_EXPIRY} "
    "WHERE dedup_key = %s"
)
# When it updated nothing (the row expired and was purged, or released by an operator): an
# upsert, as for batches.
_MARK_UPSERT = """\
ON CONFLICT (dedup_key) DO UPDATE SET
  status = 'CONSUMED', owner_token = EXCLUDED.owner_token, expire_time = EXCLUDED.expire_time"""
# Parameters (key, application, topic, tag, key text, owner, retention ms).
MARK_UPSERT_SQL = f"""\
INSERT INTO {{table}} AS r ({COLUMNS})
VALUES (%s, %s, %s, %s, %s, 'CONSUMED', %s, {_EXPIRY})
{_MARK_UPSERT}"""
# Parameters (retention ms, keys, applications, topics, tags, key texts, owners).
MARK_MANY_SQL = f"""\
INSERT INTO {{table}} AS r ({COLUMNS})
SELECT k, a, t, g, m, 'CONSUMED', o, {_EXPIRY}
FROM unnest(%s::bytea[], %s::varchar[], %s::varchar[], %s::varchar[], %s::varchar[],
            %s::varchar[]) AS v(k, a, t, g, m, o)
{_MARK_UPSERT}"""

# A FAILED record, whoever holds the row, unless it is a live CONSUMED one (a success is never
# downgraded); it settles the record (deliveries 1). Parameters (key, application, topic, tag,
# key text, owner, retention ms, reason). A table made before FAILED records has no reason
# column (UndefinedColumn): then MARK_FAILED_NO_REASON_SQL, parameters without the reason.
_MARK_FAILED_UPSERT = f"""\
ON CONFLICT (dedup_key) DO UPDATE SET
  status = 'FAILED', owner_token = EXCLUDED.owner_token, expire_time = EXCLUDED.expire_time,
  deliveries = 1{{reason}}
WHERE NOT (r.status = 'CONSUMED' AND r.expire_time > {NOW})"""
MARK_FAILED_SQL = f"""\
INSERT INTO {{table}} AS r ({COLUMNS}, failure_reason)
VALUES (%s, %s, %s, %s, %s, 'FAILED', %s, {_EXPIRY}, %s)
{_MARK_FAILED_UPSERT.format(reason=", failure_reason = EXCLUDED.failure_reason")}"""
MARK_FAILED_NO_REASON_SQL = f"""\
INSERT INTO {{table}} AS r ({COLUMNS})
VALUES (%s, %s, %s, %s, %s, 'FAILED', %s, {_EXPIRY})
{_MARK_FAILED_UPSERT.format(reason="")}"""
# The reasons of the FAILED records among some keys (read only for those). Parameter: the keys.
REASONS_SQL = (
    "SELECT dedup_key, failure_reason FROM {table} "
    "WHERE dedup_key = ANY(%s::bytea[]) AND status = 'FAILED'"
)
#: The column FAILED records keep their reason in, and what adds it to a table made before.
REASON_COLUMN = "failure_reason"
ADD_REASON_SQL = "ALTER TABLE {table} ADD COLUMN failure_reason varchar(255)"

# Deletes a claim only while it is still the owner's CONSUMING one. Parameters (key, owner).
RELEASE_SQL = (
    "DELETE FROM {table} WHERE dedup_key = %s AND owner_token = %s AND status = 'CONSUMING'"
)
# Parameters (keys, owners): how many rows were deleted.
RELEASE_MANY_SQL = """\
DELETE FROM {table} AS r USING unnest(%s::bytea[], %s::varchar[]) AS v(k, o)
WHERE r.dedup_key = v.k AND r.owner_token = v.o AND r.status = 'CONSUMING'"""
# Parameters (lease ms, keys, owners): the (key, owner) of each claim extended.
RENEW_MANY_SQL = f"""\
UPDATE {{table}} AS r SET expire_time = {_EXPIRY}
FROM unnest(%s::bytea[], %s::varchar[]) AS v(k, o)
WHERE r.dedup_key = v.k AND r.owner_token = v.o AND r.status = 'CONSUMING'
RETURNING r.dedup_key, r.owner_token"""

# -- reads -----------------------------------------------------------------------------------------
# The live records of some keys: key, status, owner, and time left (ms). Parameter: the keys.
SELECT_SQL = (
    f"SELECT dedup_key, status, owner_token, {_LEFT_MS} FROM {{table}} "
    f"WHERE dedup_key = ANY(%s::bytea[]) AND expire_time > {NOW}"
)

# -- purge -----------------------------------------------------------------------------------------
# The purge's scan: the next batch of keys after a key, in primary-key order (bytea compares
# bytewise), each with how long ago it expired on the server's clock (ms; negative: live).
PURGE_SCAN_SQL = (
    f"SELECT dedup_key, floor(extract(epoch FROM {NOW} - expire_time) * 1000)::bigint "
    "FROM {table} WHERE dedup_key > %s ORDER BY dedup_key LIMIT %s"
)
PURGE_SQL = f"DELETE FROM {{table}} WHERE dedup_key = ANY(%s::bytea[]) AND expire_time <= {NOW}"

# -- operators (rocketmq-dedup check, release, stats) ---------------------------------------------
_RECORD_COLUMNS = f"application_name, topic, tag, msg_uniq_key, status, owner_token, {_LEFT_MS}"
# Deletes a live record only if it still has the status the operator saw.
DELETE_SQL = f"DELETE FROM {{table}} WHERE dedup_key = %s AND status = %s AND expire_time > {NOW}"
STATS_SQL = (
    f"SELECT status, COUNT(*) FROM {{table}} "
    f"WHERE application_name = %s AND expire_time > {NOW} GROUP BY status"
)
CLAIMS_SQL = (
    f"SELECT {_RECORD_COLUMNS} FROM {{table}} "
    f"WHERE application_name = %s AND status = 'CONSUMING' AND expire_time > {NOW}"
)
# The CONSUMED record with the least time left (rocketmq-dedup stats: the retention's horizon).
OLDEST_CONSUMED_SQL = (
    f"SELECT {_RECORD_COLUMNS} FROM {{table}} "
    f"WHERE application_name = %s AND status = 'CONSUMED' AND expire_time > {NOW} "
    "ORDER BY expire_time LIMIT 1"
)
# The table's columns, and which form its primary key; empty when there is no such table.
# Parameter: the quoted name, as the statements use it.
COLUMNS_SQL = """\
SELECT a.attname, COALESCE(a.attnum = ANY(i.indkey), false)
FROM pg_attribute a
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"""
# Whether the session's user may do what the store does on the table: one column per privilege
# (rocketmq_dedup.stores.postgres.errors.PRIVILEGES), and the user. Parameter: the quoted name.
PRIVILEGES_SQL = (
    "SELECT "
    + ", ".join(f"has_table_privilege(t, '{p}')" for p in ("SELECT", "INSERT", "UPDATE", "DELETE"))
    + ", current_user FROM to_regclass(%s) AS t"
)
# The in-process purger's session: its purge lock is a session-level advisory lock whose 64-bit
# key is (PURGE_LOCK_CLASS << 32) + the table's oid (rocketmq_dedup.stores.postgres.purge).
# Parameter: the quoted table name; NULL when there is no such table.
TABLE_OID_SQL = "SELECT to_regclass(%s)::oid::bigint"
PURGE_TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s::bigint)"
# Who holds it (pg_locks shows a bigint key as its high and low 32 bits). Parameters (high, low).
PURGE_LOCK_HOLDER_SQL = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid "
    "AND objid = %s::oid AND objsubid = 1 AND granted"
)
# A purge DELETE gives way to a consumer's row lock within this long (the next pass takes those
# rows), on the purger's own session.
PURGE_SESSION_SQL = "SET lock_timeout = '2s'"
VERSION_SQL = "SELECT current_setting('server_version'), current_setting('server_encoding')"
CHECK_SQL = "SELECT 1"
# The session's user (what a refusal's GRANT names).
USER_SQL = "SELECT current_user"


# -- exactly-once mode (rocketmq_dedup.transactional) --------------------------------------------
# Statements of the message transactions (rocketmq_dedup.stores.postgres.transaction), sent
# through libpq in pipelines: ``%s`` placeholders become ``$1``, ``$2``... there.

#: The sequence table is named after the dedup table: ``<table>_seq``.
SEQUENCE_TABLE_SUFFIX = "_seq"

SEQUENCE_SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  entity_key       bytea        NOT NULL,
  application_name varchar(255) NOT NULL,
  entity           varchar(255) NOT NULL,
  last_seq         bigint       NULL,
  PRIMARY KEY (entity_key)
)"""

#: The comments of the sequence table's columns.
SEQUENCE_COLUMN_COMMENTS = {
    "entity_key": "SHA-256 of (application, entity)",
    "application_name": "first 255 characters, for operators",
    "entity": "first 255 characters, for operators",
    "last_seq": "last sequence number applied; NULL: none yet",
}

# The entity's row, locked until the end of the transaction (created when new), and its last
# applied number. One statement: ON CONFLICT DO UPDATE waits for a row another transaction
# holds, then locks and returns the latest committed version (READ COMMITTED), so a step that
# waited for its entity reads what the step before it committed. Parameters (entity key,
# application, entity); one row (last_seq).
SEQUENCE_LOCK_SQL = """\
INSERT INTO {table} AS s (entity_key, application_name, entity, last_seq)
VALUES (%s, %s, %s, NULL)
ON CONFLICT (entity_key) DO UPDATE SET last_seq = s.last_seq
RETURNING s.last_seq"""
# Parameters (seq, entity key).
SEQUENCE_SET_SQL = "UPDATE {table} SET last_seq = %s WHERE entity_key = %s"

# The CONSUMED record, written in the business transaction and sent with its COMMIT (one
# pipeline). It must FAIL when a live record of another attempt is in the way, so that the
# COMMIT after it is never run (PostgreSQL aborts a transaction at its failed statement): an
# INSERT ... ON CONFLICT DO NOTHING would not fail, and would let the business writes commit
# beside another copy's record. The upsert takes over an expired record in the same statement
# (DO UPDATE ... WHERE expired) and returns a row only when it wrote one; 1 / count(*) then
# fails with division_by_zero (22012) when it wrote none: a live record refused it. A copy
# whose row another transaction is inserting waits for that transaction's end: its commit
# refuses this one, its rollback lets it write. Parameters (key, application, topic, tag, key
# text, owner, retention ms).
_RECORD_WRITE = f"""\
WITH written AS (
  INSERT INTO {{{{table}}}} AS r ({COLUMNS}{{columns}})
  VALUES (%s, %s, %s, %s, %s, '{{status}}', %s, {_EXPIRY}{{values}})
  ON CONFLICT (dedup_key) DO UPDATE SET
    status = '{{status}}', owner_token = EXCLUDED.owner_token,
    expire_time = EXCLUDED.expire_time{{update}}
  WHERE {_TAKEN_OVER}
  RETURNING 1
)
SELECT 1 / count(*) FROM written"""
RECORD_COMMIT_SQL = _RECORD_WRITE.format(status="CONSUMED", columns="", values="", update="")
# The FAILED record of a permanent failure, committed alone after the handler's writes were
# rolled back, refused the same way. Parameters: RECORD_COMMIT_SQL's, then the reason; without
# it on a table made before FAILED records (UndefinedColumn).
RECORD_FAILED_SQL = _RECORD_WRITE.format(
    status="FAILED",
    columns=", failure_reason",
    values=", %s",
    update=", failure_reason = EXCLUDED.failure_reason",
)
RECORD_FAILED_NO_REASON_SQL = _RECORD_WRITE.format(
    status="FAILED", columns="", values="", update=""
)
#: The sqlstate of :data:`RECORD_COMMIT_SQL` refused (division_by_zero), recognised from that
#: statement only.
RECORD_REFUSED = "22012"

# The key's live record: status, owner, ms left. Parameter: the key.
RECORD_READ_SQL = (
    f"SELECT status, owner_token, {_LEFT_MS} FROM {{table}} "
    f"WHERE dedup_key = %s AND expire_time > {NOW}"
)

# claim="before_handler": the key's advisory lock, taken without waiting (true: taken; false:
# another transaction holds it), freed at the end of the transaction (a killed consumer's with
# its session). Parameter: the lock's 64-bit key (rocketmq_dedup.stores.postgres.transaction).
KEY_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(%s::bigint)"


# -- the outbox (rocketmq_dedup.outbox; the port: rocketmq_dedup.stores.outbox) -----------------
# The claim, the settle and the operators' statements are the shared ones
# (rocketmq_dedup.stores.sql_outbox.portable_statements), with this clock and those below.

#: The outbox tables are named after the dedup table: ``<table>_outbox`` and
#: ``<table>_outbox_lane``; its indexes ``<table>_outbox_by_status`` and ``..._by_lane``.
OUTBOX_TABLE_SUFFIX = "_outbox"
OUTBOX_LANE_TABLE_SUFFIX = "_outbox_lane"
OUTBOX_INDEXES = {"_by_status": "status, lane, id", "_by_lane": "lane, status, id"}

# The server's clock in epoch milliseconds (the statement's start), as the outbox's columns hold
# it: plain numbers an operator reads as MySQL's, and the relays' arithmetic is the same on both.
NOW_MS = f"floor(extract(epoch FROM {NOW}) * 1000)::bigint"

# One row per message a handler sends (the columns: OUTBOX_COLUMN_COMMENTS). `id` orders a
# sharding key's rows (taken from the identity's sequence under the key's lock in
# <table>_outbox_lane, so in commit order). (status, lane, id): the PENDING rows without a
# sharding key in order, the backlog, the operators' lists; (lane, status, id): each sharding
# key's first PENDING row, and its next ones.
OUTBOX_SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  id            bigint        GENERATED ALWAYS AS IDENTITY,
  status        varchar(8)    NOT NULL,
  lane          varchar(64),
  topic         varchar(127)  NOT NULL,
  tag           varchar(128),
  message_key   varchar(128)  NOT NULL,
  other_keys    varchar(2048) NOT NULL DEFAULT '',
  properties    text,
  body          bytea         NOT NULL,
  created_at    bigint        NOT NULL,
  due_at        bigint        NOT NULL DEFAULT 0,
  claimed_by    varchar(64),
  attempts      integer       NOT NULL DEFAULT 0,
  failing_since bigint,
  sent_at       bigint,
  broker_msg_id varchar(128),
  last_error    varchar(1024),
  PRIMARY KEY (id)
)"""
OUTBOX_INDEX_SQL = "CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns})"

#: The comments of the outbox's columns.
OUTBOX_COLUMN_COMMENTS = {
    "id": "orders the rows of a sharding key as their transactions committed",
    "status": "PENDING, SENT, PARKED or DROPPED",
    "lane": "the sharding key: rows sent in commit order",
    "message_key": "the message key, the same on every send",
    "other_keys": "further keys, space-separated",
    "properties": "user properties, a JSON object",
    "created_at": "epoch ms, database server clock",
    "due_at": "epoch ms: no relay takes it before",
    "claimed_by": "the relay claim holding it",
    "attempts": "sends tried",
    "failing_since": "epoch ms of the first failed send",
    "sent_at": "epoch ms: sent (or dropped)",
    "broker_msg_id": "the message id the broker acknowledged",
}

# A sharding key's lock: a row written with the key's first outbox row, updated by every later
# one, locked until the handler's transaction ends.
OUTBOX_LANE_SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  lane    varchar(64) NOT NULL,
  used_at bigint      NOT NULL,
  PRIMARY KEY (lane)
)"""
OUTBOX_LANE_COMMENTS = {
    "lane": "a sharding key",
    "used_at": "epoch ms of its last outbox row",
}

# In the handler's transaction, where no statement may fail on purpose (PostgreSQL aborts the
# whole transaction at a failed statement): the lock first, an upsert that never fails. ON
# CONFLICT DO UPDATE locks the key's row until the transaction ends, waiting for a transaction
# that holds it (or is inserting it: its rollback lets this one insert), so a second
# transaction writing for the same key waits for the first to end, and its row's id is taken
# from the sequence after the first one's commit. (DO NOTHING would take no lock on a row
# that exists.) Parameter: the sharding key.
OUTBOX_LANE_LOCK_SQL = (
    f"INSERT INTO {{lanes}} (lane, used_at) VALUES (%s, {NOW_MS}) "
    "ON CONFLICT (lane) DO UPDATE SET used_at = EXCLUDED.used_at"
)
# Parameters (lane, topic, tag, message key, other keys, properties, body); one row (id).
OUTBOX_INSERT_SQL = (
    "INSERT INTO {table} (status, lane, topic, tag, message_key, other_keys, properties, body, "
    f"created_at) VALUES ('PENDING', %s, %s, %s, %s, %s, %s, %s, {NOW_MS}) RETURNING id"
)
# Runs: for each head (sharding key, head id), the PENDING rows after it in its key, in order,
# with whether each is due now: one index range per key (lane, status, id), in one statement
# over arrays. Parameters (lanes, head ids, rows per key).
OUTBOX_RUN_SQL = (
    f"SELECT o.id, o.lane, o.due_at <= {NOW_MS} "
    "FROM unnest(%s::varchar[], %s::bigint[]) AS h(lane, id) CROSS JOIN LATERAL ("
    "SELECT id, lane, due_at FROM {table} WHERE lane = h.lane AND status = 'PENDING' "
    "AND id > h.id ORDER BY id LIMIT %s) AS o"
)
# SENT, each row with its broker message id; only rows the claim still holds. Parameters (ids,
# message ids, owner).
OUTBOX_SENT_SQL = (
    f"UPDATE {{table}} AS o SET status = 'SENT', sent_at = {NOW_MS}, claimed_by = NULL, "
    "attempts = o.attempts + 1, broker_msg_id = v.m "
    "FROM unnest(%s::bigint[], %s::varchar[]) AS v(i, m) "
    "WHERE o.id = v.i AND o.claimed_by = %s"
)
# No DELETE ... LIMIT here: the batch's ids in a subquery, its rows locked (SKIP LOCKED: a row a
# relay is settling is left to the next batch). Parameters (older than ms, batch size).
OUTBOX_PURGE_SQL = (
    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} "
    f"WHERE status IN ('SENT', 'DROPPED') AND sent_at <= {NOW_MS} - %s "
    "LIMIT %s FOR UPDATE SKIP LOCKED)"
)
# A sharding key's lock row, unused for the retention and with no unsent row. The DELETE checks
# used_at itself too, so a row a transaction took meanwhile (used_at updated, the DELETE waiting
# for it) is read again once that commits, and skipped. Parameters (older than ms, batch size).
OUTBOX_LANE_PURGE_SQL = (
    f"WITH p AS (SELECT {NOW_MS} - %s::bigint AS horizon) "
    "DELETE FROM {lanes} AS d USING p WHERE d.lane IN ("
    "SELECT l.lane FROM {lanes} AS l, p WHERE l.used_at <= p.horizon AND NOT EXISTS ("
    "SELECT 1 FROM {table} AS o WHERE o.lane = l.lane AND o.status IN ('PENDING', 'PARKED')) "
    "LIMIT %s) AND d.used_at <= p.horizon"
)


def outbox_table_names(table_name: str = DEFAULT_TABLE_NAME) -> Optional[Tuple[str, str]]:
    """The outbox tables of the dedup table ``table_name`` (same schema): the outbox and its
    sharding-key locks; None when a name of theirs (or of their indexes, the longest
    ``<table>_outbox_by_status``) would be longer than an identifier may be (a table name over
    46 bytes: no outbox then)."""
    name = validate_table_name(table_name)
    longest = name.split(".")[-1] + OUTBOX_TABLE_SUFFIX + max(OUTBOX_INDEXES, key=len)
    if len(longest.encode()) > 63:
        return None
    return name + OUTBOX_TABLE_SUFFIX, name + OUTBOX_LANE_TABLE_SUFFIX


def outbox_schema_statements(table_name: str = DEFAULT_TABLE_NAME) -> List[str]:
    """The statements that create the outbox's tables, their indexes and comments; empty when
    the dedup table's name leaves no room for theirs (:func:`outbox_table_names`)."""
    names = outbox_table_names(table_name)
    if names is None:
        return []
    outbox, lanes = names
    table = quote_table(outbox)
    local = outbox.split(".")[-1]
    return [
        *_table_statements(outbox, OUTBOX_SCHEMA_SQL, OUTBOX_COLUMN_COMMENTS),
        *(
            OUTBOX_INDEX_SQL.format(name=f'"{local}{suffix}"', table=table, columns=columns)
            for suffix, columns in OUTBOX_INDEXES.items()
        ),
        *_table_statements(lanes, OUTBOX_LANE_SCHEMA_SQL, OUTBOX_LANE_COMMENTS),
    ]


def sequence_table_name(table_name: str = DEFAULT_TABLE_NAME) -> Optional[str]:
    """The sequence table of the dedup table ``table_name`` (same schema); None when
    ``<table>_seq`` would be longer than an identifier may be (a table name of 60-63 bytes: the
    exactly-once mode then has no sequence guard)."""
    name = validate_table_name(table_name) + SEQUENCE_TABLE_SUFFIX
    return name if _TABLE_NAME_RE.match(name) and len(name.encode()) <= 127 else None


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a plain (optionally schema-qualified) identifier."""
    if not isinstance(name, str) or not _TABLE_NAME_RE.match(name) or len(name.encode()) > 127:
        raise DedupConfigError(
            f"invalid table_name {name!r}: use letters, digits, _ or $, at most 63 a part "
            "(optionally schema.table)"
        )
    return name


def quote_table(table_name: str) -> str:
    """The (validated) name as an identifier: each dot-separated part in double quotes."""
    return ".".join(f'"{part}"' for part in table_name.split("."))


def schema_statements(table_name: str = DEFAULT_TABLE_NAME) -> List[str]:
    """The statements that create, if they do not exist, every table the store uses (and add
    the columns a dedup table made by an earlier version lacks), and comment their columns: the
    dedup table, the exactly-once mode's sequence table when its name fits
    (:func:`sequence_table_name`; it stays empty unless that mode's ``sequence_key`` is used)
    and the outbox's two tables when their names fit (:func:`outbox_table_names`; empty unless
    used). What ``create_table()`` runs and ``rocketmq-dedup schema postgres`` prints."""
    table = quote_table(validate_table_name(table_name))
    # A table made before FAILED records gets their reason's column (CREATE TABLE IF NOT EXISTS
    # adds none to an existing table).
    upgrade = f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {REASON_COLUMN} varchar(255)"
    statements = _table_statements(table_name, SCHEMA_SQL, COLUMN_COMMENTS)
    statements.insert(1, upgrade)
    sequence = sequence_table_name(table_name)
    if sequence is not None:
        statements += _table_statements(sequence, SEQUENCE_SCHEMA_SQL, SEQUENCE_COLUMN_COMMENTS)
    return statements + outbox_schema_statements(table_name)


def _table_statements(name: str, schema: str, comments: Dict[str, str]) -> List[str]:
    table = quote_table(validate_table_name(name))
    return [
        schema.format(table=table),
        *(f"COMMENT ON COLUMN {table}.{column} IS '{text}'" for column, text in comments.items()),
    ]
