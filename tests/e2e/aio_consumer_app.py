"""An asyncio consumer process for the e2e tests: an AsyncDedupConcurrentListener on
redis.asyncio, fed by a real consumer through the library's drivers (settings ``"driver"``):
``"push"`` (the classic client's native callback threads, or the 5.x PushConsumer's threads,
handing each message to the event loop through PushBridge) or ``"simple"`` (the 5.x
SimpleConsumer's receive_async/ack_async on the loop, consume_simple). Deliveries and effects
go to MariaDB as tests/e2e/consumer_app.py writes them (from worker threads: never on the
loop). Prints STARTED once consuming; stops when its standard input closes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from typing import Any, Dict, Optional, Set

import redis.asyncio

from rocketmq_dedup import ConsumeStatus, DedupConfig
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.aio.consumers import PushBridge, consume_simple
from rocketmq_dedup.message import get_property, message_id
from tests.e2e.clients import PROXY, start_push_consumer
from tests.e2e.consumer_app import BIZ_KEY, Recorder
from tests.support import REDIS_URL


class AsyncE2EListener(AsyncDedupConcurrentListener):
    """Dedups on ``biz_key``; the handler sleeps ``handler_ms`` (yielding the loop) and fails
    the first attempt of the keys in ``fail_first``."""

    def __init__(self, config: DedupConfig, settings: Dict[str, Any], recorder: Recorder) -> None:
        super().__init__(config)
        self.settings = settings
        self.recorder = recorder
        self.handled: Set[str] = set()
        self._failed_once: Set[str] = set()

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return get_property(msg, BIZ_KEY)

    async def do_handle_msg(self, msg: Any) -> bool:
        key = get_property(msg, BIZ_KEY) or ""
        msg_id = message_id(msg) or ""
        self.handled.add(msg_id)
        await asyncio.to_thread(self.recorder.effect, key, "start")
        await asyncio.sleep(self.settings["handler_ms"] / 1000)
        if key in self.settings.get("fail_first", ()) and msg_id not in self._failed_once:
            self._failed_once.add(msg_id)
            return False
        await asyncio.to_thread(self.recorder.effect, key, "done")
        return True

    async def __call__(self, msg: Any) -> ConsumeStatus:
        status = await super().__call__(msg)
        msg_id = message_id(msg) or ""
        handled = msg_id in self.handled
        self.handled.discard(msg_id)
        key = get_property(msg, BIZ_KEY) or ""
        await asyncio.to_thread(self.recorder.delivery, key, msg, status, handled)
        return status


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="event-loop", daemon=True).start()

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    async def make_listener() -> AsyncE2EListener:
        config = DedupConfig.enable_dedup_consume_config(
            settings["app"],
            redis.asyncio.Redis.from_url(REDIS_URL),
            dedup_processing_expire_milli_seconds=settings.get("lease_ms", 60_000),
        )
        listener = AsyncE2EListener(config, settings, Recorder(settings["run_id"]))
        await listener.start()
        return listener

    listener = on_loop(make_listener())
    in_flight = settings.get("max_in_flight", 64)
    stop_consumer: Any = None
    simple: Optional[asyncio.Future[Any]] = None
    stopping = asyncio.Event()
    if settings["driver"] == "push":
        bridge = PushBridge(listener, loop, in_flight)
        stop_consumer = start_push_consumer(
            settings["client"], settings["group"], settings["topic"], bridge, settings["threads"]
        )
    else:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

        consumer = SimpleConsumer(
            ClientConfiguration(PROXY, Credentials()),
            settings["group"],
            {settings["topic"]: FilterExpression()},
            await_duration=2,
        )
        consumer.startup()
        stop_consumer = consumer.shutdown
        simple = asyncio.run_coroutine_threadsafe(
            consume_simple(
                consumer,
                listener,
                stop=stopping,
                max_in_flight=in_flight,
                invisible_duration=settings.get("invisible_s", 10),
            ),
            loop,
        )  # type: ignore[assignment]
    print("STARTED", flush=True)
    sys.stdin.read()
    if simple is not None:
        loop.call_soon_threadsafe(stopping.set)
        simple.result(60)  # type: ignore[union-attr]
    stop_consumer()
    on_loop(listener.aclose())
    os._exit(0)  # the gRPC client leaves non-daemon threads behind


if __name__ == "__main__":
    main()
