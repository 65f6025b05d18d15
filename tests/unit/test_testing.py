"""rocketmq_dedup.testing, the public helpers for users' own tests: message shapes both clients
give, a clock the test moves, deliveries in sequence and at once, a crashed consumer's claim;
the pytest plugin's fixtures; and the README's sample of it (samples/test_payment_listener.py),
run as a user runs it. (tests/packaging runs the sample from the installed wheel, where the
plugin comes from its entry point.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupStatus,
    MemoryDedupStore,
    TransactionalDedupListener,
)
from rocketmq_dedup.message import (
    DedupElement,
    message_body,
    message_id,
    message_keys,
    message_properties,
    message_tag,
    message_topic,
    reconsume_times,
)
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.testing import (
    ClassicMessage,
    Delivered,
    GrpcMessage,
    ManualClock,
    deliver,
    plant_crashed_claim,
)

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER
REPO = Path(__file__).resolve().parents[2]


class Recording(DedupConcurrentListener):
    """Keyed on the first key; answers ``result`` (True unless told otherwise)."""

    result: Any = True

    def dedup_message_key(self, msg: Any) -> Any:
        return message_keys(msg)[0]

    def do_handle_msg(self, msg: Any) -> Any:
        return self.result


def make(clock: ManualClock, **options: Any) -> Recording:
    store = MemoryDedupStore(clock=clock)
    return Recording(DedupConfig.enable_dedup_consume_config("app", store, **options))


def test_messages_have_each_clients_shape() -> None:
    """The classic message carries bytes and get_property; the 5.x one a set of keys and a
    dict; rocketmq_dedup.message reads both alike."""
    classic = ClassicMessage("c1", "ORDERS", b"paid", b"{}", "U1", 2, b"order-1 x", {"biz": b"7"})
    assert (classic.tags, classic.keys, classic.body) == (b"paid", b"order-1 x", b"{}")
    assert classic.get_property("UNIQ_KEY") == b"U1" and classic.get_property("none") == b""
    grpc = GrpcMessage("g1", "ORDERS", "paid", b"{}", {"x", "order-1"}, 3, {"biz": "7"})
    assert grpc.keys == {"x", "order-1"} and grpc.properties == {"biz": "7"}
    for msg, uid, keys in ((classic, "U1", ["order-1", "x"]), (grpc, "g1", ["order-1", "x"])):
        assert message_topic(msg) == "ORDERS" and message_tag(msg) == "paid"
        assert message_keys(msg) == keys and message_body(msg) == b"{}"
        assert message_id(msg) == uid and reconsume_times(msg) == 2
        assert message_properties(msg, ["biz"]) == {"biz": "7"}
    assert message_tag(GrpcMessage("g2", tag=None)) == ""


def test_the_manual_clock_lapses_a_lease_and_a_retention_on_demand() -> None:
    """A CONSUMING claim holds until its lease has passed on the clock, a CONSUMED record
    until its retention has; the clock never moves back."""
    clock = ManualClock(100.0)
    store = MemoryDedupStore(clock=clock)
    element = DedupElement("app", "T", "", "k")
    assert store.claim(Claim(element, "a"), 60_000).claimed
    clock.advance(59.999)
    assert not store.claim(Claim(element, "b"), 60_000).claimed
    clock.advance(0.001)
    assert store.claim(Claim(element, "b"), 60_000).claimed  # a's lease lapsed
    store.mark_consumed(Claim(element, "b"), 3_600_000)
    assert clock.advance(3599) == 100 + 60 + 3599
    assert store.get_status(element) is DedupStatus.CONSUMED
    clock.advance(1)
    assert store.get_status(element) is None
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


def test_deliver_in_sequence_reports_answers_and_what_the_handler_saw() -> None:
    """Three copies: one handler run, three acks; a handler asking for a retry runs on every
    copy (its claim is released each time); the listener's own handler is back afterwards."""
    listener = make(ManualClock())
    msg = ClassicMessage("m1", keys=b"k1")
    report = deliver(listener, msg, times=3)
    assert report.answers == (SUCCESS, SUCCESS, SUCCESS) and report.handled == (msg,)
    assert (report.handler_runs, report.acked, report.retried) == (1, 3, 0)
    listener.result = False
    failing = deliver(listener, ClassicMessage("m2", keys=b"k2"), times=2)
    assert failing.answers == (LATER, LATER) and failing.handler_runs == 2
    assert "do_handle_msg" not in vars(listener)
    with pytest.raises(ValueError, match="at least 1"):
        deliver(listener, msg, times=0)


