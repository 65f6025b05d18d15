"""A native callback thread keeps its Python thread state once it called a listener
(rocketmq_dedup._threads), driven from real pthreads (tests/native) on the memory store."""

from __future__ import annotations

import _thread
import ctypes
import itertools
import os
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig, _threads
from rocketmq_dedup._threads import kept_states, thread_state_kept
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.native import run_callbacks
from tests.support import fresh_python, last_json_line, wait_for

SUCCESS = int(ConsumeStatus.CONSUME_SUCCESS)


class Listener(DedupConcurrentListener):
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.runs: List[str] = []

    def do_handle_msg(self, msg: object) -> bool:
        self.runs.append(str(msg))
        return True


def test_a_plain_native_callback_gets_a_fresh_state_each_time(native_lib: ctypes.CDLL) -> None:
    """Control: without a listener, every call on the same native thread starts afresh."""
    local, seen = threading.local(), [None] * 10

    def callback(index: int) -> int:
        seen[index] = getattr(local, "value", None)
        local.value = index
        return SUCCESS

    assert run_callbacks(native_lib, callback, 1, 10)[0] == 10
    assert seen == [None] * 10


def test_after_the_first_message_a_native_thread_keeps_its_state(native_lib: ctypes.CDLL) -> None:
    """The listener's first call on a native thread keeps that thread's state: a
    threading.local set in one callback is there in the next, and every message ran once."""
    listener = Listener(DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore()))
    local, calls = threading.local(), 20
    seen: List[Optional[int]] = [None] * calls
    kept_on_entry = [False] * calls
    run = uuid.uuid4().hex

    def callback(index: int) -> int:
        kept_on_entry[index] = thread_state_kept()
        seen[index] = getattr(local, "value", None)
        local.value = index
        return int(listener(ClassicMessage(f"{run}-{index}")))

    assert run_callbacks(native_lib, callback, 1, calls)[0] == calls
    assert kept_on_entry == [False] + [True] * (calls - 1)
    assert seen == [None, *range(calls - 1)]
    assert len(listener.runs) == calls


def test_one_kept_state_per_native_thread_and_none_for_python_threads(
    native_lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extra GIL state is taken once per native thread, however many messages it
    handles, and never on a thread Python started."""
    real_api = _threads._api
    assert real_api is not None  # CPython
    taken: List[int] = []

    def counting_ensure() -> int:
        taken.append(threading.get_ident())
        return real_api.ensure()

    monkeypatch.setattr(_threads, "_api", real_api._replace(ensure=counting_ensure))
    listener = Listener(DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore()))
    run = uuid.uuid4().hex
    python_thread = threading.Thread(
        target=lambda: [listener(ClassicMessage(f"{run}-py-{i}")) for i in range(10)]
    )
    python_thread.start()
    python_thread.join(10)
    assert taken == []

    def callback(index: int) -> int:
        return int(listener(ClassicMessage(f"{run}-{index}")))

    assert run_callbacks(native_lib, callback, 4, 25)[0] == 100
    assert len(taken) == 4 == len(set(taken))
    assert len(listener.runs) == 110


# -- native threads that come and go (issue 21, item 2) -------------------------------------


def run_churn(*args: str) -> Dict[str, Any]:
    """``python -m tests.native.churn`` in a fresh process (its RSS is about this run only)."""
    measured: Dict[str, Any] = last_json_line(
        fresh_python("-m", "tests.native.churn", *args, timeout=300)
    )
    return measured


def test_short_lived_native_threads_leave_memory_bounded() -> None:
    """4,000 native threads, each calling a listener once and ending: the process's resident
    memory grows by at most 8 MiB (it grew 19-21 MiB when every thread's state was kept for
    good, about 5 KiB each); here the ended threads' states are freed."""
    measured = run_churn("--threads", "4000")
    assert measured["successes"] == 4000
    assert measured["rss_growth_mib"] <= 8.0, measured
    if sys.version_info[:2] == (3, 11) and sys.platform == "linux":
        assert measured["reaps"], measured  # where ended threads' states are freed
        assert measured["kept_states"] < _threads.MAX_KEPT, measured


def test_the_cap_alone_bounds_memory() -> None:
    """Where ended threads' states cannot be freed (Python >= 3.12), at most MAX_KEPT are
    kept: the threads past it run on per-call states, and memory stays within the bound."""
    measured = run_churn("--threads", "4000", "--no-reap")
    assert measured["successes"] == 4000
    assert measured["kept_states"] == _threads.MAX_KEPT, measured
    assert measured["rss_growth_mib"] <= 8.0, measured


def test_long_lived_threads_keep_their_state_while_others_come_and_go(
    native_lib: ctypes.CDLL,
) -> None:
    """4 long-lived native threads (a consumer's callback pool) keep their states through
    their calls while 2,000 short-lived ones come and go beside them and ended threads' states
    are freed: each long-lived thread's threading.local survives every call, and every
    message runs."""
    listener = Listener(DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore()))
    run, threads, calls = uuid.uuid4().hex, 4, 400
    local = threading.local()
    broken: List[int] = []
    churned = threading.Event()
    serial = itertools.count()

    def long_lived(index: int) -> int:
        call = index % calls
        if call and (not thread_state_kept() or getattr(local, "call", None) != call - 1):
            broken.append(index)
        local.call = call
        status = int(listener(ClassicMessage(f"{run}-long-{index}")))
        if not churned.is_set():
            time.sleep(0.002)  # GIL released: the short-lived threads run meanwhile
        return status

    def short_lived(index: int) -> int:  # index: 0-49 in each wave
        return int(listener(ClassicMessage(f"{run}-short-{next(serial)}")))

    def churn() -> None:
        for _ in range(40):
            run_callbacks(native_lib, short_lived, 50, 1)
        churned.set()

    churner = threading.Thread(target=churn)
    churner.start()
    successes, _ = run_callbacks(native_lib, long_lived, threads, calls)
    churner.join(60)
    assert churned.is_set() and successes == threads * calls
    assert broken == []
    assert len(listener.runs) == threads * calls + 2000
    assert kept_states() <= _threads.MAX_KEPT


