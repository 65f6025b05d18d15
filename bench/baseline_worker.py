"""The listener of another checkout, run in a child process beside this run's cases
(``python -m bench --baseline PATH``; see :mod:`bench.baseline`).

Run as a script, ``python bench/baseline_worker.py CHECKOUT``: it imports nothing of this
checkout (only the standard library, ``CHECKOUT``'s ``rocketmq_dedup``, which is put first
on ``sys.path``, and for the exactly-once cases :mod:`bench.business`, standard library only,
loaded by its path), so any commit whose package has ``DedupConcurrentListener``,
``DedupConfig.enable_dedup_consume_config`` and ``MemoryDedupStore`` can be measured.

One JSON request per line on stdin, one JSON answer per line on stdout:

- ``{"op": "prepare", "prefix": P, "n": N, "duplicates": D, "options": {...}}``: a new listener on
  a new memory store, ``N`` messages; for duplicates, one untimed pass that consumes them.
- ``{"op": "measure", "start": i, "stop": j}``: consume messages ``i:j``, answer the elapsed
  seconds, this process's CPU seconds and context switches, and the failures.
- ``{"op": "start_tx", "database": "mysql"|"postgres", "connect": {...}|DSN, "app": A,
  "table": T, "business": {...}, "options": {...}}``:
  a ``TransactionalDedupListener`` on a mysqlclient (psycopg) connection factory, whose handler
  runs the parent's business transaction (:class:`bench.business.BusinessTransaction` of
  the parent's arguments) on its ``conn``, as the exactly-once cases' listener does.
- ``{"op": "prepare_tx", "prefix": P, "n": N}``: ``N`` fresh messages for that listener.
- ``{"op": "calls"}``, ``{"op": "reset"}``: the handler's call count; set it to 0.
"""

from __future__ import annotations

import functools
import gc
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

UNIQ_KEY = "UNIQ_KEY"


class Message:
    """Shaped as ``rocketmq_dedup.testing.ClassicMessage`` (the messages of this run's cases),
    written out here because an old checkout has no ``testing`` module."""

    __slots__ = ("_props", "body", "id", "keys", "reconsume_times", "tags", "topic")

    def __init__(self, msg_id: str, topic: str, tags: bytes, body: bytes) -> None:
        self.id = msg_id
        self.topic = topic
        self.tags = tags
        self.keys = b""
        self.body = body
        self.reconsume_times = 0
        self._props: Dict[str, bytes] = {UNIQ_KEY: msg_id.encode()}

    def get_property(self, name: str) -> bytes:
        return self._props.get(name, b"")


def load_business() -> Any:
    """This checkout's :mod:`bench.business` (standard library only), loaded by its path: the
    package ``bench`` on ``sys.path`` is the other checkout's, if it has one."""
    import importlib.util

    path = Path(__file__).with_name("business.py")
    spec = importlib.util.spec_from_file_location("bench_business", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Worker:
    def __init__(self) -> None:
        import rocketmq_dedup

        self.lib = rocketmq_dedup
        self.calls = bytearray()
        self.items: List[Message] = []
        self.listener: Optional[Any] = None
        self.ok = rocketmq_dedup.ConsumeStatus.CONSUME_SUCCESS

    def handle(self, msg: Any) -> bool:
        self.calls.append(1)
        return True

    def prepare(self, prefix: str, n: int, duplicates: bool, options: Dict[str, Any]) -> Any:
        lib = self.lib
        handle = self.handle

        class Listener(lib.DedupConcurrentListener):  # type: ignore[name-defined,misc]
            def do_handle_msg(self, msg: Any) -> bool:
                return handle(msg)

        gc.unfreeze()
        config = lib.DedupConfig.enable_dedup_consume_config(
            options.pop("application", prefix), lib.MemoryDedupStore(), **options
        )
        self.listener = Listener(config)
        topic, tag, body = "DEDUP-BENCH", b"TagBench", b'{"order": 1}'
        self.items = [Message(f"{prefix}-{i}", topic, tag, body) for i in range(n)]
        failures = self.run(0, n) if duplicates else 0
        gc.collect()
        gc.freeze()  # as the runner does in the parent
        return {"failures": failures}

    def start_tx(
        self,
        database: str,
        connect: Any,
        app: str,
        table: str,
        business: Dict[str, Any],
        options: Dict[str, Any],
    ) -> Any:
        lib = self.lib
        if database == "mysql":
            import MySQLdb

            factory = functools.partial(MySQLdb.connect, **connect)
        else:
            import psycopg

            factory = functools.partial(psycopg.connect, connect)
        handle = self.handle
        transaction = load_business().BusinessTransaction(app, **business)

        class Listener(lib.TransactionalDedupListener):  # type: ignore[name-defined,misc]
            def do_handle_msg(self, msg: Any, conn: Any) -> bool:
                handle(msg)
                transaction(conn, msg)
                return True

        config = lib.DedupConfig.enable_dedup_consume_config(
            app, factory, table_name=table, **options
        )
        self.listener = Listener(config)
        return {}

    def prepare_tx(self, prefix: str, n: int) -> Any:
        gc.unfreeze()
        topic, tag, body = "DEDUP-BENCH", b"TagBench", b'{"order": 1}'
        self.items = [Message(f"{prefix}-{i}", topic, tag, body) for i in range(n)]
        gc.collect()
        gc.freeze()
        return {"failures": 0}

    def run(self, start: int, stop: int) -> int:
        consume, ok, failures = self.listener, self.ok, 0
        for msg in self.items[start:stop]:
            if consume(msg) is not ok:  # type: ignore[misc]
                failures += 1
        return failures

    def measure(self, start: int, stop: int) -> Any:
        before = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        failures = self.run(start, stop)
        seconds = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "seconds": seconds,
            "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "voluntary": after.ru_nvcsw - before.ru_nvcsw,
            "involuntary": after.ru_nivcsw - before.ru_nivcsw,
            "failures": failures,
        }


def main(checkout: str) -> None:
    sys.path.insert(0, checkout)
    worker = Worker()
    out = sys.stdout
    out.write(json.dumps({"ready": worker.lib.__file__}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op == "prepare":
            answer = worker.prepare(**request)
        elif op == "start_tx":
            answer = worker.start_tx(**request)
        elif op == "prepare_tx":
            answer = worker.prepare_tx(**request)
        elif op == "measure":
            answer = worker.measure(**request)
        elif op == "calls":
            answer = {"calls": len(worker.calls)}
        elif op == "reset":
            worker.calls = bytearray()
            answer = {}
        else:
            answer = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    del sys.path[0]  # this script's folder (bench/): nothing of this checkout is imported
    main(sys.argv[1])
