"""The message view: one set of helpers for the classic client's messages (bytes or str values,
keys in one space-separated string) and the 5.x client's (keys a set, properties a dict)."""

from __future__ import annotations

from typing import Any

import pytest

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, MemoryDedupStore
from rocketmq_dedup.message import (
    message_body,
    message_id,
    message_keys,
    message_properties,
    message_tag,
    message_topic,
    reconsume_times,
)
from rocketmq_dedup.testing import ClassicMessage, GrpcMessage


def test_classic_keys_are_split_on_spaces_in_order() -> None:
    """A classic message's keys string is split on spaces, in order, empty parts dropped."""
    assert message_keys(ClassicMessage("id", keys=b"order-2 order-1")) == ["order-2", "order-1"]
    assert message_keys(ClassicMessage("id", keys="a  b ")) == ["a", "b"]
    assert message_keys(ClassicMessage("id", keys=b"\xe8\xae\xa2\xe5\x8d\x95-1")) == ["订单-1"]


def test_classic_message_without_keys_has_none() -> None:
    """An empty keys string (librocketmq's answer when there is none) or None is no key."""
    assert message_keys(ClassicMessage("id")) == []
    assert message_keys(ClassicMessage("id", keys=None)) == []
    assert message_keys(object()) == []


def test_grpc_keys_set_is_returned_sorted() -> None:
    """A 5.x message's keys set comes back sorted, so the first key is stable."""
    msg = GrpcMessage("id", keys={"order-9", "order-10", "customer-3"})
    assert message_keys(msg) == ["customer-3", "order-10", "order-9"]
    assert message_keys(GrpcMessage("id")) == []


def test_keys_in_a_list_keep_their_order() -> None:
    """Keys given as a list or tuple keep their order; empty ones are dropped."""
    msg = GrpcMessage("id")
    msg.keys = ["b", "", "a"]  # type: ignore[assignment]
    assert message_keys(msg) == ["b", "a"]


def test_tag_of_both_shapes() -> None:
    """``tags`` (classic, bytes) and ``tag`` (5.x, may be None) read the same."""
    assert message_tag(ClassicMessage("id", tags=b"TagA")) == "TagA"
    assert message_tag(ClassicMessage("id", tags=b"")) == ""
    assert message_tag(GrpcMessage("id", tag="TagB")) == "TagB"
    assert message_tag(GrpcMessage("id", tag=None)) == ""


def test_id_prefers_uniq_key_on_both_shapes() -> None:
    """UNIQ_KEY when present, else the client's own id."""
    assert message_id(ClassicMessage("offset-id", uniq_key="U1")) == "U1"
    assert message_id(ClassicMessage("offset-id")) == "offset-id"
    assert message_id(GrpcMessage("m-1")) == "m-1"
    assert message_id(GrpcMessage("m-1", properties={"UNIQ_KEY": "U2"})) == "U2"


@pytest.mark.parametrize(
    ("body", "expected"),
    [(b"\x00\xff", b"\x00\xff"), ("订单", "订单".encode()), (bytearray(b"ab"), b"ab"), (None, b"")],
)
def test_body_is_bytes(body: Any, expected: bytes) -> None:
    """The body comes back as bytes whatever the client stored."""
    assert message_body(ClassicMessage("id", body=body)) == expected
    assert message_body(GrpcMessage("id", body=body)) == expected


def test_grpc_properties_are_all_returned_as_text() -> None:
    """5.x: every user property; with names, only those; empty values are left out."""
    msg = GrpcMessage("id", properties={"a": "1", "b": "2", "empty": ""})
    assert message_properties(msg) == {"a": "1", "b": "2"}
    assert message_properties(msg, ["b", "missing"]) == {"b": "2"}


def test_classic_properties_are_read_by_name() -> None:
    """Classic: the named properties the message has, decoded; nothing without names."""
    msg = ClassicMessage("id", uniq_key="U1", properties={"biz": "订单".encode(), "e": b""})
    assert message_properties(msg, ["biz", "UNIQ_KEY", "missing", "e"]) == {
        "biz": "订单",
        "UNIQ_KEY": "U1",
    }
    assert message_properties(msg) == {}


def test_reconsume_times_of_both_shapes() -> None:
    """Classic ``reconsume_times`` as is; 5.x ``delivery_attempt`` minus one."""
    assert reconsume_times(ClassicMessage("id", reconsume_times=2)) == 2
    assert reconsume_times(GrpcMessage("id", delivery_attempt=1)) == 0
    assert reconsume_times(GrpcMessage("id", delivery_attempt=3)) == 2


class KeyedListener(DedupConcurrentListener):
    """Keyed on the first business key, as the quick starts are."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.handled: list[str] = []

    def dedup_message_key(self, msg: Any) -> Any:
        keys = message_keys(msg)
        return keys[0] if keys else super().dedup_message_key(msg)

    def do_handle_msg(self, msg: Any) -> bool:
        self.handled.append(f"{message_topic(msg)}/{message_body(msg).decode()}")
        return True


def test_one_listener_dedups_both_shapes_on_the_business_key() -> None:
    """The same listener class keys a classic and a 5.x copy of one order alike."""
    listener = KeyedListener(DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore()))
    listener(ClassicMessage("c-1", keys=b"order-1", body=b"first"))
    listener(GrpcMessage("g-1", keys={"order-1"}, body=b"second"))
    listener(GrpcMessage("g-2", body=b"no key"))
    listener(ClassicMessage("c-2", body=b"no key either"))
    assert listener.handled == ["TEST-TOPIC/first", "TEST-TOPIC/no key", "TEST-TOPIC/no key either"]
