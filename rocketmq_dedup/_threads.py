"""Keeps a native thread's Python thread state from one client callback to the next.

The classic client (rocketmq-client-python) calls the listener through ctypes from
librocketmq's own pthreads. For a thread Python did not start, ctypes makes a thread state on
every call and destroys it on return (``PyGILState_Ensure``/``Release``): about 6 us of system
time per message (CPython maps and unmaps the state's frame stack each time), and nothing kept
per thread (``threading.local``) survives between messages. On such a thread's first call,
:func:`keep_thread_state` takes one more ``PyGILState_Ensure`` that is never released, so the
thread keeps one state for its lifetime, as a C extension does for a long-lived thread of its
own; the callback still releases the GIL on return.

A kept state (about 5 KiB) outlives its thread: CPython cannot tell that a thread it did not
start has ended. Memory stays bounded however many native threads come and go (a host that
calls the listener from a thread per request, a pool that is rebuilt):

* At most :data:`MAX_KEPT` states are kept at once (about 2.5 MiB). A native thread that finds
  them all taken runs on a fresh state per call, as without this module (correct, about 20 us
  more CPU per message). librocketmq's consumer threads are a fixed pool per consumer
  (``consumeThreadCount``, default 20), far below it.
* On CPython 3.11 on Linux the states of threads that have ended are freed. When the kept
  states reach a threshold (:data:`REAP_FIRST`, then twice the number found alive; at the cap
  at most one pass every :data:`REAP_INTERVAL` seconds), the calling thread, which holds the
  GIL, looks for them: a state is freed (``PyThreadState_Clear``, ``PyThreadState_Delete``) only
  if its thread's id is gone from ``/proc/self/task`` (looked up by name: a listing made while
  threads end may skip live ones; an ended thread never runs again; an id reused by a later
  thread only keeps the state longer) and the interpreter's list of thread
  states still holds it under the unique id it had when it was kept
  (``PyThreadState_GetID``), so a state CPython freed itself (a thread ``_thread`` started
  ends with its state deleted) is never touched, even if its memory was reused. A ``/proc``
  of another PID namespace (thread ids that do not match this process's view) turns it off.
  Not on 3.12 and later: there ``PyThreadState_Delete`` of a state bound to another thread
  unbinds the *calling* thread's own state (``unbind_gilstate_tstate`` clears the caller's
  thread-specific slot), so the cap alone applies. In a forked child CPython deleted the
  parent's other states: the child starts with none recorded.

Only the classic client's path comes here: the listener asks
:mod:`rocketmq_dedup.adapters.classic` on a thread state's first call whether the thread is one
Python started, and only a thread it did not start calls :func:`keep_thread_state` (threads
Python started, the 5.x client's or a user's pool, never import this module). Interpreters
without ``ctypes.pythonapi`` (PyPy) are left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Callable, Dict, NamedTuple, Optional, Tuple

#: At most this many native threads keep their state at once.
MAX_KEPT = 512
#: The first number of kept states at which ended threads are looked for.
REAP_FIRST = 64
#: At the cap, seconds between two looks for ended threads, at least.
REAP_INTERVAL = 0.1
_TASKS = "/proc/self/task"  # one entry per live thread of this process, named by its id


class _ThreadKept(threading.local):
    done = False
    """Whether :func:`keep_thread_state` ran on the calling thread (and, on a native thread,
    its state was kept: a per-call state forgets it)."""


thread_kept = _ThreadKept()


class _CApi(NamedTuple):
    """CPython's thread-state functions (a state is passed as its address)."""

    ensure: Callable[[], int]
    current: Callable[[], Optional[int]]
    state_id: Callable[[Optional[int]], int]
    first: Callable[[Optional[int]], Optional[int]]  # the interpreter's first state
    next: Callable[[Optional[int]], Optional[int]]
    interpreter: Callable[[], Optional[int]]
    clear: Callable[[int], None]
    delete: Callable[[int], None]


def _c_api() -> Optional[_CApi]:
    """The functions as private ctypes objects (the shared ``ctypes.pythonapi`` attributes keep
    whatever types others gave them); None if this is not CPython."""
    try:
        api, ptr = ctypes.pythonapi, ctypes.c_void_p
        return _CApi(
            ctypes.PYFUNCTYPE(ctypes.c_int)(("PyGILState_Ensure", api)),
            ctypes.PYFUNCTYPE(ptr)(("PyThreadState_Get", api)),
            ctypes.PYFUNCTYPE(ctypes.c_uint64, ptr)(("PyThreadState_GetID", api)),
            ctypes.PYFUNCTYPE(ptr, ptr)(("PyInterpreterState_ThreadHead", api)),
            ctypes.PYFUNCTYPE(ptr, ptr)(("PyThreadState_Next", api)),
            ctypes.PYFUNCTYPE(ptr)(("PyInterpreterState_Get", api)),
            ctypes.PYFUNCTYPE(None, ptr)(("PyThreadState_Clear", api)),
            ctypes.PYFUNCTYPE(None, ptr)(("PyThreadState_Delete", api)),
        )
    except (AttributeError, OSError):  # not CPython
        return None