def test_deliver_concurrently_lands_every_copy_while_the_first_is_in_its_handler() -> None:
    """From threads, the copies that did not get the claim are answered RECONSUME_LATER,
    every time (20 runs): the first copy's handler is held until they are answered."""
    listener = make(ManualClock())
    for run in range(20):
        report = deliver(listener, GrpcMessage(f"g{run}", keys={f"k{run}"}), 5, concurrently=True)
        assert sorted(report.answers) == [SUCCESS] + [LATER] * 4, run
        assert report.handler_runs == 1
    assert threading.active_count() < 5  # no thread left behind


def test_deliver_concurrently_without_dedup_runs_every_copy() -> None:
    """Dedup disabled: every copy reaches the handler (only the first is held), none waits for
    the timeout."""
    listener = Recording(DedupConfig.disable_dedup_consume_config("app"))
    started = time.monotonic()
    report = deliver(listener, ClassicMessage("m1", keys=b"k"), 3, concurrently=True, timeout=30)
    assert report.answers == (SUCCESS,) * 3 and report.handler_runs == 3
    assert time.monotonic() - started < 20  # the held copy was let go, not timed out


def test_deliver_restores_a_handler_set_on_the_instance() -> None:
    """A handler the test set on the listener instance is observed, and kept."""
    listener = make(ManualClock())
    seen: List[Any] = []
    listener.do_handle_msg = lambda msg: seen.append(msg) or True
    own = listener.do_handle_msg
    assert deliver(listener, ClassicMessage("m1", keys=b"k"), 2).handler_runs == 1
    assert len(seen) == 1 and listener.do_handle_msg is own


#: Put beside a test file run by pytest in a subprocess: after the session (every fixture torn
#: down), it prints how many lease-renewal threads are still alive.
THREAD_REPORT = """
import threading

def pytest_sessionfinish(session, exitstatus):
    alive = [t for t in threading.enumerate() if t.name == "rocketmq-dedup-lease-keeper"]
    print(f"lease keepers alive: {len(alive)}")
"""


def run_pytest(directory: Path, *files: str) -> subprocess.CompletedProcess[str]:
    """pytest on ``files`` in ``directory``, with the package's plugin (named with ``-p``: the
    development install may predate its entry point; tests/packaging runs without it)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "-p", "rocketmq_dedup.pytest_plugin", *files],
        cwd=directory, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_readme_sample_passes_as_a_user_runs_it(tmp_path: Path) -> None:
    """samples/test_payment_listener.py, copied out of the repository and run by pytest: its
    four tests pass, and its listeners are closed (no lease-renewal thread outlives them)."""
    sample = REPO / "samples" / "test_payment_listener.py"
    shutil.copy(sample, tmp_path / sample.name)
    (tmp_path / "conftest.py").write_text(THREAD_REPORT)
    result = run_pytest(tmp_path, sample.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
    assert "lease keepers alive: 0" in result.stdout, result.stdout


PLUGIN_TESTS = """
import threading

from rocketmq_dedup import DedupConcurrentListener, MemoryDedupStore
from rocketmq_dedup.testing import ClassicMessage, deliver

made = []


class Orders(DedupConcurrentListener):
    def __init__(self, config, answer=True):
        super().__init__(config)
        self.answer = answer

    def do_handle_msg(self, msg):
        return self.answer


def test_the_store_reads_the_clock(dedup_clock, dedup_store, make_dedup_listener):
    assert isinstance(dedup_store, MemoryDedupStore)
    listener = make_dedup_listener(Orders, application_name="orders", lease_renewal=True)
    made.append(listener)
    assert listener.dedup_config.application_name == "orders"
    assert listener.dedup_config.persist is dedup_store
    assert deliver(listener, ClassicMessage("m1"), times=2).handler_runs == 1
    dedup_clock.advance(24 * 3600)
    assert deliver(listener, ClassicMessage("m1")).handler_runs == 1


def test_two_listeners_share_the_store_and_take_arguments(make_dedup_listener):
    first = make_dedup_listener(Orders)
    second = make_dedup_listener(Orders, False, local_retries=1, in_progress_wait_milli_seconds=5)
    assert second.answer is False and second.dedup_config.local_retries == 1
    assert first.dedup_config.application_name == "test-app"
    assert deliver(first, ClassicMessage("m2")).acked == 1
    assert deliver(second, ClassicMessage("m2")).handler_runs == 0  # a duplicate there


