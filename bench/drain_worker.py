"""A consumer or producer process of the drain and paced cases (:mod:`bench.drain`).

Run as a script with the Python of the client's environment, ``python bench/drain_worker.py
CHECKOUT`` (``.venv-classic`` for the classic client, ``.venv-grpc`` for the 5.x one): it imports
nothing of this checkout's ``bench``, only the standard library, the RocketMQ client its
environment has, and ``CHECKOUT``'s ``rocketmq_dedup`` (put first on ``sys.path``), so the
listener of another checkout can be measured the same way (``--baseline``).

A consumer process runs one consumer at a time, pinned to one CPU (the consumer's CPU is what
a drain measures), and measures itself: the CPU time and context switches of this process from
the first delivery to the N-th distinct completion. Its producer (probes only) runs before.

One JSON request per line on stdin, one JSON answer per line on stdout:

- ``{"op": "setup", "role": "consumer", ...}``: the listener (``store`` none, redis or mysql) and
  the handshake: a consumer of the group is started on a tag of its own, probes are sent until
  one arrives (the group's offsets now exist on the broker), and it is shut down again.
- ``{"op": "start", "tag": T, "n": N}``: a consumer of ``T`` started (its cache big enough for
  ``N`` messages, so the client's flow control never pauses a drain); answers at once.
- ``{"op": "wait", "timeout": S}``: until ``N`` distinct messages were consumed; shuts the
  consumer down; answers the seconds from the first delivery to the N-th completion, this
  process's CPU seconds and switches over them, and for paced runs the lags (completion time
  minus the send time in the body).
- ``{"op": "setup", "role": "producer", ...}``; ``{"op": "produce", "tag": T, "n": N,
  "rate": R}``: N messages (R per second, or as fast as it can), each body its send time.
- ``{"op": "calls"}``, ``{"op": "reset"}``: the handler's call count; set it to 0.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

PROBE_BODY = b"bench-probe"
HANDSHAKE_TIMEOUT_S = 60.0
PROBE_INTERVAL_S = 1.0
SHUTDOWN_TIMEOUT_S = 30.0
RECEIVE_BATCH = 32  # SimpleConsumer: messages per receive (the proxy's maximum)
CACHE_5X = 100_000  # the 5.x push consumer's cache (messages): a whole backlog
INVISIBLE_S = 30  # SimpleConsumer: invisible duration of a received batch
SEND_ATTEMPTS = 8


def first_key(message: Any) -> str:
    """A 5.x message's key (the producer sets one)."""
    return next(iter(message.keys), "")


