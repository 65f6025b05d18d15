"""The dead-letter tool without a broker (issue 36.4): the remoting protocol's frames and stored
messages, where a dead letter came from, its dedup key, what a resend carries, and the
command's help and errors. Through the real broker: tests/e2e/test_e2e_dlq.py."""

from __future__ import annotations

import json
import socket
import struct
import zlib
from typing import Dict, List, Optional

import pytest

from rocketmq_dedup import DedupElement
from rocketmq_dedup.cli import main
from rocketmq_dedup.dlq import (
    DeadLetter,
    KeyBy,
    KeyRule,
    element_of,
    origin_topic,
    read_dead_letters,
    resend_properties,
)
from rocketmq_dedup.errors import BrokerError
from rocketmq_dedup.remoting import (
    Command,
    QueueData,
    RemotingClient,
    Route,
    StoredMessage,
    decode_frame,
    decode_messages,
    encode_request,
    format_properties,
    parse_properties,
    quote_int_keys,
)

MAGIC_V1, MAGIC_V2 = -626843481, -626843477


def stored_bytes(
    topic: str,
    body: bytes,
    props: Dict[str, str],
    sys_flag: int = 0,
    magic: int = MAGIC_V1,
    queue_offset: int = 7,
    physical: int = 4096,
) -> bytes:
    """A message in the broker's store layout (MessageEncoder), IPv4 hosts."""
    topic_data, props_data = topic.encode(), format_properties(props).encode()
    topic_len = struct.pack(">h" if magic == MAGIC_V2 else ">b", len(topic_data))
    rest = (
        struct.pack(">iiiqqiq", 0, 2, 0, queue_offset, physical, sys_flag, 1_700_000_000_000)
        + bytes([127, 0, 0, 1]) + struct.pack(">i", 50000)
        + struct.pack(">q", 1_700_000_001_000)
        + bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
        + struct.pack(">iqi", 3, 0, len(body)) + body
        + topic_len + topic_data
        + struct.pack(">h", len(props_data)) + props_data
    )  # fmt: skip
    size = 8 + len(rest)
    return struct.pack(">ii", size, magic) + rest


def letter(props: Dict[str, str], body: bytes = b"b") -> DeadLetter:
    [stored] = decode_messages(stored_bytes("%DLQ%g", body, props))
    return DeadLetter(stored, origin_topic(props))


def test_stored_messages_decode_whole() -> None:
    """Two messages back to back: topic, offsets, times, retries, every property, the body's
    bytes (a NUL included), and the offset id (store host and commit log offset)."""
    props = {"UNIQ_KEY": "U1", "KEYS": "a b", "TAGS": "T", "biz": "v\x00x"}
    data = stored_bytes("%DLQ%g", b"x\x00y", props) + stored_bytes(
        "%DLQ%g", b"", {}, queue_offset=8
    )
    first, second = decode_messages(data)
    assert isinstance(first, StoredMessage)
    assert (first.topic, first.queue_id, first.queue_offset, first.reconsume_times) == (
        "%DLQ%g", 2, 7, 3,
    )  # fmt: skip
    assert first.body == b"x\x00y" and first.properties == props
    assert (first.born_timestamp, first.store_timestamp) == (1_700_000_000_000, 1_700_000_001_000)
    assert first.offset_msg_id == "7F00000100002A9F0000000000001000"
    assert second.queue_offset == 8 and second.body == b""


def test_zlib_bodies_and_long_topic_lengths_decode() -> None:
    """A zlib-compressed body (the Java producer's default above 4 KiB) is inflated; the V2
    layout's two-byte topic length is read."""
    body = b"order " * 2000
    data = stored_bytes("T" * 200, zlib.compress(body), {}, sys_flag=0x1, magic=MAGIC_V2)
    [message] = decode_messages(data)
    assert message.body == body and message.topic == "T" * 200


def test_a_cut_message_is_an_error_not_garbage() -> None:
    """A body shorter than its stored size says so."""
    with pytest.raises(BrokerError, match="cut short"):
        decode_messages(stored_bytes("T", b"abc", {})[:-3])


def test_request_frames_and_both_response_serializations() -> None:
    """A request: total length, header length, JSON header with the fields as text; a JSON
    response and a binary (ROCKETMQ) response decode alike."""
    frame = encode_request(105, 9, {"topic": "T"}, b"")
    total, header_len = struct.unpack_from(">II", frame)
    assert total == len(frame) - 4 and header_len == len(frame) - 8
    header = json.loads(frame[8:])
    assert (header["code"], header["opaque"], header["extFields"]) == (105, 9, {"topic": "T"})

    response = json.dumps({"code": 0, "opaque": 9, "flag": 1, "extFields": {"a": 1}}).encode()
    frame = struct.pack(">I", len(response)) + response + b"body"
    assert decode_frame(frame) == Command(0, "", {"a": "1"}, b"body")

    fields = struct.pack(">h", 1) + b"a" + struct.pack(">i", 1) + b"1"
    binary = (
        struct.pack(">hbhii", 17, 0, 479, 9, 1)
        + struct.pack(">i", 4) + b"gone"
        + struct.pack(">i", len(fields)) + fields
    )  # fmt: skip
    frame = struct.pack(">I", (1 << 24) | len(binary)) + binary
    assert decode_frame(frame) == Command(17, "gone", {"a": "1"}, b"")


