"""Thin wrappers over the classic RocketMQ Python client (rocketmq-client-python), which the
samples and the demo use: a producer, and a push consumer that feeds a listener. (The e2e tests
drive both Python clients with their own plumbing, tests/e2e/clients.py.)"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, Tuple

NAMESRV = os.environ.get("ROCKETMQ_NAMESRV", "127.0.0.1:9876")


def _check_client(client: str) -> None:
    if client != "classic":
        raise ValueError(f"the samples use the classic client (rocketmq-client-python): {client!r}")


class Producer:
    """send(topic, body, props) -> message id."""

    def __init__(self, client: str = "classic", topics: Tuple[str, ...] = ()) -> None:
        """``topics`` is accepted for symmetry with the 5.x client, which declares them."""
        _check_client(client)
        from rocketmq.client import Producer as ClassicProducer

        from rocketmq_dedup.adapters.classic import set_name_server

        self._producer = ClassicProducer(f"dedup-sample-producer-{id(self)}")
        set_name_server(self._producer, NAMESRV)
        self._producer.start()

    def send(self, topic: str, body: bytes, props: Dict[str, str]) -> str:
        from rocketmq.client import Message

        msg = Message(topic)
        msg.set_body(body)
        for name, value in props.items():
            msg.set_property(name, value)
        return str(self._producer.send_sync(msg).msg_id)

    def close(self) -> None:
        self._producer.shutdown()


def start_push_consumer(
    client: str, group: str, topic: str, listener: Any, threads: int = 4
) -> Callable[[], None]:
    """Start a push consumer of ``group`` on ``topic`` whose callback is ``listener`` (a
    DedupConcurrentListener is the callback); return its shutdown function."""
    _check_client(client)
    from rocketmq.client import PushConsumer

    from rocketmq_dedup.adapters.classic import set_name_server

    consumer = PushConsumer(group)
    set_name_server(consumer, NAMESRV)
    consumer.set_thread_count(threads)
    consumer.subscribe(topic, listener)
    consumer.start()
    return consumer.shutdown  # type: ignore[no-any-return]


def consume_until_interrupted(
    client: str, group: str, topic: str, listener: Any, threads: int = 4
) -> None:
    """Run a push consumer feeding ``listener`` until Ctrl-C, then shut it down."""
    stop = start_push_consumer(client, group, topic, listener, threads)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        stop()
