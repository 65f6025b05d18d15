"""The vocabulary of decisions: what a listener answers the broker, what a record says, what a
message's decision was, what a store outage does. Shared by the listener, the strategies, the
stores and the metrics."""

from __future__ import annotations

import enum


class ConsumeStatus(enum.IntEnum):
    """What a listener answers the broker; values equal rocketmq-client-python's."""

    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


class DedupStatus(enum.StrEnum):
    """The state of a dedup record in a store."""

    CONSUMING = "CONSUMING"
    """A consumer holds a lease on the message and is running its handler."""
    CONSUMED = "CONSUMED"
    """The handler succeeded; duplicates are acknowledged without running it."""
    FAILED = "FAILED"
    """The message can never succeed: its handler raised
    :class:`~rocketmq_dedup.errors.PermanentFailure`, or it was parked as a poison message (its
    claims lapsed ``max_lapsed_claims`` times with their consumer gone). The record keeps the
    reason for the retention, and a copy is answered as ``permanent_failure`` says, without
    the handler."""


class StoreFailurePolicy(enum.StrEnum):
    """What to do with a message when the store cannot be reached to claim it."""

    CONSUME = "consume"
    """Run the handler without dedup (at-least-once; a warning is logged). The default."""
    RECONSUME_LATER = "reconsume_later"
    """Answer RECONSUME_LATER and leave the message to the broker's retry."""


class PermanentFailurePolicy(enum.StrEnum):
    """What a message that can never succeed gets, once recorded FAILED, and every copy of it
    after (the ``permanent_failure`` setting)."""

    DLQ = "dlq"
    """RECONSUME_LATER, without the handler, on this and every later delivery, until the
    broker's retries are spent and it moves the message to ``%DLQ%<group>`` for a person to
    look at (what each client makes of it: the README's dead letters section). The default."""
    ACK = "ack"
    """CONSUME_SUCCESS: the message is done with; its FAILED record (and the log) keep the
    reason for the retention."""


class ExactlyOnceClaim(enum.StrEnum):
    """When :class:`~rocketmq_dedup.TransactionalDedupListener` claims a message's key (the
    ``exactly_once_claim`` setting)."""

    AT_COMMIT = "at_commit"
    """The record is written with the COMMIT: no round trip before the handler. The default."""
    BEFORE_HANDLER = "before_handler"
    """A named lock and a look-up before the handler: a twin in any consumer is answered at
    once."""


class SequenceMode(enum.StrEnum):
    """The exactly-once mode's sequence guard rule (the ``sequence_mode`` setting)."""

    STRICT = "strict"
    """Apply an entity's steps in order; a step ahead of the next waits (RECONSUME_LATER)."""
    LATEST = "latest"
    """Apply any step newer than the last applied; acknowledge the rest without the handler."""


class PayloadMismatch(enum.StrEnum):
    """What a duplicate key whose payload differs from the first copy's gets (the
    ``payload_mismatch`` setting)."""

    WARN = "warn"
    """Logged and counted, then answered as the duplicate it claims to be. The default."""
    REJECT = "reject"
    """Logged, counted and answered RECONSUME_LATER (it ends in the DLQ for a human)."""


class Outcome(enum.StrEnum):
    """What the listener decided for one message: the decision vocabulary of the strategies, and
    the ``outcome`` label of the metrics."""

    CONSUMED = "consumed"
    """Claimed; the handler ran and succeeded; recorded CONSUMED."""
    FAILED = "failed"
    """Claimed; the handler asked for a retry or raised; the claim was released."""
    PERMANENT_FAILURE = "permanent_failure"
    """Claimed; the handler raised (or returned) :class:`~rocketmq_dedup.errors.PermanentFailure`:
    recorded FAILED with its reason and answered as ``permanent_failure`` says."""
    POISON_PARKED = "poison_parked"
    """Claimed after ``max_lapsed_claims`` claims of the message lapsed with their consumer gone
    (its handler kills the process): recorded FAILED without running the handler again, and
    answered as ``permanent_failure`` says."""
    DUPLICATE_FAILED = "duplicate_failed"
    """A copy of a FAILED message: answered as ``permanent_failure`` says, without the
    handler."""
    DUPLICATE_CONSUMED = "duplicate_consumed"
    """A duplicate of a CONSUMED message: acked without the handler (in the exactly-once mode
    also a stale sequence step, and a copy whose commit found the record of another)."""
    DUPLICATE_IN_PROGRESS = "duplicate_in_progress"
    """A duplicate of a message still in its handler: RECONSUME_LATER without the handler."""
    SEQUENCE_GAP = "sequence_gap"
    """Exactly-once mode, ``sequence_mode="strict"``: a step ahead of its entity's next one;
    RECONSUME_LATER without the handler (the broker brings it back once the gap is filled)."""
    NO_KEY = "no_key"
    """The dedup key was None or "": the handler ran without dedup."""
    KEY_ERROR = "key_error"
    """``dedup_message_key`` (or ``payload_fingerprint``, ``sequence_key``) raised or returned a
    refused value: RECONSUME_LATER."""
    STORE_ERROR_CONSUMED = "store_error_consumed"
    """The store was unavailable (or held a record it cannot read) and the policy is
    ``consume``: the handler ran without dedup."""
    LOCK_CONFLICT = "lock_conflict"
    """A statement of the dedup layer timed out waiting for a row lock, or lost a deadlock
    (another copy of the message, or another step of its entity, held the lock): RECONSUME_LATER.
    Not an outage."""
    STORE_ERROR_LATER = "store_error_later"
    """The store was unavailable under the ``reconsume_later`` policy, or failed with a defect:
    RECONSUME_LATER."""
    STORE_MISCONFIGURED = "store_misconfigured"
    """The store refused for a reason a person must fix (a missing privilege or ACL rule, a
    read-only server): RECONSUME_LATER whatever ``store_failure_policy`` says."""
    PAYLOAD_MISMATCH = "payload_mismatch"
    """A duplicate key whose payload fingerprint differs from the first copy's: answered as the
    duplicate it claims to be with ``payload_mismatch="warn"`` (the default), RECONSUME_LATER
    with ``"reject"`` (it ends in the DLQ for a human to look at)."""
