"""What the records are: keys, values, the Lua scripts and how replies map to results.

Record key: ``{prefix}:{application}:{topic}:{tag}:{key}`` with every segment percent-escaped
(``%``, ``:``, ``{``, ``}``), so different elements never share a key and no key forms a
cluster hash tag by accident; text is encoded with :func:`~rocketmq_dedup.message.encode_text`,
so any code point (a lone surrogate too) makes a key. Value: ``CONSUMING:<owner token>`` (TTL =
the lease), ``CONSUMED:<owner token>`` or ``FAILED:<owner token> <reason>`` (TTL = the
retention).

Lapsed claims (:meth:`~rocketmq_dedup.stores.base.DedupStore.count_lapses`): a record vanishes
with its lease, so a claim whose consumer died leaves nothing to see. Once asked to count, the
store keeps beside each record a counter of its claims since it was last settled,
``<prefix>:{<record key>}`` (:func:`lapse_key`: the record key as its hash tag, so both live in
one cluster slot; under the ACL pattern of the records): the claim adds one (so a claim that
finds ``n`` counts ``n - 1`` lapsed before it), and a mark, a release and a FAILED record delete
it. It lives :data:`LAPSE_MEMORY_MS` after the last claim. The counted kinds
(:data:`COUNTED_KINDS`) are scripts over the record keys followed by their counters' keys.

Nothing here does I/O; :mod:`.transport` sends what :func:`plan_calls` builds.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from rocketmq_dedup.message import DedupElement, encode_text, escape_segment, to_text
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import CLAIMED, ClaimResult, Record, parse_status
from rocketmq_dedup.stores.coalesce import Request, by_kind, deliver

DEFAULT_KEY_PREFIX = "MSGDEDUP"

# KEYS[i]: the record key of element i
# ARGV[1]: the lease, in milliseconds
# ARGV[i + 1]: the claim value of element i ("CONSUMING:<owner token>")
# Returns one entry per key: 1 when the claim is ours (the key was free, or already holds this
# very claim, so a retried call is harmless), else the record's current value. GET and SET run
# in one script, so a record that vanishes in between cannot let a second claimer win.
CLAIM_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  if current == ARGV[i + 1] then
    result[i] = 1
  elseif current then
    result[i] = current
  else
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
    result[i] = 1
  end
end
return result
"""

# KEYS[i]: the record key of element i
# ARGV[1]: the retention, in milliseconds
# ARGV[i + 1]: the value of element i ("CONSUMED:<owner token>")
# Sets every key to CONSUMED, whoever held it: a success is always recorded. Returns 1 per key.
MARK_CONSUMED_SCRIPT = """
local result = {}
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
  result[i] = 1
end
return result
"""


def _if_still_owned(action: str) -> str:
    """The compare step RELEASE and RENEW share: run ``action`` on each key that still holds
    exactly the claim value it was claimed with; 1 per key acted on, else 0."""
    return f"""
local result = {{}}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    {action}
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""


# KEYS[i]: the record key of element i
# ARGV[1]: unused (keeps the argument layout of the other scripts)
# ARGV[i + 1]: the claim value element i was claimed with ("CONSUMING:<owner token>")
# Deletes each key still holding exactly that claim; returns 1 per deleted key, else 0. A newer
# owner's claim or any CONSUMED record is left alone.
RELEASE_SCRIPT = _if_still_owned("redis.call('DEL', key)")

# KEYS[i]: the record key of element i
# ARGV[1]: the lease, in milliseconds
# ARGV[i + 1]: the claim value element i was claimed with ("CONSUMING:<owner token>")
# Extends each key still holding exactly that claim to the lease; returns 1 per renewed key,
# else 0 (taken over, consumed or gone: never touched).
RENEW_SCRIPT = _if_still_owned("redis.call('PEXPIRE', key, ARGV[1])")

# KEYS[1]: the record key
# ARGV[1]: "1" to delete the record whatever it is (an operator's --force), else "0"
# Deletes the record if it is a CONSUMING claim (any owner; a stuck claim), or with ARGV[1] any
# record; returns the value deleted, else nil. GET and DEL in one script: a claim that turns
# CONSUMED in between is never deleted without force.
DELETE_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current and (ARGV[1] == '1' or string.sub(current, 1, 9) == 'CONSUMING') then
  redis.call('DEL', KEYS[1])
  return current
end
return false
"""

#: How long a lapsed-claim counter lives after the last claim of its record (a poison message
#: comes back within minutes, or hours through the broker's retries).
LAPSE_MEMORY_MS = 86_400_000

