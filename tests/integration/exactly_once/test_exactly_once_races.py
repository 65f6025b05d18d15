"""Exactly-once under races, lapsed leases, a killed and a frozen consumer (issue 11,
requirements 3 and 4, and the 16-thread race), on every driver of MySQL and PostgreSQL."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from rocketmq_dedup import ConsumeStatus, DedupStatus
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    EffectListener,
    EffectTable,
    make_config,
    redeliver_until_acked,
)

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER
ROOT = Path(__file__).resolve().parents[2]


def test_sixteen_threads_racing_on_the_same_keys_apply_each_once(
    client: Any, table: str, effects: EffectTable
) -> None:
    """16 threads, 24 keys delivered 4 times each in random order; RECONSUME_LATER answers
    are redelivered: every copy ends acked, each key's effect exactly once."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]

    def behaviour(msg: Any, conn: Any) -> bool:
        time.sleep(random.uniform(0, 0.005))  # work, so copies overlap
        return True

    listener = EffectListener(config, effects, behaviour)
    keys = [f"k{i}" for i in range(24)]
    msgs = random.sample([ClassicMessage(k) for k in keys for _ in range(4)], 96)
    try:
        answers = redeliver_until_acked(listener, msgs, threads=16)
        assert effects.counts() == dict.fromkeys(keys, 1)
        assert listener.calls == dict.fromkeys(keys, 1)
        assert all(a.count(SUCCESS) == 4 for a in answers.values())
    finally:
        listener.close()


@pytest.mark.parametrize("first_to_finish", ["takeover", "stalled"])
def test_a_stalled_attempt_and_its_takeover_commit_once(
    client: Any, table: str, effects: EffectTable, first_to_finish: str
) -> None:
    """Lease 300 ms, no renewal: the first copy stalls past its lease and a second copy takes
    the message over. Whichever finishes first, exactly one transaction commits and the effect
    is applied once; the other is rolled back (acked as a duplicate, or RECONSUME_LATER when
    the server had already ended the stalled copy's idle session: its lease there)."""
    config = make_config(
        client, table, dedup_processing_expire_milli_seconds=300, lease_renewal=False
    )
    config.persist.create_table()  # type: ignore[union-attr]
    started = {b"first": threading.Event(), b"second": threading.Event()}
    finish = {b"first": threading.Event(), b"second": threading.Event()}
    if first_to_finish == "takeover":
        finish[b"second"].set()  # the takeover does not stall

    def behaviour(msg: Any, conn: Any) -> bool:
        started[msg.body].set()
        assert finish[msg.body].wait(10)
        return True

    listener = EffectListener(config, effects, behaviour)
    answers: Dict[bytes, ConsumeStatus] = {}

    def deliver_first() -> None:
        answers[b"first"] = listener(ClassicMessage("m1", body=b"first"))

    def deliver_second() -> None:  # redelivered until it gets past the claim
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = listener(ClassicMessage("m1", body=b"second"))
            if started[b"second"].is_set():
                answers[b"second"] = status
                return

    first = threading.Thread(target=deliver_first)
    first.start()
    assert started[b"first"].wait(10)
    second = threading.Thread(target=deliver_second)
    second.start()
    try:
        assert started[b"second"].wait(10), "the takeover never ran"
        if first_to_finish == "takeover":
            second.join(10)
            assert answers[b"second"] is SUCCESS
            assert effects.count("m1") == 1
            finish[b"first"].set()
            first.join(10)
            assert answers[b"first"] is SUCCESS  # rolled back, acked as a duplicate
        else:
            finish[b"first"].set()
            first.join(10)
            if answers[b"first"] is SUCCESS:  # it committed: the takeover will roll back
                assert effects.count("m1") == 1
            else:  # its session had been ended: rolled back
                assert answers[b"first"] is LATER
                assert effects.count("m1") == 0
            finish[b"second"].set()
            second.join(10)
            assert answers[b"second"] is SUCCESS  # committed, or acked as a duplicate
    finally:
        for event in finish.values():
            event.set()
        first.join(10)
        second.join(10)
        listener.close()
    assert listener.calls["m1"] == 2
    assert effects.count("m1") == 1
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1")
    assert config.persist.get_status(element) is DedupStatus.CONSUMED  # type: ignore[union-attr]


_CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    from rocketmq_dedup import DedupConfig, TransactionalDedupListener
    from rocketmq_dedup.testing import ClassicMessage
    from tests.integration.exactly_once.support import execute, make_client

    driver, table, app, effects, msg_id = sys.argv[1:6]
    options = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {{}}
    sleep = options.pop("handler_sleep_s", 60)
    options.setdefault("dedup_processing_expire_milli_seconds", 1000)
    config = DedupConfig.enable_dedup_consume_config(
        app, make_client(driver), table_name=table, **options
    )

    class Listener(TransactionalDedupListener):
        def do_handle_msg(self, msg, conn):
            execute(conn, "INSERT INTO " + effects + " (k) VALUES (%s)", (msg.id,))
            print("in-handler", flush=True)
            time.sleep(sleep)
            return True

    Listener(config)(ClassicMessage(msg_id))
    print("finished", flush=True)
    """
)


def test_a_consumer_killed_in_its_handler_commits_nothing(
    driver: str, client: Any, table: str, effects: EffectTable, tmp_path: Path
) -> None:
    """SIGKILL inside the handler (a child process): nothing of its transaction is committed,
    no record or claim is left, and the redelivery runs the handler once, at once (the server
    rolled the dead session back when its socket closed)."""
    config = make_config(client, table, dedup_processing_expire_milli_seconds=1000)
    config.persist.create_table()  # type: ignore[union-attr]
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    child = subprocess.Popen(
        [sys.executable, str(script), driver, table, config.application_name, effects.name, "m1"],
        stdout=subprocess.PIPE,
        env={**os.environ},
        cwd=str(ROOT),
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready and child.stdout.readline().strip() == b"in-handler"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert effects.count("m1") == 0  # its INSERT was never committed
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1")
    listener = EffectListener(config, effects)
    try:
        assert config.persist.get_status(element) is None  # type: ignore[union-attr]
        assert listener(ClassicMessage("m1")) is SUCCESS  # no lease to wait for
        assert listener(ClassicMessage("m1")) is SUCCESS  # a duplicate now
        assert listener.calls == {"m1": 1}
        assert effects.count("m1") == 1
    finally:
        listener.close()


def test_a_frozen_consumer_holds_the_key_only_until_its_session_times_out(
    driver: str, client: Any, table: str, effects: EffectTable, tmp_path: Path
) -> None:
    """SIGSTOP inside the handler (a hung VM): while frozen it holds the key, and its twin is
    answered RECONSUME_LATER at once; its session's idle timeout (the hold: here the 2 s lease,
    without renewal) then ends it on the server, which rolls it back and frees its named lock,
    so the twin runs and commits. Woken, the frozen one cannot commit: one effect, not two."""
    options = {"exactly_once_claim": "before_handler", "lease_renewal": False}
    hold_ms = 2000
    config = make_config(client, table, dedup_processing_expire_milli_seconds=hold_ms, **options)
    config.persist.create_table()  # type: ignore[union-attr]
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    child_options = json.dumps(
        # wall-clock sleep: over soon after SIGCONT, the freeze having outlasted it
        {**options, "dedup_processing_expire_milli_seconds": hold_ms, "handler_sleep_s": 5}
    )
    args = [driver, table, config.application_name, effects.name, "m1", child_options]
    child = subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, cwd=str(ROOT)
    )
    listener = EffectListener(config, effects)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready and child.stdout.readline().strip() == b"in-handler"
        os.kill(child.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        began = time.monotonic()
        assert listener(ClassicMessage("m1")) is LATER  # the frozen copy holds the key...
        assert time.monotonic() - began < 0.1  # ...and its twin is not kept waiting
        answers = []
        deadline = frozen_at + 30
        while time.monotonic() < deadline:
            answers.append(listener(ClassicMessage("m1")))
            if answers[-1] is SUCCESS:
                break
            time.sleep(0.2)
        freed_after = time.monotonic() - frozen_at
        assert answers and answers[-1] is SUCCESS, answers  # the server ended the session
        assert freed_after < hold_ms / 1000 + 15, freed_after  # bounded by the idle timeout
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=30)
        assert b"finished" in out  # woken, its commit failed (its session is gone)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait(10)
        listener.close()
    assert listener.calls == {"m1": 1}
    assert effects.count("m1") == 1
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1")
    assert config.persist.get_status(element) is DedupStatus.CONSUMED  # type: ignore[union-attr]


_CONSUMER = textwrap.dedent(
    """
    import collections, json, random, sys, threading, time
    sys.path.insert(0, {root!r})
    from rocketmq_dedup import ConsumeStatus, DedupConfig, TransactionalDedupListener
    from rocketmq_dedup.testing import ClassicMessage
    from tests.integration.exactly_once.support import execute, make_client

    driver, table, app, effects, claim, keys = sys.argv[1:7]
    config = DedupConfig.enable_dedup_consume_config(
        app, make_client(driver), table_name=table, exactly_once_claim=claim,
        **({{}} if driver == "psycopg_pool" else {{"pool_size": 8}}),
    )

    class Listener(TransactionalDedupListener):
        def do_handle_msg(self, msg, conn):
            execute(conn, "INSERT INTO " + effects + " (k) VALUES (%s)", (msg.id,))
            time.sleep(random.uniform(0, 0.003))  # work, so that copies overlap
            return True

    listener = Listener(config)
    queue = collections.deque(json.loads(keys))
    lock = threading.Lock()
    print("ready", flush=True)
    sys.stdin.readline()  # both processes start together

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                key = queue.popleft()
            if listener(ClassicMessage(key)) is ConsumeStatus.RECONSUME_LATER:
                with lock:
                    queue.append(key)  # the broker's redelivery

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    listener.close()
    print("done", flush=True)
    """
)


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
def test_two_processes_consuming_the_same_keys_apply_each_once(
    driver: str, claim: str, client: Any, table: str, effects: EffectTable, tmp_path: Path
) -> None:
    """Two consumer processes of one application, 4 threads each, are given the same 150 keys
    (in different orders) and started together; a RECONSUME_LATER goes back to the process's
    queue. Both finish, and every key's effect is committed exactly once, with its record."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER.format(root=str(ROOT)))
    keys = [f"k{i}" for i in range(150)]
    children = []
    try:
        for order in (keys, list(reversed(keys))):
            args = [driver, table, config.application_name, effects.name, claim, json.dumps(order)]
            command = [sys.executable, str(script), *args]
            pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
            children.append(subprocess.Popen(command, cwd=str(ROOT), **pipes))
        for child in children:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready and child.stdout.readline().strip() == b"ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            child.stdin.flush()
        for child in children:
            out, _ = child.communicate(timeout=120)
            assert child.returncode == 0 and b"done" in out
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    assert effects.counts() == dict.fromkeys(keys, 1)
    store = config.persist
    assert store is not None
    records = store.read_many(
        [DedupElement(config.application_name, "TEST-TOPIC", "TagA", k) for k in keys]
    )
    assert all(r is not None and r.status is DedupStatus.CONSUMED for r in records)
    config.close()
