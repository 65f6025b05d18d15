"""The outbox without a server: what send() refuses and why, the message key downstream, what
each client's errors mean, and the relay's decision for each failed send. The tables are tested
against MariaDB (tests/integration/outbox), the clients through the broker
(tests/e2e/test_e2e_outbox.py)."""

from __future__ import annotations

import time
from typing import Any, List, Optional

import pytest

from rocketmq_dedup import DedupConfig, DedupConfigError, MemoryDedupStore
from rocketmq_dedup.errors import OutboxMessageError
from rocketmq_dedup.outbox import (
    MESSAGE_KEY_PROPERTY,
    FailureKind,
    Outbox,
    OutboxRelay,
    SendFailure,
    outbox_message_key,
)
from rocketmq_dedup.outbox.message import OutboxMessage, make_message, properties_from_json
from rocketmq_dedup.outbox.senders import Sender, classify_classic, classify_grpc, sender_for
from rocketmq_dedup.status import OutboxStatus
from rocketmq_dedup.stores.outbox import (
    Backlog,
    ClaimedRow,
    Failure,
    ListedRow,
    OutboxTables,
)
from rocketmq_dedup.testing import ClassicMessage, GrpcMessage

# -- send(): what is refused, and how ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"topic": ""}, "topic ''"),
        ({"topic": "a b"}, "topic 'a b'"),
        ({"topic": "%RETRY%g"}, "letters, digits"),
        ({"topic": "t" * 128}, "1 to 127"),
        ({"topic": 7}, "topic 7"),
        ({"body": b""}, "body is empty"),
        ({"body": 12}, "body must be bytes or str"),
        ({"body": b"x" * 11}, "at most 10 are taken"),
        ({"keys": ""}, "a key is blank"),
        ({"keys": "a b"}, "whitespace"),
        ({"keys": ["a", "a"]}, "repeat"),
        ({"keys": ["k"] * 0 + [f"k{i}" for i in range(17)]}, "at most 16"),
        ({"keys": "k" * 129}, "longer than 128"),
        ({"keys": 5}, "iterable of str"),
        ({"keys": ["a\x00"]}, "control characters"),
        ({"tag": "a|b"}, "'|'"),
        ({"tag": " "}, "tag is blank"),
        ({"sharding_key": "s" * 65}, "longer than 64"),
        ({"sharding_key": ""}, "sharding_key is blank"),
        ({"properties": {"UNIQ_KEY": "x"}}, "the broker or a client sets"),
        ({"properties": {MESSAGE_KEY_PROPERTY: "x"}}, "the broker or a client sets"),
        ({"properties": {"__x": "x"}}, "the broker or a client sets"),
        ({"properties": {"p": ""}}, "is blank"),
        ({"properties": {"p": 1}}, "must be a str"),
        ({"properties": [("p", "v")]}, "dict of str"),
        ({"properties": {f"p{i}": "v" * 1000 for i in range(17)}}, "at most 16,384"),
    ],
)
def test_a_message_the_brokers_would_refuse_is_refused_with_its_reason(
    kwargs: dict[str, Any], says: str
) -> None:
    """Each refusal names what is wrong (OutboxMessageError, a ValueError)."""
    message = {"topic": "OUT", "body": b"x", **kwargs}
    with pytest.raises(OutboxMessageError, match=says.replace("|", r"\|")) as caught:
        make_message(max_body_bytes=10, **message)
    assert isinstance(caught.value, ValueError)


def test_a_valid_message_keeps_what_was_given_and_generates_a_key_when_none() -> None:
    """Keys (the first is the message key), tag, properties in order, sharding key with spaces
    and any script; a str body is UTF-8; no keys: a 32-hex key, a new one each time."""
    message = make_message("OUT", "订单", ["k1", "k2"], "TagA", {"b": "1", "a": "二"}, "order 1")
    assert message == OutboxMessage(
        "OUT", "订单".encode(), "k1", ("k2",), "TagA", (("b", "1"), ("a", "二")), "order 1"
    )
    assert message.keys == ("k1", "k2")
    assert properties_from_json(message.properties_json()) == message.properties
    first, second = make_message("OUT", b"x"), make_message("OUT", b"x")
    assert len(first.message_key) == 32 and int(first.message_key, 16) >= 0
    assert first.message_key != second.message_key
    assert make_message("OUT", b"x", keys="only").keys == ("only",)


def test_the_message_key_downstream_is_the_property_else_the_first_key() -> None:
    """Either client's message: the relay's property wins (a 5.x message's keys are a set),
    else the first key; a message no relay sent has none."""
    classic = ClassicMessage("m", keys=b"k1 k2", properties={MESSAGE_KEY_PROPERTY: b"k2"})
    assert outbox_message_key(classic) == "k2"
    grpc = GrpcMessage("m", keys={"b-key", "a-key"}, properties={MESSAGE_KEY_PROPERTY: "b-key"})
    assert outbox_message_key(grpc) == "b-key"
    assert outbox_message_key(ClassicMessage("m", keys=b"only")) == "only"
    assert outbox_message_key(GrpcMessage("m")) is None