def test_the_name_servers_integer_keys_are_quoted_outside_strings() -> None:
    """``{0:"host:port"}`` becomes valid JSON; text inside strings is left alone."""
    text = '{"brokerAddrs":{0:"127.0.0.1:10911", 1 :"a,2:b"},"x":"{3:y"}'
    assert json.loads(quote_int_keys(text)) == {
        "brokerAddrs": {"0": "127.0.0.1:10911", "1": "a,2:b"},
        "x": "{3:y",
    }


def test_properties_round_trip() -> None:
    """name\\x01value\\x02 pairs, both ways."""
    props = {"A": "1", "B": "x y"}
    assert parse_properties(format_properties(props)) == props


@pytest.mark.parametrize(
    ("props", "origin"),
    [
        ({"DLQ_ORIGIN_TOPIC": "ORDERS", "RETRY_TOPIC": "OTHER"}, "ORDERS"),
        ({"RETRY_TOPIC": "ORDERS"}, "ORDERS"),  # a classic consumer's send-back
        ({"RETRY_TOPIC": "%RETRY%order-group+ORDERS"}, "ORDERS"),  # 5.x retries, v2 naming
        ({"RETRY_TOPIC": "%RETRY%order-group"}, None),  # v1 naming: the topic is not kept
        ({}, None),
    ],
)
def test_where_a_dead_letter_came_from(props: Dict[str, str], origin: object) -> None:
    """DLQ_ORIGIN_TOPIC, else RETRY_TOPIC (plain, or after the '+' of a 5.x retry topic)."""
    assert origin_topic(props) == origin


def test_key_rules_and_the_element_they_give() -> None:
    """The message id (UNIQ_KEY), the first key as stored, a user property; the element has
    the origin topic and the tag; no key or no known topic means no element."""
    dead = letter({"UNIQ_KEY": "U1", "KEYS": "order-9 order-2", "TAGS": "TagA", "RETRY_TOPIC": "T",
                   "biz": "B7"})  # fmt: skip
    assert KeyRule().key_of(dead) == "U1"
    assert KeyRule(KeyBy.FIRST_KEY).key_of(dead) == "order-9"
    assert KeyRule(KeyBy.PROPERTY, "biz").key_of(dead) == "B7"
    assert KeyRule(KeyBy.PROPERTY, "absent").key_of(dead) is None
    assert element_of(dead, "app", KeyRule(KeyBy.FIRST_KEY)) == DedupElement(
        "app", "T", "TagA", "order-9"
    )
    assert element_of(letter({"UNIQ_KEY": "U"}), "app", KeyRule()) is None  # topic unknown
    assert letter({"RETRY_TOPIC": "T"}).message_id.startswith("7F000001")  # offset id


def test_a_resend_carries_the_producers_properties_only() -> None:
    """UNIQ_KEY, KEYS, TAGS and the user's; none of the retry, pop, delay and timer ones."""
    dead = letter(
        {
            "UNIQ_KEY": "U1", "KEYS": "k", "TAGS": "T", "biz": "v", "RETRY_TOPIC": "%RETRY%g+T",
            "ORIGIN_MESSAGE_ID": "X", "DELAY": "3", "1ST_POP_TIME": "1", "PGROUP": "T",
            "REAL_TOPIC": "R", "REAL_QID": "0", "TIMER_DELIVER_MS": "5", "WAIT": "false",
        }
    )  # fmt: skip
    assert resend_properties(dead) == {
        "UNIQ_KEY": "U1", "KEYS": "k", "TAGS": "T", "biz": "v", "WAIT": "true",
    }  # fmt: skip
    assert dead.user_properties == {"biz": "v"}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_dlq_help_works_without_a_broker(capsys: pytest.CaptureFixture[str]) -> None:
    """dlq and each command print their help; the key options are explained."""
    for args in (["dlq", "--help"], ["dlq", "list", "--help"], ["dlq", "resend", "--help"]):
        status, out, _ = run_cli(capsys, *args)
        assert status == 0 and "Usage: rocketmq-dedup dlq" in out
    _, out, _ = run_cli(capsys, "dlq", "list", "--help")
    assert "--key-property" in out and "dedup_message_key" in out


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--group", "g", "--namesrv", "127.0.0.1:{port}"], "no name server answered"),
        (["list", "--group", "g", "--redis", "redis://127.0.0.1:{port}/0"], "cannot reach"),
    ],
)
def test_dlq_bad_input_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], args: List[str], message: str
) -> None:
    """An unreachable name server or store: one line on stderr, exit 2."""
    port = str(closed_port())
    status, _, err = run_cli(capsys, "dlq", *(a.replace("{port}", port) for a in args))
    assert status == 2 and message in err
    assert len(err.strip().splitlines()) == 1


class RouteOnly(RemotingClient):
    """A client whose name server answers with ``route`` (None: no such topic)."""

    def __init__(self, route: Optional[Route]) -> None:
        super().__init__("127.0.0.1:1")
        self.answer = route

    def route(self, topic: str) -> Optional[Route]:
        return self.answer


def test_a_write_only_dlq_is_reported_with_its_fix() -> None:
    """Older brokers create %DLQ% topics with perm 2: an error naming the mqadmin command;
    a group with no DLQ topic has no dead letters."""
    write_only = Route({"broker-a": "127.0.0.1:10911"}, [QueueData("broker-a", 1, 1, 2)])
    with pytest.raises(BrokerError, match=r"not readable .*perm=2.*updateTopicPerm -t '%DLQ%g'"):
        read_dead_letters(RouteOnly(write_only), "g")
    assert read_dead_letters(RouteOnly(None), "g") == []
