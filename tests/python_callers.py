"""A listener called every way a Python program calls it, in a fresh process: prints one JSON
line saying whether ``rocketmq_dedup._threads`` (the classic client's native-thread quirk) was
imported, and every answer.

``python -m tests.python_callers [--stand-in-5x] [--raw-thread]``:

* a plain call on the main thread and on a ``threading.Thread``; ``consume_each`` and
  ``consume_message``;
* :func:`rocketmq_dedup.testing.deliver`, one after another and concurrently;
* the 5.x adapter's ``MessageListener`` (:func:`rocketmq_dedup.adapters.grpc.message_listener`),
  called from a thread pool as the 5.x client's push consumer calls it: the installed
  ``rocketmq-python-client``, or with ``--stand-in-5x`` a stand-in for its two names (where the
  5.x client is not installed);
* ``--raw-thread``: also one call from a ``_thread.start_new_thread`` thread (not in
  ``threading``'s table, so treated as native): the control, which does import the module.

Used by tests/unit/test_thread_state_scope.py and, with the real 5.x client,
tests/e2e/test_e2e_grpc_simple.py.
"""

from __future__ import annotations

import _thread
import argparse
import enum
import json
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Sequence

MODULE = "rocketmq_dedup._threads"


def install_stand_in_5x() -> None:
    """A ``rocketmq`` module with the 5.x client's ``MessageListener`` and ``ConsumeResult``."""

    class MessageListener:
        def consume(self, message: Any) -> Any:
            raise NotImplementedError

    class ConsumeResult(enum.Enum):
        SUCCESS = "SUCCESS"
        FAILURE = "FAILURE"

    module = types.ModuleType("rocketmq")
    module.MessageListener = MessageListener  # type: ignore[attr-defined]
    module.ConsumeResult = ConsumeResult  # type: ignore[attr-defined]
    sys.modules["rocketmq"] = module


def calls(raw_thread: bool) -> List[str]:
    """Every way of calling; the answers' names."""
    from rocketmq_dedup import DedupConcurrentListener, DedupConfig, MemoryDedupStore
    from rocketmq_dedup.adapters.grpc import message_listener
    from rocketmq_dedup.testing import ClassicMessage, GrpcMessage, deliver

    class Listener(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            return True

    listener = Listener(DedupConfig.enable_dedup_consume_config("callers", MemoryDedupStore()))
    answers: List[Any] = [listener(ClassicMessage("main"))]
    thread = threading.Thread(target=lambda: answers.append(listener(ClassicMessage("thread"))))
    thread.start()
    thread.join(10)
    answers += listener.consume_each([ClassicMessage("each-1"), GrpcMessage("each-2")])
    answers.append(listener.consume_message([ClassicMessage("batch")]).status)
    answers += deliver(listener, ClassicMessage("deliver"), times=2).answers
    together = deliver(listener, GrpcMessage("together"), times=4, concurrently=True)
    answers.append(f"ran {together.handler_runs}")  # the twins: consumed later, or duplicates
    five = message_listener(listener)
    with ThreadPoolExecutor(4) as pool:
        answers += pool.map(lambda i: five.consume(GrpcMessage(f"5x-{i}")), range(8))
    if raw_thread:
        done = threading.Event()

        def raw() -> None:
            answers.append(listener(ClassicMessage("raw")))
            done.set()

        _thread.start_new_thread(raw, ())
        done.wait(10)
    return [getattr(answer, "name", str(answer)) for answer in answers]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.python_callers", description=__doc__)
    parser.add_argument("--stand-in-5x", action="store_true")
    parser.add_argument("--raw-thread", action="store_true")
    args = parser.parse_args(argv)
    if args.stand_in_5x:
        install_stand_in_5x()
    answers = calls(args.raw_thread)
    print(json.dumps({"imported": MODULE in sys.modules, "answers": answers}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