def usage() -> tuple[float, int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


def shut_down(stop: Callable[[], Any]) -> None:
    """Shut a client down, with a deadline (the classic client's shutdown has hung before)."""
    closer = threading.Thread(target=stop, daemon=True)
    closer.start()
    closer.join(SHUTDOWN_TIMEOUT_S)
    if closer.is_alive():
        raise RuntimeError(f"the client did not shut down in {SHUTDOWN_TIMEOUT_S:.0f}s")


class Tally:
    """Completions of one run (messages whose body starts with ``marker``): the first
    delivery, the N-th distinct completion, lags."""

    def __init__(self, n: int, marker: bytes) -> None:
        self.n = n
        self.marker = marker
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.done = threading.Event()
        self.first: Optional[tuple[float, tuple[float, int, int]]] = None
        self.last: Optional[tuple[float, tuple[float, int, int]]] = None
        self.lags_ms: List[float] = []
        self.deliveries = 0
        self.failures = 0

    def delivered(self) -> None:
        if self.first is None:
            with self.lock:
                if self.first is None:
                    self.first = (time.perf_counter(), usage())

    def completed(self, key: str, body: bytes, ok: bool) -> None:
        """One message consumed (``ok``) or not; ``key``: its producer's key, ``marker-i``."""
        now_ns = time.time_ns()
        with self.lock:
            self.deliveries += 1
            if not ok:
                self.failures += 1
                return
            if key in self.seen:
                return
            self.seen.add(key)
            self.lags_ms.append((now_ns - int(body.rpartition(b" ")[2])) / 1e6)
            if len(self.seen) == self.n:
                self.last = (time.perf_counter(), usage())
                self.done.set()


class Consumer:
    """One consumer process: the listener of ``store`` (or none) behind one of the clients.

    The classic consumer is started for each run, onto a backlog the broker holds (its
    offsets are the group's, kept across a restart). A 5.x consumer stays subscribed for the
    whole case: restarted, its last long-poll would still take messages for the consumer that
    left, and they would come back only after their invisible duration. Between runs its
    messages wait at a closed gate: the push consumer's callbacks before the listener (the
    client goes on receiving into its cache), the SimpleConsumer's loops before receiving.
    """

    def __init__(self, request: Dict[str, Any]) -> None:
        import rocketmq_dedup

        self.lib = rocketmq_dedup
        self.ok = rocketmq_dedup.ConsumeStatus.CONSUME_SUCCESS
        self.client = request["client"]  # classic | grpc | simple
        self.topic = request["topic"]
        self.group = request["group"]
        self.threads = int(request["threads"])
        self.servers = request["servers"]
        self.calls = bytearray()
        self.listener = self.make_listener(request)
        self.tally: Optional[Tally] = None
        self.stop: Optional[Callable[[], Any]] = None
        self.probed = threading.Event()
        self.gate = threading.Event()
        self.parked = threading.Semaphore(0)  # SimpleConsumer loops waiting at the gate
        self.profiler: Optional[subprocess.Popen[bytes]] = None

    def handle(self, msg: Any) -> bool:
        self.calls.append(1)
        return True

    def make_listener(self, request: Dict[str, Any]) -> Any:
        store = request["store"]
        if store == "none":
            return None
        lib = self.lib
        handle = self.handle

        class Listener(lib.DedupConcurrentListener):  # type: ignore[misc,name-defined]
            def do_handle_msg(self, msg: Any) -> bool:
                return handle(msg)

        options = request["options"]
        if store == "redis":
            import redis

            client = redis.Redis.from_url(self.servers["redis_url"])
            config = lib.DedupConfig.enable_dedup_consume_config(
                request["app"], client, key_prefix=request["key_prefix"], **options
            )
        else:
            import functools

            import MySQLdb

            connect = functools.partial(MySQLdb.connect, **self.servers["mysql"])
            config = lib.DedupConfig.enable_dedup_consume_config(
                request["app"], connect, table_name=request["table"], **options
            )
        return Listener(config)

    # -- per message ------------------------------------------------------------------------

    def consume(self, msg: Any, body: bytes, key: str) -> bool:
        """What a push consumer's callback does with one message; True when consumed."""
        if body == PROBE_BODY:
            self.probed.set()
            return True
        self.gate.wait()
        tally = self.tally
        if tally is None or not body.startswith(tally.marker + b" "):
            return True  # not of this run (a probe's twin, a straggler): not measured
        tally.delivered()
        ok = self.handle(msg) if self.listener is None else self.listener(msg) is self.ok
        tally.completed(key, body, ok)
        return ok

    # -- the clients ------------------------------------------------------------------------

    def start_classic(self, tag: str, cache: int) -> None:
        import ctypes

        from rocketmq import ffi
        from rocketmq.client import ConsumeStatus, PushConsumer

        consumer = PushConsumer(self.group)
        consumer.set_namesrv_addr(self.servers["namesrv"])
        consumer.set_thread_count(self.threads)
        set_cache = ffi.dll.SetPushConsumerMaxCacheMessageSize
        set_cache.argtypes = [ctypes.c_void_p, ctypes.c_int]
        set_cache(consumer._handle, cache)  # per queue; the client's default is 1,000
        success, later = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
        consume = self.consume

        def callback(msg: Any) -> Any:
            return success if consume(msg, msg.body, msg.keys.decode()) else later

        consumer.subscribe(self.topic, callback, tag)
        consumer.start()
        self.stop = consumer.shutdown

    def start_grpc_push(self, tag: str, cache: int) -> None:
        import rocketmq

        consume = self.consume
        success, failure = rocketmq.ConsumeResult.SUCCESS, rocketmq.ConsumeResult.FAILURE

        class Listener(rocketmq.MessageListener):  # type: ignore[misc]
            def consume(self, message: Any) -> Any:
                ok = consume(message, message.body, first_key(message))
                return success if ok else failure

        consumer = rocketmq.PushConsumer(
            rocketmq.ClientConfiguration(self.servers["proxy"], rocketmq.Credentials()),
            self.group,
            Listener(),
            {self.topic: rocketmq.FilterExpression(tag)},
            consumption_thread_count=self.threads,
            max_cache_message_count=cache,
        )
        consumer.startup()
        self.stop = consumer.shutdown

    def start_simple(self, tag: str) -> None:
        """``threads`` threads, each a receive loop: with dedup ``consume_simple`` rounds,
        without it the handler and an ack per message."""
        import rocketmq

        from rocketmq_dedup.adapters.grpc import consume_simple

        consumer = rocketmq.SimpleConsumer(
            rocketmq.ClientConfiguration(self.servers["proxy"], rocketmq.Credentials()),
            self.group,
            {self.topic: rocketmq.FilterExpression(tag)},
            await_duration=2,
        )
        consumer.startup()
        running = True
        worker = self

        class Recording:
            """The consumer as consume_simple sees it: acks tallied as completions."""

            def receive(self, count: int, invisible: int) -> Any:
                return consumer.receive(count, invisible)

            def ack(self, message: Any) -> None:
                consumer.ack(message)
                body, tally = message.body, worker.tally
                if body == PROBE_BODY:
                    worker.probed.set()
                elif tally is not None and body.startswith(tally.marker + b" "):
                    tally.completed(first_key(message), body, True)

        recording = Recording()

        def loop() -> None:
            while running:
                if not self.gate.is_set():
                    self.parked.release()
                    self.gate.wait()
                    continue
                try:
                    tally = worker.tally
                    if tally is not None:
                        tally.delivered()
                    if worker.listener is not None:
                        consume_simple(recording, worker.listener, RECEIVE_BATCH, INVISIBLE_S)
                        continue
                    for message in recording.receive(RECEIVE_BATCH, INVISIBLE_S) or ():
                        if message.body != PROBE_BODY:
                            worker.handle(message)
                        recording.ack(message)
                except Exception as exc:  # a receive that timed out, a broker hiccup
                    if running:
                        print(f"drain_worker: receive loop: {exc!r}", file=sys.stderr)
                        time.sleep(0.1)

        threads = [threading.Thread(target=loop) for _ in range(self.threads)]
        for thread in threads:
            thread.start()

        def stop() -> None:
            nonlocal running
            running = False
            self.gate.set()
            for thread in threads:
                thread.join(SHUTDOWN_TIMEOUT_S)
            consumer.shutdown()

        self.stop = stop

    def shutdown(self) -> None:
        stop, self.stop = self.stop, None
        self.gate.set()
        if stop is not None:
            shut_down(stop)

    def close_gate(self) -> None:
        """Hold the next messages: SimpleConsumer loops parked (none has a receive in
        flight, which could take messages of the next backlog and ack them unmeasured)."""
        self.gate.clear()
        if self.client == "simple":
            for _ in range(self.threads):
                if not self.parked.acquire(timeout=SHUTDOWN_TIMEOUT_S):
                    raise RuntimeError("a receive loop did not come back to the gate")

    # -- requests ---------------------------------------------------------------------------

    def handshake(self, tag: str) -> Dict[str, Any]:
        """Subscribe and send probes until one arrives: the group's offsets now exist, and
        a backlog produced from now on is there for the consumer. The classic consumer is
        shut down again (each run starts one), a 5.x one held at the closed gate."""
        producer = Producer({"client": self.client, "servers": self.servers, "topic": self.topic})
        self.probed.clear()
        self.gate.set()
        if self.client == "classic":
            self.start_classic(tag, 1000)
        elif self.client == "grpc":
            self.start_grpc_push(tag, CACHE_5X)
        else:
            self.start_simple(tag)
        try:
            deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
            while not self.probed.is_set():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no probe arrived within {HANDSHAKE_TIMEOUT_S:.0f}s")
                producer.send(tag, PROBE_BODY, "probe")
                self.probed.wait(PROBE_INTERVAL_S)
        finally:
            producer.close()
        if self.client == "classic":
            self.shutdown()
        else:
            self.close_gate()
        return {}

    def run(
        self, tag: str, marker: str, n: int, settle: bool, profile: Optional[List[str]] = None
    ) -> Dict[str, Any]:
        """Count the next ``n`` messages whose body starts with ``marker`` (classic: a
        consumer of ``tag`` started; 5.x: the gate opened, after the client has received the
        backlog when ``settle``). ``profile``: a command (``{pid}`` and ``{tids}`` filled in)
        attached to this process for the run, stopped with SIGINT when it ends."""
        self.tally = Tally(n, marker.encode())
        if profile:
            self.profiler = attach(profile)
        if self.client == "classic":
            self.gate.set()
            self.start_classic(tag, max(n, 1000))
            return {}
        if settle and self.client == "grpc":
            wait_until_idle()
        self.gate.set()
        return {}

    def wait(self, timeout: float) -> Dict[str, Any]:
        tally = self.tally
        assert tally is not None
        finished = tally.done.wait(timeout)
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        if self.client == "classic":
            self.shutdown()
        else:
            self.close_gate()
        self.tally = None
        if not finished or tally.first is None or tally.last is None:
            marker = tally.marker.decode()
            missing = [i for i in range(tally.n) if f"{marker}-{i}" not in tally.seen]
            return {
                "error": f"{len(tally.seen)} of {tally.n} messages consumed in {timeout:.0f}s "
                f"(never consumed: {marker}-i for i in {missing[:10]})"
            }
        (began, before), (ended, after) = tally.first, tally.last
        lags = sorted(tally.lags_ms)
        answer: Dict[str, Any] = {
            "seconds": ended - began,
            "cpu_s": after[0] - before[0],
            "voluntary": after[1] - before[1],
            "involuntary": after[2] - before[2],
            "deliveries": tally.deliveries,
            "failures": tally.failures,
        }
        if lags:
            answer["lag_ms_p50"] = statistics.median(lags)
            answer["lag_ms_p99"] = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
            answer["lag_ms_max"] = lags[-1]
        return answer


def attach(command: List[str]) -> subprocess.Popen[bytes]:
    """Start a profiler attached to this process (``{pid}``: its id, ``{tids}``: its
    threads' ids, comma-separated; a classic consumer's are there once it started)."""
    pid = os.getpid()
    tids = ",".join(os.listdir(f"/proc/{pid}/task"))
    argv = [arg.format(pid=pid, tids=tids) for arg in command]
    profiler = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr)
    time.sleep(1.0)  # attached before the first message
    return profiler


