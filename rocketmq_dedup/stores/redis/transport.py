"""How the store's commands reach Redis: RESP packing, the store's own connection (checked out
of the client's pool), sending through the client, cluster fan-out.

The coalesced round trips (:mod:`.coalesce`: one thread at a time sends) run on one connection
the store checks out of the client's own pool with ``pool.get_connection()``, so it is made
exactly as the client makes its own: Sentinel discovery, TLS, unix sockets, db, credentials,
``retry``, ``client_name``, ``health_check_interval``. The store keeps it (no pool lock and no
readiness probe per round trip) and gives it back, disconnected, on ``close()``, after a failed
round trip, and when the store is dropped without ``close()``; a forked child takes a new one.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import queue
from typing import Any, Callable, List, Optional, Sequence, Tuple

from rocketmq_dedup.message import encode_text
from rocketmq_dedup.stores.coalesce import Request

try:  # the [redis] extra
    import redis
except ImportError:  # pragma: no cover - exercised by the no-extras import test
    redis = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

Command = Tuple[Any, ...]

RAW = {"get": True}  # response-callback options: keep SET ... GET replies as they are


_hiredis_pack: Optional[Callable[[Command], bytes]]
try:  # hiredis (what redis-py parses replies with, when installed) packs in C too
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is optional
    _hiredis_pack = None


def pack_commands(commands: Sequence[Command]) -> bytes:
    """RESP-encode commands whose arguments are bytes, str or int (the store's own hot path:
    with hiredis installed, its C packer, 1.6 against 4.5 us for a claim of 6 keys); text as
    :func:`encode_text` (hiredis's UTF-8 is the same bytes for any text but lone surrogates,
    which take the Python path)."""
    if _hiredis_pack is not None:
        try:
            return b"".join([_hiredis_pack(command) for command in commands])
        except UnicodeEncodeError:
            pass
    return _pack_in_python(commands)


def _pack_in_python(commands: Sequence[Command]) -> bytes:
    out = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            if isinstance(arg, str):
                arg = encode_text(arg)
            elif isinstance(arg, int):
                arg = b"%d" % arg
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def _encode_arg(arg: Any) -> Any:
    """Text arguments as :func:`encode_text` bytes (redis-py's encoder rejects lone
    surrogates); the rest as they are."""
    return encode_text(arg) if isinstance(arg, str) else arg


def send_through_client(client: Any, commands: Sequence[Command]) -> List[Any]:
    """Send commands through the client (its pool, its cluster routing): one command, or a
    pipeline. Error replies come back as ResponseError values."""
    encoded = [(c[0], *map(_encode_arg, c[1:])) for c in commands]  # the name stays str
    if len(encoded) == 1:
        try:
            return [client.execute_command(*encoded[0], **RAW)]
        except redis.ResponseError as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for command in encoded:
        pipe.execute_command(*command, **RAW)
    return list(pipe.execute(raise_on_error=False))


def pool_exhausted(exc: BaseException) -> bool:
    """True if ``exc`` is redis-py saying the client's bounded pool had no connection to give
    (no server was asked): ``MaxConnectionsError`` (a ``ConnectionPool`` at
    ``max_connections``), or the ``ConnectionError`` a ``BlockingConnectionPool`` raises when
    its queue stayed empty for its ``timeout`` (raised while handling ``queue.Empty``). Before
    redis-py had ``MaxConnectionsError`` (< 5), a full ``ConnectionPool`` raised a plain
    ``ConnectionError("Too many connections")``: nothing but its text tells it from a refused
    connection, so for that one the text is matched."""
    if redis is None or not isinstance(exc, redis.ConnectionError):
        return False
    if isinstance(exc, getattr(redis.exceptions, "MaxConnectionsError", ())):
        return True
    if isinstance(exc.__context__, queue.Empty):
        return True
    return exc.args[:1] == ("Too many connections",)


def per_key(request: Request) -> List[Request]:
    """A request split into one request per key (cluster: a script may touch one slot only)."""
    return [
        Request(request.kind, request.millis, [k], [v])
        for k, v in zip(request.keys, request.values, strict=True)
    ]


def join_parts(request: Request, parts: Sequence[Request]) -> None:
    """Set ``request``'s result from its :func:`per_key` parts, or the first part's error."""
    request.error = next((p.error for p in parts if p.error is not None), None)
    request.result = [p.result[0] for p in parts] if request.error is None else None


# -- the store's own connection --------------------------------------------------------------

#: Incremented in a forked child: a connection pinned before the fork belongs to the parent.
_forks = [0]


def _count_fork() -> None:
    _forks[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)

#: Connections of stores dropped without close(): disconnected by the finalizer, given back to
#: their pools at the next safe point. A finalizer may run inside the cyclic GC, in any thread,
#: even one holding the pool's lock (a plain Lock in older redis-py), so it never takes it.
_orphans: List[Tuple[Any, Any]] = []


def release_orphans() -> None:
    """Give dropped stores' connections back to their pools (outside any finalizer)."""
    while _orphans:
        try:
            pool, conn = _orphans.pop()
        except IndexError:  # another thread took the last one
            return
        pool.release(conn)