# -- what the clients' errors mean ---------------------------------------------------------------


def client_error(module: str, name: str, text: str = "") -> Exception:
    """An exception of the class the client raises (same module and name)."""
    cls = type(name, (Exception,), {"__module__": module})
    return cls(text)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (
            "the message body size over max value, MAX: 131072,error:-1,in file "
            "rocketmq-client-cpp/src/common/Validators.cpp line:99",
            FailureKind.REFUSED,
        ),
        ("No route info of this topic: GONE,error:-1", FailureKind.UNROUTABLE),
        ("send message to broker failed: connect to 127.0.0.1:10911 failed", FailureKind.OUTAGE),
    ],
)
def test_the_classic_clients_errors(text: str, kind: FailureKind) -> None:
    """As measured against the broker (the texts are the client's)."""
    assert (
        classify_classic(client_error("rocketmq.exceptions", "ProducerSendSyncFailed", text))
        is kind
    )


def test_an_error_that_is_not_the_classic_clients_is_unknown() -> None:
    assert classify_classic(TypeError("bug")) is FailureKind.UNKNOWN


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        (
            "IllegalArgumentException",
            "Message body size exceeds the threshold",
            FailureKind.REFUSED,
        ),
        ("IllegalArgumentException", "current message type not match", FailureKind.REFUSED),
        ("BadRequestException", "40007, property is used by system: UNIQ_KEY", FailureKind.REFUSED),
        ("PayloadTooLargeException", "", FailureKind.REFUSED),
        ("NotFoundException", "topic not found", FailureKind.UNROUTABLE),
        ("TooManyRequestsException", "", FailureKind.OUTAGE),
        ("InternalErrorException", "", FailureKind.OUTAGE),
        ("IllegalStateException", "producer is not running now.", FailureKind.OUTAGE),
    ],
)
def test_the_5x_clients_errors(name: str, text: str, kind: FailureKind) -> None:
    module = "rocketmq.v5.exception.client_exception"
    assert classify_grpc(client_error(module, name, text)) is kind


def test_the_5x_clients_other_errors() -> None:
    """The route it could not fetch (a plain Exception), gRPC errors, timeouts, a bug."""
    assert classify_grpc(Exception("failed to fetch topic:GONE route.")) is FailureKind.UNROUTABLE
    assert classify_grpc(client_error("grpc.aio._call", "AioRpcError")) is FailureKind.OUTAGE
    assert classify_grpc(TimeoutError()) is FailureKind.OUTAGE
    assert classify_grpc(KeyError("x")) is FailureKind.UNKNOWN


def test_a_relay_takes_only_a_producer_of_either_client() -> None:
    with pytest.raises(DedupConfigError, match=r"rocketmq\.client\.Producer"):
        sender_for(object())


# -- the relay's decision for a failed send ------------------------------------------------------


class NoTables(OutboxTables):
    """A port that is never reached (the decisions need none)."""

    name = "t_outbox"

    def describe(self) -> str:
        return "nowhere"

    def schema_statements(self) -> List[str]:
        return []

    def write(self, conn: Any, message: OutboxMessage) -> int:
        raise AssertionError

    def in_transaction(self, conn: Any) -> Optional[bool]:
        return True

    def claim(self, owner: str, limit: int, run: int, lease_ms: int) -> List[ClaimedRow]:
        return []

    def settle(
        self, owner: str, sent: Any, failed: Any, released: Any, release_in_ms: int = 0
    ) -> None:
        raise AssertionError

    def backlog(self) -> Backlog:
        return Backlog(0, None, 0)

    def rows(
        self, status: Optional[OutboxStatus], limit: int, after_id: int = 0
    ) -> List[ListedRow]:
        return []

    def retry(self, ids: Any) -> int:
        return 0

    def drop(self, ids: Any) -> int:
        return 0

    def purge(self, older_than_ms: int, batch_size: int = 1000, progress: Any = None) -> int:
        return 0

    def close(self) -> None:
        pass


class NoStore:
    outbox = NoTables()


class NullSender(Sender):
    def send(self, message: OutboxMessage) -> str:
        return "id"


def relay(**options: Any) -> OutboxRelay:
    return OutboxRelay(Outbox(NoStore()), NullSender(), **options)


def row(attempts: int = 0, failing_for_ms: Optional[int] = None) -> ClaimedRow:
    return ClaimedRow(7, make_message("OUT", b"x", keys="k"), attempts, failing_for_ms)


