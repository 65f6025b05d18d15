"""The e2e tests' RocketMQ plumbing: a producer and a push consumer for whichever of the two
Python clients this environment has (exactly one is installed per environment), so every e2e
test drives both clients the same way. The samples have their own, classic-only wrappers
(samples/rocketmq_clients.py); the tests do not import samples/."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Dict, Optional

from tests.support import ROCKETMQ_NAMESRV as NAMESRV
from tests.support import ROCKETMQ_PROXY as PROXY


def installed_client() -> str:
    """'classic' (rocketmq-client-python), 'grpc' (rocketmq-python-client 5.x) or 'none'."""
    if importlib.util.find_spec("rocketmq") is None:
        return "none"
    if importlib.util.find_spec("rocketmq.client") is not None:
        return "classic"
    return "grpc"


class Producer:
    """send(topic, body, props) -> message id, for either client."""

    def __init__(self, client: str, topics: tuple[str, ...]) -> None:
        self.client = client
        if client == "classic":
            from rocketmq.client import Producer as ClassicProducer

            from rocketmq_dedup.adapters.classic import set_name_server

            self._producer = ClassicProducer(f"dedup-test-producer-{id(self)}")
            set_name_server(self._producer, NAMESRV)
            self._producer.start()
        else:
            from rocketmq import ClientConfiguration, Credentials
            from rocketmq import Producer as GrpcProducer

            self._producer = GrpcProducer(ClientConfiguration(PROXY, Credentials()), topics)
            self._producer.startup()

    def send(
        self,
        topic: str,
        body: bytes,
        props: Dict[str, str],
        tag: str = "TagA",
        sharding_key: Optional[str] = None,
    ) -> str:
        """Send one message; with ``sharding_key`` (classic client) as an orderly message."""
        if self.client == "classic":
            from rocketmq.client import Message

            msg = Message(topic)
            msg.set_tags(tag)
            msg.set_body(body)
            for name, value in props.items():
                msg.set_property(name, value)
            if sharding_key is not None:
                result = self._producer.send_orderly_with_sharding_key(msg, sharding_key)
            else:
                result = self._producer.send_sync(msg)
            return str(result.msg_id)
        from rocketmq import Message as GrpcMessage

        gmsg = GrpcMessage()
        gmsg.topic = topic
        gmsg.tag = tag
        gmsg.body = body
        for name, value in props.items():
            gmsg.add_property(name, value)
        return str(self._producer.send(gmsg).message_id)

    def send_keyed(self, topic: str, body: bytes, key: str, tag: str = "TagA") -> str:
        """Send one message whose (only) key is ``key``, as an order's producer would: the
        classic client's ``set_keys``, the 5.x client's ``keys``."""
        if self.client == "classic":
            from rocketmq.client import Message

            msg = Message(topic)
            msg.set_tags(tag)
            msg.set_keys(key)
            msg.set_body(body)
            return str(self._producer.send_sync(msg).msg_id)
        from rocketmq import Message as GrpcMessage

        gmsg = GrpcMessage()
        gmsg.topic = topic
        gmsg.tag = tag
        gmsg.keys = key
        gmsg.body = body
        return str(self._producer.send(gmsg).message_id)

    def close(self) -> None:
        self._producer.shutdown()


def start_push_consumer(
    client: str, group: str, topic: str, listener: Any, threads: int = 4, orderly: bool = False
) -> Callable[[], None]:
    """Start a push consumer feeding ``listener`` (``orderly``: the classic client's orderly
    consumer); return its shutdown function."""
    if client == "classic":
        from rocketmq.client import PushConsumer

        from rocketmq_dedup.adapters.classic import set_name_server

        consumer = PushConsumer(group, orderly=orderly)
        set_name_server(consumer, NAMESRV)
        consumer.set_thread_count(threads)
        consumer.set_message_batch_max_size(1)
        consumer.subscribe(topic, listener)
        consumer.start()
        return consumer.shutdown  # type: ignore[no-any-return]
    from rocketmq import ClientConfiguration, Credentials, FilterExpression
    from rocketmq import PushConsumer as GrpcPushConsumer

    from rocketmq_dedup.adapters.grpc import message_listener

    consumer = GrpcPushConsumer(
        ClientConfiguration(PROXY, Credentials()),
        group,
        message_listener(listener),
        {topic: FilterExpression()},
        consumption_thread_count=threads,
    )
    consumer.startup()
    return consumer.shutdown  # type: ignore[no-any-return]
