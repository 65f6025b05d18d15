"""The PostgreSQL store's rows: the values a record's row is written with (key and readable
columns, as single values or as one array per column for ``unnest``), and the
:class:`~rocketmq_dedup.stores.base.Record` a row read back becomes. One place, for the record
store and for any statement that writes the same row (the exactly-once mode's record)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.stores.base import Claim, Record, parse_status

#: Characters kept in each readable column (``varchar(255)``).
READABLE_CHARS = 255


def readable(text: str) -> str:
    """The first 255 characters, as the readable columns hold them: a PostgreSQL text holds
    neither NUL (it becomes U+FFFD) nor an unpaired surrogate (UTF-8 cannot encode it: ``?``,
    as on MySQL). The record's identity is the digest of the whole element, never this text."""
    short = text[:READABLE_CHARS]
    if short.isascii():
        return short.replace("\x00", "\ufffd") if "\x00" in short else short
    return short.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def element_row(element: DedupElement, digest: bytes) -> Tuple[bytes, str, str, str, str]:
    """The key and readable columns of ``element``'s row."""
    app, topic, tag, key = element
    return (digest, readable(app), readable(topic), readable(tag), readable(key))


def claim_row(claim: Claim, digest: bytes, ms: int) -> Tuple[Any, ...]:
    """One row's parameters for the single-row claim and mark statements: key, readable
    columns, owner, and the lease or retention in milliseconds."""
    return (*element_row(claim.element, digest), claim.owner, ms)


def unique_by_key(claims: Sequence[Claim]) -> Tuple[List[bytes], List[int]]:
    """The digest of each claim, and the indexes of the first claim of each digest in key
    order: the rows of a batch statement (ON CONFLICT may touch a row once per statement, and
    concurrent batches that lock rows in one order never deadlock)."""
    digests = [element_digest(c.element) for c in claims]
    first: dict[bytes, int] = {}
    for i, digest in enumerate(digests):
        first.setdefault(digest, i)
    return digests, [first[d] for d in sorted(first)]


def claim_columns(
    claims: Sequence[Claim], digests: Sequence[bytes], indexes: Sequence[int]
) -> List[List[Any]]:
    """The batch statements' arrays, one per column (keys, applications, topics, tags, key
    texts, owners), for the claims at ``indexes``."""
    columns: List[List[Any]] = [[], [], [], [], [], []]
    keys, apps, topics, tags, texts, owners = columns
    for i in indexes:
        claim = claims[i]
        app, topic, tag, key = claim.element
        keys.append(digests[i])
        apps.append(readable(app))
        topics.append(readable(topic))
        tags.append(readable(tag))
        texts.append(readable(key))
        owners.append(claim.owner)
    return columns


def live_record(status: Optional[str], owner: Optional[str], left_ms: Optional[int]) -> Record:
    """A live row read back (status, owner, milliseconds left) as a record."""
    return Record(parse_status(status), owner, max(0, int(left_ms or 0)))


def listed_record(row: Sequence[Any]) -> Record:
    """A record listed by ``stats``: its element from the readable columns."""
    app, topic, tag, key, status, owner, left = row
    return Record(
        parse_status(status), owner, max(0, int(left)), DedupElement(app, topic, tag, key)
    )
