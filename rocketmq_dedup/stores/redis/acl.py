"""What the Redis store needs of its user and its server, and what a refusal means.

* The ACL rules the application's user needs (:func:`acl_rules`): the commands the store sends
  (:data:`COMMANDS`), those its Lua scripts run (:data:`SCRIPT_COMMANDS`: ACL checks them
  too), and the pattern of its record keys, ``~<key_prefix>:*`` (the start-up check's probe
  keys fit it). A ``RedisCluster`` client also runs :data:`CLUSTER_COMMANDS` when it starts;
  the operators' commands (:data:`OPERATOR_COMMANDS`: ``rocketmq-dedup check`` and ``stats``,
  the start-up check's eviction look-up) are optional.
* :func:`refusal`: what a person must fix when an error is the server refusing for good: an
  ACL denial (``NOPERM``; a command of a script denied is an ``ERR`` reply), a read-only
  replica (``READONLY``), refused credentials (``WRONGPASS``, ``NOAUTH``); None for anything
  else. Behind Sentinel, redis-py turns a ``READONLY`` of a demoted master into a
  ``ConnectionError`` (an outage: the next connection asks Sentinel for the new master).
* :func:`evicts_records`: a ``maxmemory-policy`` that may evict dedup records under memory
  pressure (``allkeys-*``; and ``volatile-*``, since every record has a TTL).
"""

from __future__ import annotations

import re
from typing import Optional

try:  # the [redis] extra
    import redis
except ImportError:  # pragma: no cover - exercised by the no-extras import test
    redis = None  # type: ignore[assignment]

#: The commands the store sends: PING (the start-up check), GET and PTTL (reads), SET (a claim
#: is ``SET NX PX GET``, a mark ``SET PX``), EVALSHA and SCRIPT LOAD (its Lua scripts).
COMMANDS = ("ping", "get", "set", "pttl", "evalsha", "script|load")
#: The commands the store's Lua scripts run (claim, mark, release, renew).
SCRIPT_COMMANDS = ("get", "set", "del", "pexpire")
#: What a ``RedisCluster`` client runs when it starts (the slot map, the command table).
CLUSTER_COMMANDS = ("cluster|slots", "command")
#: Optional: ``rocketmq-dedup check`` (INFO, SCRIPT LOAD), ``stats`` (SCAN) and the start-up
#: check's look-up of ``maxmemory-policy`` (CONFIG GET, else INFO).
OPERATOR_COMMANDS = ("info", "config|get", "scan")

#: The policies that never evict a key: every other one may evict dedup records.
SAFE_POLICIES = frozenset({"noeviction"})

_COMMAND_DENIED = re.compile(r"permissions to run the '([^']+)' command")
_SCRIPT_DENIED = re.compile(r"can't run this command|ACL failure in script|no permissions", re.I)


def acl_rules(key_pattern: str) -> str:
    """The ACL rules of the application's user: its commands and its keys."""
    commands = dict.fromkeys((*COMMANDS, *SCRIPT_COMMANDS))  # in order, once each
    return " ".join([*(f"+{command}" for command in commands), f"~{key_pattern}"])


def refusal(exc: BaseException, user: str, key_pattern: str, where: str) -> Optional[str]:
    """What a person must fix when ``exc`` is a refusal (module docstring) of the server at
    ``where`` to ``user``, whose records' keys match ``key_pattern``; None for anything else."""
    if redis is None:
        return None
    needs = f"the store needs {acl_rules(key_pattern)}"
    if isinstance(exc, redis.exceptions.NoPermissionError):
        command = _COMMAND_DENIED.search(str(exc))
        if command is not None:
            name = command.group(1)
            return f"the Redis user {user!r} may not run {name!r} (ACL): {needs}"
        return f"the Redis user {user!r} may not use the dedup keys (ACL): {needs}"
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return (
            f"the Redis server at {where} is a read-only replica: point the client at the "
            "primary (or through Sentinel: Sentinel(...).master_for(...))"
        )
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return (
            f"the Redis server at {where} refused the credentials of user {user!r}: fix the "
            "client's username and password"
        )
    if isinstance(exc, redis.ResponseError) and _SCRIPT_DENIED.search(str(exc)):
        return (
            f"the Redis user {user!r} may not run a command of the store's Lua scripts (ACL: "
            f"they run {', '.join(SCRIPT_COMMANDS)}): {needs}"
        )
    return None


def evicts_records(policy: str) -> bool:
    """Whether ``maxmemory-policy`` ``policy`` may evict dedup records."""
    return policy not in SAFE_POLICIES