def test_the_first_tests_listener_was_closed():
    assert made  # it claimed keys, so its lease keeper ran; closed, none is left
    alive = [t for t in threading.enumerate() if t.name == "rocketmq-dedup-lease-keeper"]
    assert alive == []
"""


def test_the_pytest_plugin_gives_a_clock_a_store_and_listeners_it_closes(tmp_path: Path) -> None:
    """dedup_store reads dedup_clock; make_dedup_listener passes the listener's own arguments
    and the config's settings, shares the store between listeners, and closes every listener
    when its test ends (no lease-renewal thread left for the next test)."""
    (tmp_path / "test_plugin.py").write_text(PLUGIN_TESTS)
    result = run_pytest(tmp_path, "test_plugin.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_deliver_concurrently_fails_on_a_handler_that_never_returns() -> None:
    """A handler stuck past twice the timeout is a TimeoutError, not a hung test; the
    listener's handler is restored all the same."""
    listener = make(ManualClock())
    release = threading.Event()
    listener.do_handle_msg = lambda msg: release.wait(30)
    try:
        with pytest.raises(TimeoutError, match=r"still ran after 0\.4 s"):
            deliver(listener, ClassicMessage("m1", keys=b"k"), 2, concurrently=True, timeout=0.2)
        assert listener.do_handle_msg.__name__ == "<lambda>"
    finally:
        release.set()


def test_deliver_delivers_once_unless_told() -> None:
    """One delivery by default (a redelivery is asked for with ``times``)."""
    listener = make(ManualClock())
    report = deliver(listener, ClassicMessage("m1", keys=b"k"))
    assert report.answers == (SUCCESS,) and report.handler_runs == 1


def test_the_answers_are_typed_as_the_listeners_status() -> None:
    """``Delivered.answers`` is a tuple of ConsumeStatus, what the listener answers."""
    hints = typing.get_type_hints(Delivered)
    assert hints["answers"] == Tuple[ConsumeStatus, ...]
    report = deliver(make(ManualClock()), ClassicMessage("m1", keys=b"k"), times=2)
    assert all(isinstance(answer, ConsumeStatus) for answer in report.answers)


def test_a_crashed_consumers_claim_holds_until_its_lease_lapses_on_the_clock() -> None:
    """plant_crashed_claim: the key CONSUMING under a dead owner; a delivery is retried
    without the handler until the lease lapses on the manual clock, then runs once. A shorter
    lease may be given."""
    clock = ManualClock()
    listener = make(clock, dedup_processing_expire_milli_seconds=30_000)
    msg = ClassicMessage("m1", keys=b"order-1")
    claim = plant_crashed_claim(listener, msg)
    assert claim.element == DedupElement("app", "TEST-TOPIC", "TagA", "order-1")
    assert claim.owner.startswith("crashed.")
    assert deliver(listener, msg, times=2).answers == (LATER, LATER)
    clock.advance(29.999)
    assert deliver(listener, msg).handler_runs == 0
    clock.advance(0.001)
    assert deliver(listener, msg, times=2).handler_runs == 1
    other = ClassicMessage("m2", keys=b"order-2")
    plant_crashed_claim(listener, other, lease_ms=1_000)
    clock.advance(1)
    assert deliver(listener, other).handler_runs == 1


def test_a_crashed_claim_is_refused_where_a_crash_leaves_none() -> None:
    """Nothing planted, with the reason: dedup disabled, a message without a key, a key that
    already has a record; the exactly-once listener (its crashes roll back) is another kind."""
    disabled = Recording(DedupConfig.disable_dedup_consume_config("app"))
    with pytest.raises(ValueError, match="dedup is disabled"):
        plant_crashed_claim(disabled, ClassicMessage("m1", keys=b"k"))
    unkeyed = make(ManualClock())
    unkeyed.dedup_message_key = lambda msg: None  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="no dedup key"):
        plant_crashed_claim(unkeyed, ClassicMessage("m1"))
    listener = make(ManualClock())
    deliver(listener, ClassicMessage("m1", keys=b"done"))
    with pytest.raises(ValueError, match="already has a live record"):
        plant_crashed_claim(listener, ClassicMessage("m1", keys=b"done"))

    class Transactional(TransactionalDedupListener):
        def do_handle_msg(self, msg: Any, conn: Any) -> bool:
            return True

    config = DedupConfig.enable_dedup_consume_config("app", lambda: None, check_store=False)
    with pytest.raises(TypeError, match="leaves no claim"):
        plant_crashed_claim(Transactional(config), ClassicMessage("m1"))  # type: ignore[arg-type]