# The counted kinds' scripts: KEYS[1..n] the record keys, KEYS[n + i] the counter of record i
# (lapse_key), ARGV as in the plain scripts.
# Claim: as CLAIM_SCRIPT; a key claimed also counts the claim on its counter, and the reply is
# the count (1: none lapsed before it; a refusal is the record's value, a repeat 1).
CLAIM_COUNTED_SCRIPT = f"""
local n = #KEYS / 2
local result = {{}}
for i = 1, n do
  local current = redis.call('GET', KEYS[i])
  if current == ARGV[i + 1] then
    result[i] = 1
  elseif current then
    result[i] = current
  else
    redis.call('SET', KEYS[i], ARGV[i + 1], 'PX', ARGV[1])
    local claims = tonumber(redis.call('GET', KEYS[n + i]) or '0') + 1
    redis.call('SET', KEYS[n + i], claims, 'PX', {LAPSE_MEMORY_MS})
    result[i] = claims
  end
end
return result
"""
# Mark: as MARK_CONSUMED_SCRIPT, and the record settled (its counter deleted).
MARK_COUNTED_SCRIPT = """
local n = #KEYS / 2
local result = {}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[i + 1], 'PX', ARGV[1])
  redis.call('DEL', KEYS[n + i])
  result[i] = 1
end
return result
"""
# Release: as RELEASE_SCRIPT; a claim released settles its record (its counter deleted).
RELEASE_COUNTED_SCRIPT = """
local n = #KEYS / 2
local result = {}
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[i + 1] then
    redis.call('DEL', KEYS[i])
    redis.call('DEL', KEYS[n + i])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""
# FAILED: ARGV[1] the retention, ARGV[i + 1] "FAILED:<owner> <reason>". Each record becomes
# FAILED unless it is CONSUMED (a success is never downgraded); each is settled (its counter,
# if any, deleted). Returns 1 per key.
MARK_FAILED_SCRIPT = """
local n = #KEYS / 2
local result = {}
for i = 1, n do
  local current = redis.call('GET', KEYS[i])
  if not current or string.sub(current, 1, 9) ~= 'CONSUMED:' then
    redis.call('SET', KEYS[i], ARGV[i + 1], 'PX', ARGV[1])
  end
  redis.call('DEL', KEYS[n + i])
  result[i] = 1
end
return result
"""

CLAIM, MARK, RELEASE, RENEW = "claim", "mark", "release", "renew"
CLAIM_COUNTED, MARK_COUNTED, RELEASE_COUNTED = "claim+", "mark+", "release+"
FAIL = "fail"
#: The kinds whose script takes each record's lapsed-claim counter after the record keys.
COUNTED_KINDS = frozenset({CLAIM_COUNTED, MARK_COUNTED, RELEASE_COUNTED, FAIL})
SCRIPTS = {
    CLAIM: CLAIM_SCRIPT,
    MARK: MARK_CONSUMED_SCRIPT,
    RELEASE: RELEASE_SCRIPT,
    RENEW: RENEW_SCRIPT,
    CLAIM_COUNTED: CLAIM_COUNTED_SCRIPT,
    MARK_COUNTED: MARK_COUNTED_SCRIPT,
    RELEASE_COUNTED: RELEASE_COUNTED_SCRIPT,
    FAIL: MARK_FAILED_SCRIPT,
}
CONSUMING = "CONSUMING:"
CONSUMED = "CONSUMED:"
FAILED = "FAILED:"


def lapse_key(record_key: bytes) -> bytes:
    """The lapsed-claim counter of a record: ``<prefix>:{<record key>}`` (the record key is its
    hash tag: the same cluster slot; a record key holds no brace, every segment escaped)."""
    return record_key[: record_key.index(b":")] + b":{" + record_key + b"}"


def failed_value(owner: str, reason: str) -> str:
    """A FAILED record's value: ``FAILED:<owner> <reason>`` (owner tokens hold no space)."""
    return f"{FAILED}{owner} {reason}"


#: Key heads (prefix, application, topic, tag) cached per store, and the longest one cached: the
#: cache stays under 256 KiB whatever the elements are.
HEAD_CACHE_ENTRIES = 256
HEAD_CACHE_MAX_BYTES = 1024


class RecordKeys:
    """Builds record keys, with a bounded cache of the escaped key heads (a message's claim
    and its mark share a head, and so do most messages of a topic)."""

    __slots__ = ("_heads", "_prefix")

    def __init__(self, key_prefix: str) -> None:
        self._prefix = escape_segment(key_prefix) + ":"
        self._heads: Dict[Tuple[str, str, str], bytes] = {}

    def __call__(self, element: DedupElement) -> bytes:
        app, topic, tag, key = element
        head = self._heads.get((app, topic, tag))
        if head is None:
            head = encode_text(
                f"{self._prefix}{escape_segment(app)}:{escape_segment(topic)}:"
                f"{escape_segment(tag)}:"
            )
            if len(head) <= HEAD_CACHE_MAX_BYTES:  # bounded in entries and in bytes
                if len(self._heads) >= HEAD_CACHE_ENTRIES:
                    self._heads.clear()
                self._heads[app, topic, tag] = head
        return head + encode_text(escape_segment(key))