def test_states_cpython_deleted_itself_are_never_freed_again(native_lib: ctypes.CDLL) -> None:
    """Threads started with _thread.start_new_thread are not in threading's table, so they
    keep a state like native threads; CPython deletes it when they end. Freeing the ended
    threads' states must skip those (their memory may already hold another thread's state):
    once they are gone, 1,000 native threads come and go, and the process goes on."""
    listener = Listener(DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore()))
    run, count = uuid.uuid4().hex, 50
    tids: List[int] = []
    done = threading.Semaphore(0)
    serial = itertools.count()

    def body(index: int) -> None:
        tids.append(threading.get_native_id())
        listener(ClassicMessage(f"{run}-raw-{index}"))
        done.release()

    for index in range(count):
        _thread.start_new_thread(body, (index,))
    for _ in range(count):
        assert done.acquire(timeout=10)
    wait_for(lambda: not any(os.path.exists(f"/proc/self/task/{tid}") for tid in tids))

    def short_lived(index: int) -> int:  # index: 0-49 in each wave
        return int(listener(ClassicMessage(f"{run}-short-{next(serial)}")))

    for _ in range(20):
        assert run_callbacks(native_lib, short_lived, 50, 1)[0] == 50
    assert len(listener.runs) == count + 1000


def test_a_forked_child_frees_none_of_the_parents_states(native_lib: ctypes.CDLL) -> None:
    """In a forked child CPython deleted every other thread's state: the child starts with
    none recorded, native threads come and go there (their states freed), and it exits
    cleanly; so does the parent afterwards."""
    listener = Listener(DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore()))
    message = ClassicMessage(uuid.uuid4().hex)

    def callback(index: int) -> int:
        return int(listener(message))

    run_callbacks(native_lib, callback, 40, 1)  # states of ended threads, not all freed yet
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            if kept_states() == 0:
                for _ in range(20):
                    run_callbacks(native_lib, callback, 50, 1)
                code = 0 if kept_states() <= _threads.MAX_KEPT else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for _ in range(20):
        assert run_callbacks(native_lib, callback, 50, 1)[0] == 50