@functools.cache
def _needs_command_name(pool_type: Any) -> bool:
    """redis-py < 5.3 requires ``get_connection(command_name)``; later versions deprecate it."""
    try:
        parameters = inspect.signature(pool_type.get_connection).parameters
        parameter = parameters.get("command_name")
    except (TypeError, ValueError):  # pragma: no cover - not introspectable
        return True
    return parameter is not None and parameter.default is inspect.Parameter.empty


class PinnedConnection:
    """A connection checked out of the client's pool for the store's coalesced round trips.

    ``pool.get_connection()`` connects it the pool's way. A connection built from the pool's
    ``connection_kwargs`` and used directly (what the store once did) misses Sentinel: redis-py's
    ``send_packed_command`` connects through ``connect_check_health``, which skips
    ``SentinelManagedConnection.connect`` (the step that asks Sentinel for the master), and the
    Sentinel pool's kwargs carry no host, so it connected to localhost:6379."""

    __slots__ = ("conn", "forks", "pid", "pool")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.conn: Any = None
        self.forks = _forks[0]
        self.pid = os.getpid()

    def acquire(self) -> Any:
        """Check out a connection (after a fork: a new one; the parent's is never touched)."""
        self.conn = None
        release_orphans()
        pool = self.pool
        self.forks, self.pid = _forks[0], os.getpid()
        if _needs_command_name(pool.__class__):
            self.conn = pool.get_connection("_")
        else:
            self.conn = pool.get_connection()
        return self.conn

    def release(self) -> None:
        """Disconnect the connection and give it back (no reply of ours may reach another
        user of the pool); a connection of the parent process is only forgotten."""
        conn, self.conn = self.conn, None
        if conn is not None and self.forks == _forks[0] and self.pid == os.getpid():
            try:
                conn.disconnect()
            finally:
                self.pool.release(conn)

    def orphan(self) -> None:
        """The store was dropped: disconnect now, give the connection back later."""
        conn, self.conn = self.conn, None
        if conn is not None and self.forks == _forks[0] and self.pid == os.getpid():
            conn.disconnect()
            _orphans.append((self.pool, conn))

    def round_trip(self, commands: Sequence[Command]) -> List[Any]:
        """Send commands in one round trip on the pinned connection; error replies come back
        as ResponseError values. A lost connection is replaced once (every command the store
        sends is safe to repeat); any failure gives the connection back, so no later round trip
        can read this one's unread replies."""
        packed = [pack_commands(commands)]
        for attempt in (1, 2):
            try:
                conn = self.conn
                if conn is None or self.forks != _forks[0]:
                    conn = self.acquire()
                elif getattr(conn, "_sock", conn) is None:  # disconnected by the client's owner
                    conn.connect()  # (pool.disconnect()): reconnect the pool's way, Sentinel too
                conn.send_packed_command(packed)
                replies: List[Any] = []
                for _ in commands:
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
                return replies
            except BaseException as exc:  # lost, or interrupted between two replies
                self.release()
                lost = isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError))
                lost = lost and not isinstance(exc, redis.AuthenticationError)  # lasts
                if attempt == 2 or not lost:
                    raise
                logger.warning("Redis connection lost (%s); reconnecting", exc)
        raise AssertionError("unreachable")  # pragma: no cover