def wait_until_idle(limit_s: float = 30.0) -> None:
    """Until this process used under 2 % of a CPU for 0.3 s (the client has received what
    there was to receive), or ``limit_s``."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    before = usage()[0]
    while quiet < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = usage()[0]
        quiet = quiet + 1 if now - before < 0.002 else 0
        before = now


class Producer:
    """Sends the cases' messages: keys unique per message, body the send time (ns)."""

    def __init__(self, request: Dict[str, Any]) -> None:
        self.client = request["client"]
        self.topic = request["topic"]
        servers = request["servers"]
        if self.client == "classic":
            from rocketmq.client import Producer as ClassicProducer

            self.producer = ClassicProducer(f"dedup-bench-producer-{os.getpid()}-{id(self)}")
            self.producer.set_namesrv_addr(servers["namesrv"])
            self.producer.start()
        else:
            import rocketmq

            self.producer = rocketmq.Producer(
                rocketmq.ClientConfiguration(servers["proxy"], rocketmq.Credentials()),
                (self.topic,),
            )
            self.producer.startup()

    def send(self, tag: str, body: bytes, keys: str) -> None:
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                self._send(tag, body, keys)
                return
            except Exception as exc:  # e.g. "No route info of this topic" for a moment
                if attempt == SEND_ATTEMPTS:
                    raise
                print(f"drain_worker: send of {keys} failed ({exc}); retrying", file=sys.stderr)
                time.sleep(min(0.2 * 2**attempt, 2.0))

    def _send(self, tag: str, body: bytes, keys: str) -> None:
        if self.client == "classic":
            from rocketmq.client import Message, SendStatus

            msg = Message(self.topic)
            msg.set_tags(tag)
            msg.set_keys(keys)
            msg.set_body(body)
            result = self.producer.send_sync(msg)
            if result.status != SendStatus.OK:
                raise RuntimeError(f"send failed: {result.status!r}")
            return
        import rocketmq

        message = rocketmq.Message()
        message.topic = self.topic
        message.tag = tag
        message.keys = keys
        message.body = body
        self.producer.send(message)

    def produce(self, tag: str, marker: str, n: int, rate: Optional[float]) -> Dict[str, Any]:
        """``n`` messages from one thread, ``rate`` per second (None: as fast as it sends);
        each body ``marker`` and the send time in ns, each key ``marker-i``. One thread: the
        classic producer gives two messages sent at once from two threads the same message id
        now and then (5 in 6,000 here), and the id is the default dedup key."""
        start = time.perf_counter()
        head = marker.encode() + b" "
        for i in range(n):
            if rate:
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            self.send(tag, head + b"%d" % time.time_ns(), f"{marker}-{i}")
        return {"seconds": time.perf_counter() - start}

    def close(self) -> None:
        self.producer.shutdown()