def _can_reap() -> bool:
    """CPython 3.11, and a ``/proc`` that names threads as this process sees them."""
    if _api is None or sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return False
    try:
        here = os.readlink("/proc/thread-self")  # "<pid>/task/<tid>"
    except OSError:
        return False
    return here.rsplit("/", 1)[-1] == str(threading.get_native_id())


_api = _c_api()
#: Whether the states of ended threads are freed (see the module docs).
REAPS = _can_reap()


class _Kept:
    """The kept states: address -> (the state's unique id, its native thread's id)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: Dict[int, Tuple[int, int]] = {}
        self.reap_at = REAP_FIRST if REAPS else MAX_KEPT + 1  # never, without REAPS
        self.next_pass = 0.0
        self.reaper = threading.Lock()  # one pass at a time (taken without waiting)


_registry = _Kept()


def _forget_after_fork() -> None:
    global _registry
    _registry = _Kept()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def keep_thread_state() -> None:
    """Make the calling thread's state outlive this call: for a thread Python did not start
    (the caller checked: :func:`rocketmq_dedup.adapters.classic.started_by_python`); once
    per thread; never raises."""
    if thread_kept.done:
        return
    try:
        thread_kept.done = True  # a fresh per-call state forgets it: the next call comes back
        if _api is not None:
            _keep(_api, _registry)
    except Exception:  # pragma: no cover - an optimisation must never fail a message
        pass


def _keep(api: _CApi, kept: _Kept) -> None:
    """Keep the calling native thread's state, unless :data:`MAX_KEPT` are kept."""
    if len(kept.states) >= kept.reap_at:
        _reap(api, kept)
    with kept.lock:
        if len(kept.states) >= MAX_KEPT:
            return  # this call's state goes on return, and ``done`` with it
        api.ensure()  # the GIL is held: only counts one more holder of this thread's state
        state = api.current()
        if state is not None:
            kept.states[state] = (api.state_id(state), threading.get_native_id())


def _reap(api: _CApi, kept: _Kept) -> None:
    """Free the kept states of threads that have ended (see the module docs)."""
    now = time.monotonic()
    if len(kept.states) >= MAX_KEPT and now < kept.next_pass:
        return
    if not kept.reaper.acquire(blocking=False):  # another thread is at it
        return
    try:
        kept.next_pass = now + REAP_INTERVAL
        with kept.lock:
            recorded = dict(kept.states)  # each thread was alive when it was recorded
        if not _alive(threading.get_native_id()):  # pragma: no cover - not our /proc
            kept.reap_at = MAX_KEPT + 1  # never again: the cap alone
            return
        ended = {state: sid for state, (sid, tid) in recorded.items() if not _alive(tid)}
        if ended:
            live = _live_states(api)
            with kept.lock:
                for state in ended:
                    del kept.states[state]
            for state, sid in ended.items():
                if live.get(state) == sid:  # still the state that was kept
                    api.clear(state)  # may run __del__ methods: on this thread, GIL held
                    api.delete(state)
        kept.reap_at = min(max(REAP_FIRST, 2 * len(kept.states)), MAX_KEPT)
    finally:
        kept.reaper.release()


def _alive(tid: int) -> bool:
    """Whether this process has a thread ``tid``: a lookup by name (exact), never a listing
    of the directory (a listing made while threads end may skip live ones)."""
    return os.path.exists(f"{_TASKS}/{tid}")


def _live_states(api: _CApi) -> Dict[int, int]:
    """The interpreter's thread states now: address -> unique id."""
    found: Dict[int, int] = {}
    state = api.first(api.interpreter())
    while state:
        found[state] = api.state_id(state)
        state = api.next(state)
    return found


def kept_states() -> int:
    """How many native threads' states are kept now (for tests and benchmarks)."""
    return len(_registry.states)


def thread_state_kept() -> bool:
    """True if :func:`keep_thread_state` ran on the calling thread and its state was kept (for
    tests: on a native thread whose state was not kept, this is False at the next call)."""
    return thread_kept.done
