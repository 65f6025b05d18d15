"""Unit tests of a dedup listener, with no broker and no server:
pip install rocketmq-dedup pytest; python -m pytest test_payment_listener.py"""

from typing import Any, Dict

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, MemoryDedupStore
from rocketmq_dedup.message import message_body, message_keys
from rocketmq_dedup.testing import ClassicMessage, GrpcMessage, ManualClock, deliver


class PaymentListener(DedupConcurrentListener):  # yours: import it from your code
    ledger: Dict[str, int]

    def dedup_message_key(self, msg: Any) -> Any:
        return message_keys(msg)[0]  # the payment id

    def do_handle_msg(self, msg: Any) -> bool:
        payment = message_keys(msg)[0]
        self.ledger[payment] = self.ledger.get(payment, 0) + int(message_body(msg))
        return True


def payments(clock: ManualClock) -> PaymentListener:
    store = MemoryDedupStore(clock=clock)  # leases and retention read the test's clock
    listener = PaymentListener(DedupConfig.enable_dedup_consume_config("payments", store))
    listener.ledger = {}
    return listener


def test_a_redelivered_payment_is_applied_once_on_either_client() -> None:
    listener = payments(ManualClock())
    classic = ClassicMessage("m1", keys=b"pay-1", body=b"10")  # bytes, like the classic client
    grpc = GrpcMessage("m2", keys={"pay-1"}, body=b"10")  # keys as a set, like the 5.x client
    assert deliver(listener, classic, times=3).acked == 3  # every copy acked ...
    assert deliver(listener, grpc, times=1).handler_runs == 0
    assert listener.ledger == {"pay-1": 10}  # ... and the payment applied once


def test_a_copy_arriving_while_its_twin_is_in_the_handler_is_retried_later() -> None:
    listener = payments(ManualClock())
    msg = ClassicMessage("m1", keys=b"pay-2", body=b"5")
    report = deliver(listener, msg, times=4, concurrently=True)  # 4 threads at once
    assert (report.handler_runs, report.acked, report.retried) == (1, 1, 3)
    assert listener.ledger == {"pay-2": 5}


def test_after_the_retention_the_same_payment_runs_again() -> None:
    clock = ManualClock()
    listener = payments(clock)
    msg = ClassicMessage("m1", keys=b"pay-3", body=b"7")
    deliver(listener, msg, times=2)
    clock.advance(24 * 3600)  # the CONSUMED record is kept 1440 minutes by default
    assert deliver(listener, msg, times=1).handler_runs == 1
    assert listener.ledger == {"pay-3": 14}
