"""Test helpers of the asyncio path: an event loop running in a thread of its own (what an
application's loop is to a client's callback threads), asyncio stores on it, and the async
listener seen through the classic push bridge, so the shared suites (written for sync stores
and listeners called from threads) run on the asyncio path unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any, Awaitable, Callable, Iterable, List, Optional, Tuple, TypeVar

from rocketmq_dedup import BatchResult, ConsumeStatus, DedupConfig
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.aio.consumers import PushBridge
from rocketmq_dedup.stores.aio import AsyncDedupStore, LoopBoundStore

T = TypeVar("T")


class LoopThread:
    """An event loop run by a daemon thread until :meth:`stop`."""

    def __init__(self, debug: bool = False) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_debug(debug)
        self._thread = threading.Thread(target=self._run, name="test-event-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the loop from this (another) thread; its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the loop and its thread, and the worker threads of its default executor
        (``asyncio.to_thread``: an asyncio listener's blocking behaviours ran there)."""
        self.run(self.loop.shutdown_default_executor(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


#: The loop the shared suites' asyncio runs use (set by the loop_thread fixture).
CURRENT: List[LoopThread] = []


def current_loop() -> LoopThread:
    assert CURRENT, "no test event loop: use the loop_thread fixture"
    return CURRENT[-1]


def bound(store: AsyncDedupStore) -> LoopBoundStore:
    """The sync face of an asyncio store on the test loop (the contract suite calls it)."""
    return LoopBoundStore(store, current_loop().loop)


class AsyncRecordingListener(AsyncDedupConcurrentListener):
    """The shared listener cases' recording listener, asyncio: a behaviour given (a plain
    function, which may block on the test's events) runs in a worker thread, off the loop."""

    def __init__(
        self,
        config: Optional[DedupConfig],
        behaviour: Optional[Callable[[Any], Any]] = None,
        key: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        super().__init__(config)
        self.behaviour = behaviour
        self.key = key
        self.handled: List[Any] = []

    def dedup_message_key(self, msg: Any) -> Any:
        return self.key(msg) if self.key else super().dedup_message_key(msg)

    async def do_handle_msg(self, msg: Any) -> Any:
        self.handled.append(msg)
        if self.behaviour is None:
            return True
        return await asyncio.to_thread(self.behaviour, msg)


class BridgedListener:
    """An asyncio listener as the classic push client sees it (:class:`PushBridge`): called
    from threads, each message answered on the test loop; batches run there too."""

    def __init__(self, listener: AsyncDedupConcurrentListener) -> None:
        self.listener = listener
        self.loop = current_loop()
        self.bridge = PushBridge(listener, self.loop.loop)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.listener, name)

    def __call__(self, msg: Any) -> ConsumeStatus:
        return self.bridge(msg)

    def consume_message(self, msgs: Iterable[Any]) -> BatchResult:
        return self.loop.run(self.listener.consume_message(msgs))

    def consume_each(self, msgs: Iterable[Any]) -> List[ConsumeStatus]:
        return self.loop.run(self.listener.consume_each(msgs))

    def close(self) -> None:
        self.loop.run(self.listener.aclose())

    def __enter__(self) -> BridgedListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def async_store_of(store: Any) -> Optional[AsyncDedupStore]:
    """The asyncio store behind a shared suite's ``store`` (None for a sync store)."""
    return store.aio if isinstance(store, LoopBoundStore) else None


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that holds every chunk it forwards for ``delay`` seconds, to a
    server at ``target``: a store behind it answers slowly, so a call that blocked the event
    loop on it would show as a slow callback (asyncio's debug mode)."""

    def __init__(self, target: Tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                data = source.recv(65536)
                if not data:
                    break
                time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._server.close()
