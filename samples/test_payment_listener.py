"""Unit tests of a dedup listener, with no broker and no server:
pip install rocketmq-dedup pytest; python -m pytest test_payment_listener.py

The fixtures come with the package's pytest plugin: make_dedup_listener(cls) is your listener
on a memory store, closed after the test; dedup_clock is the clock that store reads."""

from typing import Any, Dict

from rocketmq_dedup import DedupConcurrentListener, DedupConfig
from rocketmq_dedup.message import message_body, message_keys
from rocketmq_dedup.pytest_plugin import ListenerFactory
from rocketmq_dedup.testing import (
    ClassicMessage,
    GrpcMessage,
    ManualClock,
    deliver,
    plant_crashed_claim,
)


class PaymentListener(DedupConcurrentListener):  # yours: import it from your code
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.ledger: Dict[str, int] = {}

    def dedup_message_key(self, msg: Any) -> Any:
        return message_keys(msg)[0]  # the payment id

    def do_handle_msg(self, msg: Any) -> bool:
        payment = message_keys(msg)[0]
        self.ledger[payment] = self.ledger.get(payment, 0) + int(message_body(msg))
        return True


def test_a_redelivered_payment_is_applied_once_on_either_client(
    make_dedup_listener: ListenerFactory,
) -> None:
    listener = make_dedup_listener(PaymentListener)
    classic = ClassicMessage("m1", keys=b"pay-1", body=b"10")  # bytes, like the classic client
    grpc = GrpcMessage("m2", keys={"pay-1"}, body=b"10")  # keys as a set, like the 5.x client
    assert deliver(listener, classic, times=3).acked == 3  # every copy acked ...
    assert deliver(listener, grpc).handler_runs == 0  # (one delivery unless told)
    assert listener.ledger == {"pay-1": 10}  # ... and the payment applied once


def test_a_copy_arriving_while_its_twin_is_in_the_handler_is_retried_later(
    make_dedup_listener: ListenerFactory,
) -> None:
    listener = make_dedup_listener(PaymentListener)
    msg = ClassicMessage("m1", keys=b"pay-2", body=b"5")
    report = deliver(listener, msg, times=4, concurrently=True)  # 4 threads at once
    assert (report.handler_runs, report.acked, report.retried) == (1, 1, 3)
    assert listener.ledger == {"pay-2": 5}


def test_after_the_retention_the_same_payment_runs_again(
    make_dedup_listener: ListenerFactory, dedup_clock: ManualClock
) -> None:
    listener = make_dedup_listener(PaymentListener)
    msg = ClassicMessage("m1", keys=b"pay-3", body=b"7")
    deliver(listener, msg, times=2)
    dedup_clock.advance(24 * 3600)  # the CONSUMED record is kept 1440 minutes by default
    assert deliver(listener, msg).handler_runs == 1
    assert listener.ledger == {"pay-3": 14}


def test_a_payment_whose_consumer_crashed_runs_once_its_lease_lapsed(
    make_dedup_listener: ListenerFactory, dedup_clock: ManualClock
) -> None:
    listener = make_dedup_listener(PaymentListener)
    msg = ClassicMessage("m1", keys=b"pay-4", body=b"3")
    plant_crashed_claim(listener, msg)  # another consumer died in this payment's handler
    assert deliver(listener, msg).retried == 1  # its claim holds until its lease lapses ...
    dedup_clock.advance(60)  # the CONSUMING lease: 60 s by default, renewed by nobody
    assert deliver(listener, msg).handler_runs == 1  # ... then the payment runs here, once
    assert listener.ledger == {"pay-4": 3}
