"""Keeps a native thread's Python thread state from one client callback to the next.

The classic client (rocketmq-client-python) calls the listener through ctypes from
librocketmq's own pthreads. For a thread Python did not start, ctypes makes a thread state on
every call and destroys it on return (``PyGILState_Ensure``/``Release``): about 6 us of system
time per message (CPython maps and unmaps the state's frame stack each time), and nothing kept
per thread (``threading.local``) survives between messages. On such a thread's first call,
:func:`keep_thread_state` takes one more ``PyGILState_Ensure`` that is never released, so the
thread keeps one state for its lifetime, as a C extension does for a long-lived thread of its
own; the callback still releases the GIL on return.

Bounded: one state (a few KiB) per native thread that ever called a listener, kept after the
thread ends; librocketmq's consumer threads are a fixed pool per consumer. Threads Python
started (the 5.x client's, a user's pool) and interpreters without ``ctypes.pythonapi`` (PyPy)
are left alone.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, Optional

_kept = threading.local()


def _gilstate_ensure() -> Optional[Callable[[], int]]:
    try:
        ensure = ctypes.pythonapi.PyGILState_Ensure
    except (AttributeError, OSError):  # not CPython
        return None
    ensure.argtypes = []
    ensure.restype = ctypes.c_int
    return ensure


_ensure = _gilstate_ensure()


def keep_thread_state() -> None:
    """Make the calling thread's state outlive this call if Python did not start the thread
    (a few attribute reads once it was done; never raises)."""
    if getattr(_kept, "done", False):
        return
    try:
        _kept.done = True  # on a fresh per-call state this is forgotten: the check below runs
        if _ensure is not None and isinstance(threading.current_thread(), threading._DummyThread):
            _ensure()  # the GIL is held: only counts one more holder of this thread's state
    except Exception:  # pragma: no cover - an optimisation must never fail a message
        pass


def thread_state_kept() -> bool:
    """True if :func:`keep_thread_state` ran on the calling thread and its state was kept (for
    tests: on a native thread whose state was not kept, this is False at the next call)."""
    return getattr(_kept, "done", False)