def serve(checkout: str) -> None:
    sys.path.insert(0, checkout)
    import rocketmq_dedup

    out = sys.stdout
    out.write(json.dumps({"ready": rocketmq_dedup.__file__}) + "\n")
    out.flush()
    role: Any = None
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "setup":
                os.sched_setaffinity(0, {int(request["cpu"])})
                if request["role"] == "consumer":
                    role = Consumer(request)
                    answer = role.handshake(request["handshake_tag"])
                else:
                    role = Producer(request)
                    answer = {}
            elif op == "start":
                answer = role.run(
                    request["tag"],
                    request["marker"],
                    int(request["n"]),
                    bool(request["settle"]),
                    request.get("profile"),
                )
            elif op == "wait":
                answer = role.wait(float(request["timeout"]))
            elif op == "produce":
                answer = role.produce(
                    request["tag"], request["marker"], int(request["n"]), request.get("rate")
                )
            elif op == "calls":
                answer = {"calls": len(role.calls)}
            elif op == "reset":
                role.calls = bytearray()
                answer = {}
            else:
                answer = {"error": f"unknown op {op!r}"}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    if role is not None:
        close = getattr(role, "shutdown", None) or role.close
        close()


if __name__ == "__main__":
    del sys.path[0]  # this script's folder (bench/): nothing of this checkout's bench is imported
    serve(sys.argv[1])
