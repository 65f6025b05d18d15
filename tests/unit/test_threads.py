"""A native callback thread keeps its Python thread state once it called a listener
(rocketmq_dedup._threads), driven from real pthreads (tests/native) on the memory store."""

from __future__ import annotations

import ctypes
import threading
import uuid
from typing import List, Optional

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig
from rocketmq_dedup._threads import thread_state_kept
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.native import NativeBuildError, build_library, run_callbacks

SUCCESS = int(ConsumeStatus.CONSUME_SUCCESS)


class Listener(DedupConcurrentListener):
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.runs: List[str] = []

    def do_handle_msg(self, msg: object) -> bool:
        self.runs.append(str(msg))
        return True


@pytest.fixture(scope="module")
def native_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    try:
        return build_library(tmp_path_factory.mktemp("native"))
    except NativeBuildError as exc:
        pytest.fail(f"cannot build the native callback library: {exc}")


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
    import rocketmq_dedup._threads as threads_module

    real_ensure = threads_module._ensure
    assert real_ensure is not None  # CPython
    taken: List[int] = []

    def counting_ensure() -> int:
        taken.append(threading.get_ident())
        return real_ensure()

    monkeypatch.setattr(threads_module, "_ensure", counting_ensure)
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
