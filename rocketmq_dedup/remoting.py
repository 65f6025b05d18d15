"""A small client of RocketMQ's remoting protocol (the TCP protocol of the name server and the
brokers) for the operator's dead-letter tool: a topic's route, a browse of a queue, one send.

Why not a RocketMQ client: reading a dead-letter queue must not consume it, and the Python
clients cannot browse. The 5.x client receives by ``pop`` only: a read is a delivery to a
consumer group (the message turns invisible, its delivery count grows, and after the group's
retries it moves to that group's own DLQ), and a new group may start at the queue's end. The
classic client's wrapper has no pull consumer, and librocketmq's C API reads a property only by
its name and a body only up to its first NUL byte, so a message could not be resent with the
same properties. A pull with this protocol reads stored messages whole (every property, the
body's bytes) from an offset, and commits nothing.

What it speaks: requests in the JSON header format (responses in JSON or RocketMQ's binary
format), ``GET_ROUTEINFO_BY_TOPIC`` to the name server, ``PULL_MESSAGE`` with its own
subscription (no offset committed, no long poll) and ``SEND_MESSAGE`` to a broker's master.
Not supported: ACL credentials (a broker with ``aclEnable``), TLS, bodies compressed with LZ4 or
zstd (zlib is).
"""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import struct
import time
import zlib
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from rocketmq_dedup.errors import BrokerError

# Request codes (RequestCode) and response codes (ResponseCode) used here.
SEND_MESSAGE = 10
PULL_MESSAGE = 11
GET_ROUTEINFO_BY_TOPIC = 105
SUCCESS = 0
FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT = 10, 11, 12
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED = 19, 20, 21

#: The version this client announces (RocketMQ 5.3.3's ``MQVersion``).
VERSION = 479
_RESPONSE_FLAG = 1
#: PullSysFlag.FLAG_SUBSCRIPTION: the request carries its own subscription (no consumer needs
#: to be registered); no FLAG_COMMIT_OFFSET (nothing is committed), no FLAG_SUSPEND (no long
#: poll).
_PULL_WITH_SUBSCRIPTION = 4

# MessageSysFlag bits and message store layout (MessageDecoder).
_COMPRESSED = 0x1
_COMPRESSION_TYPE = 0x700
_COMPRESSION_ZLIB = 0x300
_BORN_HOST_V6 = 0x10
_STORE_HOST_V6 = 0x20
_MAGIC_V1, _MAGIC_V2 = -626843481, -626843477
_NAME_VALUE, _PROPERTY = "\x01", "\x02"

#: Permission bits of a queue (PermName).
PERM_READ, PERM_WRITE = 4, 2


class Command(NamedTuple):
    """A decoded response."""

    code: int
    remark: str
    fields: Dict[str, str]
    body: bytes


class StoredMessage(NamedTuple):
    """A message as the broker stores it."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    flag: int
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int
    properties: Dict[str, str]
    body: bytes
    offset_msg_id: str
    """The message's id by where it is stored (store host, commit log offset)."""


class QueueData(NamedTuple):
    broker: str
    read_queues: int
    write_queues: int
    perm: int


class Route(NamedTuple):
    """Where a topic lives: each broker's master address, and its queues there."""

    masters: Dict[str, str]
    queues: List[QueueData]


