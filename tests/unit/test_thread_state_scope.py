"""Only the classic client's native threads reach rocketmq_dedup._threads: a listener called
by Python code (a plain call, a thread, rocketmq_dedup.testing, the 5.x adapter from a thread
pool) never imports it, nor calls into it."""

from __future__ import annotations

import ctypes
import sys
import threading
import uuid
from typing import Any, Dict, List

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig, _threads
from rocketmq_dedup.adapters import classic
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.testing import ClassicMessage, deliver
from tests.native import run_callbacks
from tests.python_callers import install_stand_in_5x
from tests.support import fresh_python, last_json_line


def python_callers(*args: str) -> Dict[str, Any]:
    """``python -m tests.python_callers`` in a fresh process (nothing imported before it)."""
    seen: Dict[str, Any] = last_json_line(fresh_python("-m", "tests.python_callers", *args))
    return seen


class Listener(DedupConcurrentListener):
    def do_handle_msg(self, msg: Any) -> bool:
        return True


def test_python_callers_never_import_the_thread_state_module() -> None:
    """A plain call (main thread, a thread), consume_each/consume_message, testing.deliver (one
    after another and concurrently) and the 5.x adapter called from a thread pool: every
    message consumed, and rocketmq_dedup._threads never imported."""
    seen = python_callers("--stand-in-5x")
    assert seen["answers"] == ["CONSUME_SUCCESS"] * 7 + ["ran 1"] + ["SUCCESS"] * 8
    assert seen["imported"] is False


def test_a_thread_python_did_not_start_does_import_it() -> None:
    """Control: the same calls and one from a _thread.start_new_thread thread (not in
    threading's table of threads, so taken for a native one) import it."""
    seen = python_callers("--stand-in-5x", "--raw-thread")
    assert seen["answers"][-1] == "CONSUME_SUCCESS"
    assert seen["imported"] is True


@pytest.fixture
def keeps(monkeypatch: pytest.MonkeyPatch) -> List[int]:
    """The threads (idents) that call _threads.keep_thread_state (the real one runs)."""
    called: List[int] = []
    real = _threads.keep_thread_state

    def recording() -> None:
        called.append(threading.get_ident())
        real()

    monkeypatch.setattr(_threads, "keep_thread_state", recording)
    return called


def test_python_threads_never_call_into_it_and_native_ones_do(
    keeps: List[int], native_lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process: a plain call, testing.deliver and the 5.x adapter on threads Python
    started never call keep_thread_state; 3 native threads each do, on their first message."""
    monkeypatch.setitem(sys.modules, "rocketmq", None)  # restored after the test
    install_stand_in_5x()
    from rocketmq_dedup.adapters.grpc import message_listener

    listener = Listener(DedupConfig.enable_dedup_consume_config("scope", MemoryDedupStore()))
    run = uuid.uuid4().hex
    assert listener(ClassicMessage(f"{run}-main")) is ConsumeStatus.CONSUME_SUCCESS
    assert (
        deliver(listener, ClassicMessage(f"{run}-d"), times=3, concurrently=True).handler_runs == 1
    )
    five = message_listener(listener)
    pool = [
        threading.Thread(target=five.consume, args=(ClassicMessage(f"{run}-5x-{i}"),))
        for i in range(3)
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(10)
    assert keeps == []
    successes, _ = run_callbacks(
        native_lib, lambda i: int(listener(ClassicMessage(f"{run}-native-{i}"))), 3, 4
    )
    assert successes == 12
    assert len(keeps) == 3 == len(set(keeps))


def test_the_native_thread_check_reads_threading_s_table_without_adding_to_it(
    native_lib: ctypes.CDLL,
) -> None:
    """started_by_python: True on the main thread and on a threading.Thread; False on native
    threads, and no thread object registered for them."""
    assert classic.started_by_python()
    seen: List[bool] = []
    thread = threading.Thread(target=lambda: seen.append(classic.started_by_python()))
    thread.start()
    thread.join(10)
    before = threading.active_count()

    def callback(index: int) -> int:
        seen.append(classic.started_by_python())
        return 0

    assert run_callbacks(native_lib, callback, 2, 3)[0] == 6
    assert seen == [True] + [False] * 6
    assert threading.active_count() == before