class Call:
    """One command of a round trip and how its reply is split among its requests."""

    __slots__ = ("command", "convert", "members")

    def __init__(
        self,
        command: Tuple[Any, ...],
        members: List[Request],
        convert: Optional[Callable[[Any], List[Any]]] = None,
    ) -> None:
        self.command = command
        self.members = members
        self.convert = convert

    def deliver(self, reply: Any) -> None:
        deliver(self.members, self.convert(reply) if self.convert is not None else reply)


def plan_calls(batch: Sequence[Request], shas: Mapping[str, str], set_nx_get: bool) -> List[Call]:
    """One command per (kind, millis) group: a plain SET for a lone single-key mark, ``SET NX
    PX GET`` for a lone single-key claim (Redis >= 7.0, ``set_nx_get``), else one script call
    (``shas[kind]``) over all the group's keys."""
    calls = []
    for (kind, millis), members in by_kind(batch).items():
        if len(members) == 1 and len(members[0].keys) == 1:
            key, value = members[0].keys[0], members[0].values[0]
            if kind == MARK:
                calls.append(Call(("SET", key, value, "PX", millis), members, set_reply))
                continue
            if kind == CLAIM and set_nx_get:
                command = ("SET", key, value, "NX", "PX", millis, "GET")
                calls.append(Call(command, members, set_get_reply(value)))
                continue
        keys = [k for r in members for k in r.keys]
        values = [v for r in members for v in r.values]
        if kind in COUNTED_KINDS:
            keys += [lapse_key(k) for k in keys]
        calls.append(Call(("EVALSHA", shas[kind], len(keys), *keys, millis, *values), members))
    return calls


def set_reply(reply: Any) -> List[Any]:
    """A plain SET answers OK: its one key was written."""
    return [1]


def set_get_reply(value: str) -> Callable[[Any], List[Any]]:
    """SET NX GET answers nil when it set the key; our own value means a repeated claim."""

    def convert(reply: Any) -> List[Any]:
        return [1 if reply is None or to_text(reply) == value else reply]

    return convert


def claim_result(reply: Any) -> ClaimResult:
    """A claim's per-key reply: 1 when ours (a counted claim: the count of claims since the
    record was last settled, this one included), else the record's value."""
    if reply == 1:
        return CLAIMED
    if isinstance(reply, int):
        return ClaimResult(True, None, reply - 1)
    return ClaimResult(False, parse_record(reply))


def parse_record(
    value: Any, pttl: Any = None, element: Optional[DedupElement] = None
) -> Optional[Record]:
    """A record from its value (``STATUS:<owner token>``) and, when read, its ``PTTL``; None
    when there is no value. The one place a Redis record's value is read."""
    if value is None:
        return None
    text = to_text(value)
    owner = text.partition(":")[2]
    status = parse_status(text)
    reason = None
    if status is DedupStatus.FAILED:
        owner, _, reason = owner.partition(" ")
    millis = int(pttl) if pttl is not None else -1
    expires = millis if millis >= 0 else None
    return Record(status, owner or None, expires, element, reason if reason else None)


_UNESCAPE = re.compile(rb"%(25|3A|7B|7D)")
_GLOB_SPECIAL = re.compile(rb"([*?\[\]\\])")


def app_key_pattern(key_prefix: str, application: str) -> bytes:
    """A ``SCAN MATCH`` pattern for every record key of ``application`` (glob characters in
    the names are escaped)."""
    return key_pattern(key_prefix, application)


def key_pattern(key_prefix: str, *segments: str) -> bytes:
    """A glob (``SCAN MATCH``, an ACL key pattern ``~...``) for every record key under
    ``key_prefix`` and the leading ``segments`` (an application...), escaped."""
    head = "".join(f"{escape_segment(part)}:" for part in (key_prefix, *segments))
    return _GLOB_SPECIAL.sub(rb"\\\1", encode_text(head)) + b"*"


def parse_key(key: bytes) -> Optional[DedupElement]:
    """The element of a record key (its four segments after the prefix, unescaped); None for
    a key of another shape."""
    parts = key.split(b":")
    if len(parts) != 5:
        return None
    fields = [to_text(_UNESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), p)) for p in parts[1:]]
    return DedupElement(*fields)