def test_a_refused_message_is_parked_at_once() -> None:
    decision = relay().decide(row(), SendFailure(FailureKind.REFUSED, "too large"))
    assert decision == Failure(7, "refused: too large", park=True)


def test_an_outage_is_never_parked_and_waits_the_relays_pause() -> None:
    """Even after days of failing; the wait is the relay's next pause (0.5 s, then doubling)."""
    decision = relay().decide(row(50, 10**9), SendFailure(FailureKind.OUTAGE, "down"))
    assert not decision.park and decision.retry_in_ms == 500


def test_no_route_is_retried_with_a_growing_backoff_until_the_cluster_proves_up() -> None:
    """Without a send that succeeded since its first failure: retried (0.2 s doubling, +-20 %),
    however many attempts; with one: parked at the third attempt, not before."""
    subject = relay()
    failure = SendFailure(FailureKind.UNROUTABLE, "No route info")
    first = subject.decide(row(0, None), failure)
    later = subject.decide(row(4, 60_000), failure)
    assert not first.park and 160 <= first.retry_in_ms <= 240
    assert not later.park and 2_560 <= later.retry_in_ms <= 3_840
    subject._last_success = time.monotonic() - 1.0  # a send succeeded a second ago
    assert not subject.decide(row(1, 5_000), failure).park  # second attempt
    third = subject.decide(row(2, 5_000), failure)
    assert third.park and "other sends succeeded" in third.error
    assert not subject.decide(row(2, 500), failure).park  # first failed after that success


@pytest.mark.parametrize("kind", [FailureKind.UNROUTABLE, FailureKind.UNKNOWN])
def test_a_row_failing_for_give_up_after_is_parked(kind: FailureKind) -> None:
    subject = relay(give_up_after_s=60.0)
    assert not subject.decide(row(3, 59_000), SendFailure(kind, "x")).park
    parked = subject.decide(row(3, 60_000), SendFailure(kind, "x"))
    assert parked.park and "failing for 60 s" in parked.error


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("batch_size", 0),
        ("run", 1.5),
        ("concurrency", True),
        ("lease_s", 0),
        ("poll_interval_s", -1),
        ("give_up_after_s", "1h"),
    ],
)
def test_bad_relay_options_are_refused(option: str, value: Any) -> None:
    with pytest.raises(DedupConfigError, match=option):
        relay(**{option: value})


def test_a_relay_needs_an_outbox_and_an_outbox_a_store_with_one() -> None:
    with pytest.raises(DedupConfigError, match="needs an Outbox"):
        OutboxRelay(object(), NullSender())  # type: ignore[arg-type]
    with pytest.raises(DedupConfigError, match="MySQL"):
        Outbox(object())
    with pytest.raises(DedupConfigError, match="max_body_bytes"):
        Outbox(NoStore(), max_body_bytes=0)


def test_an_outbox_on_a_postgresql_store_is_its_outbox_tables_without_a_connection() -> None:
    """Outbox(config) on a PostgreSQL store (no server needed: nothing connects until used) is
    the store's PostgreSQL outbox, named after the dedup table; the same from the store."""
    from rocketmq_dedup.stores.postgres.outbox import PostgresOutboxTables
    from tests.support import pg_connect

    config = DedupConfig.enable_dedup_consume_config(
        "app", pg_connect(), table_name="t_orders", check_store=False
    )
    outbox = Outbox(config)
    assert isinstance(outbox.tables, PostgresOutboxTables)
    assert outbox.name == "t_orders_outbox" and outbox.tables.lane_table == "t_orders_outbox_lane"
    assert Outbox(config.persist).tables is outbox.tables


def test_a_postgresql_table_name_leaving_no_room_for_the_outbox_is_refused_naming_the_limit() -> (
    None
):
    """A dedup table of 47 bytes: <table>_outbox_by_status would pass PostgreSQL's 63; the
    outbox is refused with the limit (46), and its schema statements are left out."""
    from rocketmq_dedup.stores.postgres import schema_statements
    from tests.support import pg_connect

    config = DedupConfig.enable_dedup_consume_config(
        "app", pg_connect(), table_name="t" * 47, check_store=False
    )
    with pytest.raises(DedupConfigError, match="at most 46"):
        Outbox(config)
    assert not any("_outbox" in statement for statement in schema_statements("t" * 47))
    assert any("_outbox_by_status" in statement for statement in schema_statements("t" * 46))


def test_an_outbox_on_a_store_that_is_no_database_is_refused_naming_the_store() -> None:
    """A Redis or memory store cannot hold rows in the handler's transaction: refused, the
    message naming the store and the databases supported."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    with pytest.raises(DedupConfigError, match=r"or PostgreSQL.*got MemoryDedupStore"):
        Outbox(config)
