"""The classic ``rocketmq-client-python`` (0.5.0rc2 wheel and 2.x): its conveniences, and its one
quirk.

The listener is already the callback: ``consumer.subscribe(topic, listener)``. It never raises,
which matters: an exception escaping the client's ctypes callback leaves the C side with an
undefined status (observed: the message is acked and lost).

The quirk: librocketmq calls the callback from its own native threads, and for a thread Python
did not start, ctypes makes a Python thread state for each call and destroys it on return (about
6 us of CPU per message, and a ``threading.local`` forgets everything between messages). The
listener's ``__call__`` asks, once per thread state (one ``threading.local`` read per message,
:data:`callback_thread`), whether the calling thread is one Python started; only a thread it did
not start goes on to :mod:`rocketmq_dedup._threads`, which keeps that thread's state from then
on. Threads Python started (the 5.x client's, :mod:`rocketmq_dedup.testing`'s, any caller's own)
never reach that module: it is not even imported.
"""

from __future__ import annotations

import threading
from typing import Any

from rocketmq_dedup.adapters.clients import check_one_client


def set_name_server(client: Any, address: str) -> None:
    """Set the name server on a producer or consumer of either client version
    (``set_name_server_address`` in 2.x, ``set_namesrv_addr`` in 0.5.0rc2). Raises
    :class:`~rocketmq_dedup.errors.ClientConflictError` when the 5.x client is installed
    beside the classic one (they share the ``rocketmq`` package)."""
    check_one_client()
    for name in ("set_name_server_address", "set_namesrv_addr"):
        setter = getattr(client, name, None)
        if callable(setter):
            setter(address)
            return
    raise TypeError(f"{type(client).__name__} has no name-server setter")


class _CallbackThread(threading.local):
    seen = False
    """Whether this thread state called the listener before (a native thread whose state is not
    kept gets a new one, which has not, at each call)."""


#: Read by the listener before each message: ``callback_thread.seen`` is False on a thread
#: state's first call, when :func:`first_call_on_thread` runs.
callback_thread = _CallbackThread()


def first_call_on_thread() -> None:
    """The listener's first call on this thread state: a thread Python did not start (the
    classic client's) keeps its Python thread state from now on; never raises."""
    try:
        callback_thread.seen = True
        if started_by_python():
            return
        from rocketmq_dedup import _threads  # imported by the first native thread only

        _threads.keep_thread_state()
    except Exception:  # pragma: no cover - an optimisation must never fail a message
        pass


def started_by_python() -> bool:
    """Whether the calling thread is one Python started (the main thread, a ``threading.Thread``),
    read from ``threading``'s table of threads without adding to it: ``threading.current_thread()``
    would register a ``_DummyThread`` for every new native thread, kept for good before Python
    3.13. A native thread someone called ``current_thread()`` on has a ``_DummyThread`` there: it
    is not one. (A thread of ``_thread.start_new_thread`` is not in the table either, and is
    treated as native.)"""
    thread = threading._active.get(threading.get_ident())  # type: ignore[attr-defined]
    return thread is not None and not isinstance(thread, threading._DummyThread)