class Pulled(NamedTuple):
    """What a pull found: messages, and where the next pull starts."""

    messages: List[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    found: bool


def encode_request(code: int, opaque: int, fields: Dict[str, str], body: bytes = b"") -> bytes:
    """A request frame: total length, header length (serialization JSON), header, body."""
    header = json.dumps(
        {
            "code": code,
            "language": "PYTHON",
            "version": VERSION,
            "opaque": opaque,
            "flag": 0,
            "extFields": fields,
            "serializeTypeCurrentRPC": "JSON",
        },
        separators=(",", ":"),
    ).encode()
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def decode_frame(frame: bytes) -> Command:
    """A response frame (without its leading length), in either serialization."""
    (mark,) = struct.unpack_from(">I", frame)
    kind, size = mark >> 24, mark & 0xFFFFFF
    header, body = frame[4 : 4 + size], frame[4 + size :]
    if kind == 0:
        data = json.loads(header)
        fields = {str(k): str(v) for k, v in (data.get("extFields") or {}).items()}
        return Command(int(data["code"]), data.get("remark") or "", fields, body)
    code, _language, _version, _opaque, _flag = struct.unpack_from(">hbhii", header)
    at = 13
    (length,) = struct.unpack_from(">i", header, at)
    remark = header[at + 4 : at + 4 + max(0, length)].decode("utf-8", "replace")
    at += 4 + max(0, length)
    (length,) = struct.unpack_from(">i", header, at)
    at, end, fields = at + 4, at + 4 + max(0, length), {}
    while at < end:
        (key_len,) = struct.unpack_from(">h", header, at)
        key = header[at + 2 : at + 2 + key_len].decode()
        at += 2 + key_len
        (value_len,) = struct.unpack_from(">i", header, at)
        fields[key] = header[at + 4 : at + 4 + value_len].decode()
        at += 4 + value_len
    return Command(code, remark, fields, body)


_JSON_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_BARE_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def quote_int_keys(text: str) -> str:
    """The name server's route JSON with its bare integer keys (``{0:"host:port"}``, a
    fastjson habit) quoted, outside strings only, so :func:`json.loads` reads it."""
    parts, last = [], 0
    for string in _JSON_STRING.finditer(text):
        parts.append(_BARE_INT_KEY.sub(r'\1"\2"\3', text[last : string.start()]))
        parts.append(string.group())
        last = string.end()
    parts.append(_BARE_INT_KEY.sub(r'\1"\2"\3', text[last:]))
    return "".join(parts)


def parse_properties(text: str) -> Dict[str, str]:
    """A stored properties string (``name\\x01value\\x02...``) as a dict."""
    props = {}
    for pair in text.split(_PROPERTY):
        name, mark, value = pair.partition(_NAME_VALUE)
        if mark:
            props[name] = value
    return props


def format_properties(props: Dict[str, str]) -> str:
    """A dict of properties as the stored string."""
    return "".join(f"{name}{_NAME_VALUE}{value}{_PROPERTY}" for name, value in props.items())


def _host(data: bytes, at: int, v6: bool) -> Tuple[bytes, int]:
    size = 16 if v6 else 4
    return data[at : at + size + 4], at + size + 4


def decode_messages(data: bytes) -> List[StoredMessage]:
    """The messages of a pull response's body (MessageDecoder's store layout)."""
    messages, at = [], 0
    while at + 8 <= len(data):
        size, magic = struct.unpack_from(">ii", data, at)
        if size <= 0 or at + size > len(data):
            raise BrokerError(f"a pulled message is cut short ({size} bytes at {at})")
        record, at = data[at : at + size], at + size
        _, queue_id, flag, queue_offset, physical, sys_flag, born = struct.unpack_from(
            ">iiiqqiq", record, 8
        )
        pos = 48
        _, pos = _host(record, pos, bool(sys_flag & _BORN_HOST_V6))
        (stored,) = struct.unpack_from(">q", record, pos)
        store_host, pos = _host(record, pos + 8, bool(sys_flag & _STORE_HOST_V6))
        reconsume, _prepared, body_len = struct.unpack_from(">iqi", record, pos)
        pos += 16
        body = record[pos : pos + body_len]
        pos += body_len
        if sys_flag & _COMPRESSED:
            kind = sys_flag & _COMPRESSION_TYPE
            if kind not in (0, _COMPRESSION_ZLIB):
                raise BrokerError(
                    f"a message body is compressed with type {kind >> 8}: not supported"
                )
            body = zlib.decompress(body)
        topic_len_format = ">h" if magic == _MAGIC_V2 else ">b"
        (topic_len,) = struct.unpack_from(topic_len_format, record, pos)
        pos += struct.calcsize(topic_len_format)
        topic = record[pos : pos + topic_len].decode("utf-8", "replace")
        pos += topic_len
        (props_len,) = struct.unpack_from(">h", record, pos)
        props = parse_properties(record[pos + 2 : pos + 2 + props_len].decode("utf-8", "replace"))
        msg_id = (store_host + struct.pack(">q", physical)).hex().upper()
        messages.append(
            StoredMessage(
                topic,
                queue_id,
                queue_offset,
                physical,
                flag,
                born,
                stored,
                reconsume,
                props,
                body,
                msg_id,
            )
        )
    return messages


class RemotingClient:
    """Requests to a name server (``host:port``, several separated by ``;``) and its brokers, one
    connection per address, each request waiting for its response (``timeout`` seconds)."""

    def __init__(self, namesrv: str, timeout: float = 10.0) -> None:
        self.namesrv = [a.strip() for a in namesrv.split(";") if a.strip()]
        if not self.namesrv:
            raise BrokerError("no name server address given")
        self.timeout = timeout
        self._sockets: Dict[str, socket.socket] = {}
        self._opaque = itertools.count(1)

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()

    def __enter__(self) -> RemotingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(
        self, address: str, code: int, fields: Dict[str, Any], body: bytes = b""
    ) -> Command:
        """Send one request to ``address`` and return its response."""
        opaque = next(self._opaque)
        frame = encode_request(code, opaque, {k: str(v) for k, v in fields.items()}, body)
        try:
            sock = self._sockets.get(address)
            if sock is None:
                host, _, port = address.rpartition(":")
                sock = socket.create_connection((host, int(port)), timeout=self.timeout)
                self._sockets[address] = sock
            sock.sendall(frame)
            while True:  # skip anything that is not this request's response
                (length,) = struct.unpack(">I", self._read(sock, 4))
                response = self._read(sock, length)
                command = decode_frame(response)
                if self._opaque_of(response) in (opaque, None):
                    return command
        except (OSError, ValueError, struct.error) as exc:
            broken = self._sockets.pop(address, None)
            if broken is not None:
                broken.close()
            raise BrokerError(f"RocketMQ at {address}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _opaque_of(frame: bytes) -> Optional[int]:
        (mark,) = struct.unpack_from(">I", frame)
        if mark >> 24 == 0:
            data = json.loads(frame[4 : 4 + (mark & 0xFFFFFF)])
            return int(data["opaque"]) if data.get("flag", 0) & _RESPONSE_FLAG else -1
        return None  # the binary format: one request in flight per connection

    @staticmethod
    def _read(sock: socket.socket, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError("the connection was closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    # -- operations ----------------------------------------------------------------------

    def route(self, topic: str) -> Optional[Route]:
        """The topic's route from the name server, or None when it has none (the topic does
        not exist)."""
        errors = []
        for address in self.namesrv:
            try:
                reply = self.request(address, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            except BrokerError as exc:
                errors.append(str(exc))
                continue
            if reply.code == TOPIC_NOT_EXIST:
                return None
            if reply.code != SUCCESS:
                raise BrokerError(f"name server {address}: route of {topic}: {reply.remark}")
            data = json.loads(quote_int_keys(reply.body.decode("utf-8")))
            masters = {
                b["brokerName"]: addrs["0"]
                for b in data.get("brokerDatas", [])
                if "0" in (addrs := {str(k): v for k, v in b.get("brokerAddrs", {}).items()})
            }
            queues = [
                QueueData(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"])
                for q in data.get("queueDatas", [])
            ]
            return Route(masters, queues)
        raise BrokerError(f"no name server answered: {'; '.join(errors)}")

    def pull(
        self, address: str, topic: str, queue_id: int, offset: int, group: str, count: int = 32
    ) -> Pulled:
        """Up to ``count`` messages of a queue from ``offset``, read with ``group``'s name and a
        subscription of every tag; nothing is committed, nothing is registered."""
        reply = self.request(
            address,
            PULL_MESSAGE,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": queue_id,
                "queueOffset": offset,
                "maxMsgNums": count,
                "sysFlag": _PULL_WITH_SUBSCRIPTION,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
                "expressionType": "TAG",
            },
        )
        fields = reply.fields
        next_offset = int(fields.get("nextBeginOffset", offset))
        low, high = int(fields.get("minOffset", 0)), int(fields.get("maxOffset", 0))
        if reply.code == SUCCESS:
            return Pulled(decode_messages(reply.body), next_offset, low, high, True)
        if reply.code in (PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED):
            return Pulled([], next_offset, low, high, False)
        raise BrokerError(f"broker {address}: pull of {topic}: {reply.remark} (code {reply.code})")

    def browse(self, topic: str, group: str, route: Route) -> List[StoredMessage]:
        """Every message of every readable queue of ``topic``, oldest first per queue."""
        found: List[StoredMessage] = []
        for queue in route.queues:
            address = route.masters.get(queue.broker)
            if address is None:
                raise BrokerError(f"{topic}: broker {queue.broker} has no master online")
            for queue_id in range(queue.read_queues):
                offset = 0
                while True:
                    pulled = self.pull(address, topic, queue_id, offset, group)
                    found.extend(pulled.messages)
                    if pulled.found:
                        offset = pulled.next_offset
                    elif offset < pulled.min_offset:  # moved: the older ones are gone
                        offset = pulled.min_offset
                    else:
                        break
        return found

    def send(
        self,
        route: Route,
        topic: str,
        body: bytes,
        properties: Dict[str, str],
        flag: int = 0,
        group: str = "rocketmq-dedup-dlq",
    ) -> Tuple[str, str, int]:
        """Send one message to a writable queue of ``topic``, as stored: the body's bytes and
        every property given (``UNIQ_KEY``, ``KEYS``, ``TAGS`` included). Returns (the broker's
        message id, the broker's name, the queue)."""
        writable: Sequence[QueueData] = [q for q in route.queues if q.perm & PERM_WRITE]
        writable = [q for q in writable if q.write_queues > 0 and q.broker in route.masters]
        if not writable:
            raise BrokerError(f"{topic} has no writable queue")
        queue = random.choice(writable)
        queue_id = random.randrange(queue.write_queues)
        reply = self.request(
            route.masters[queue.broker],
            SEND_MESSAGE,
            {
                "producerGroup": group,
                "topic": topic,
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 4,
                "queueId": queue_id,
                "sysFlag": 0,
                "bornTimestamp": int(time.time() * 1000),
                "flag": flag,
                "properties": format_properties(properties),
                "reconsumeTimes": 0,
                "unitMode": "false",
                "batch": "false",
            },
            body,
        )
        if reply.code not in (
            SUCCESS,
            FLUSH_DISK_TIMEOUT,
            FLUSH_SLAVE_TIMEOUT,
            SLAVE_NOT_AVAILABLE,
        ):
            raise BrokerError(f"send to {topic}: {reply.remark} (code {reply.code})")
        return reply.fields.get("msgId", ""), queue.broker, queue_id
