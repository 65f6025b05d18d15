"""The README's runnable code is the sample files: every ```python block marked with an HTML
comment naming a sample (``<!-- samples/quickstart_redis.py -->``) is that file, verbatim, and
every quick-start sample is shown in the README."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupStatus,
    MemoryDedupStore,
)
from rocketmq_dedup.message import message_body, message_keys
from rocketmq_dedup.testing import ClassicMessage, GrpcMessage

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARKED_BLOCK = re.compile(
    r"^<!-- (samples/[\w./-]+\.py) -->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL
)
QUICKSTARTS = sorted(REPO.glob("samples/quickstart_*.py"))


def marked_blocks(text: str) -> List[Tuple[str, str]]:
    """(path, code) of every sample-marked python block of ``text``."""
    return [(m.group(1), m.group(2)) for m in MARKED_BLOCK.finditer(text)]


def test_marked_blocks_are_the_sample_files_verbatim() -> None:
    """Each marked block equals its file's content exactly."""
    blocks = marked_blocks(README.read_text())
    assert blocks, "no <!-- samples/... --> block in README.md"
    for path, code in blocks:
        assert (REPO / path).is_file(), f"README shows {path}, which does not exist"
        assert code == (REPO / path).read_text(), f"README's copy of {path} differs from the file"


def test_every_marker_is_followed_by_its_block() -> None:
    """A marker comment not directly followed by a python block would go unchecked."""
    text = README.read_text()
    markers = re.findall(r"^<!-- (samples/\S+) -->$", text, re.MULTILINE)
    assert markers == [path for path, _ in marked_blocks(text)]


def test_every_quickstart_file_is_in_the_readme_once() -> None:
    """samples/quickstart_*.py: all four, each shown once; and the testing sample once."""
    shown = [path for path, _ in marked_blocks(README.read_text())]
    expected = [f"samples/{p.name}" for p in QUICKSTARTS]
    assert len(expected) == 4
    assert sorted(p for p in shown if "/quickstart_" in p) == expected
    assert shown.count("samples/test_payment_listener.py") == 1


def test_the_marker_check_catches_a_difference() -> None:
    """A block that differs from its file by one character is reported as different."""
    path = "samples/quickstart_redis.py"
    code = (REPO / path).read_text()
    text = f"<!-- {path} -->\n```python\n{code.replace('Ctrl-C', 'Ctrl-D', 1)}```\n"
    [(found, block)] = marked_blocks(text)
    assert found == path and block != code


def class_sources(name: str) -> Dict[str, str]:
    """The source of class ``name`` in each quick start."""
    sources = {}
    for path in QUICKSTARTS:
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                sources[path.name] = ast.get_source_segment(text, node) or ""
    return sources


def test_one_listener_class_serves_both_clients() -> None:
    """Every quick start (classic and 5.x) defines the same OrderListener, word for word."""
    sources = class_sources("OrderListener")
    assert sorted(sources) == [p.name for p in QUICKSTARTS]
    assert len(set(sources.values())) == 1
    assert "message_keys(msg)" in next(iter(sources.values()))


def test_the_quickstart_listener_handles_an_order_once_on_both_shapes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """OrderListener (run from its source, without a client installed) keys a classic and a
    5.x copy of one order alike: handled once, the other copy logged as a duplicate."""
    namespace: Dict[str, Any] = {
        "Any": Any,
        "DedupConcurrentListener": DedupConcurrentListener,
        "DedupStatus": DedupStatus,
        "logger": logging.getLogger("orders"),
        "message_body": message_body,
        "message_keys": message_keys,
    }
    exec(class_sources("OrderListener")["quickstart_redis.py"], namespace)
    config = DedupConfig.enable_dedup_consume_config("order-service", MemoryDedupStore())
    listener = namespace["OrderListener"](config)
    caplog.set_level(logging.INFO, logger="orders")
    classic = ClassicMessage("c-1", keys=b"order-1", body=b"2 books")
    assert listener(classic) is ConsumeStatus.CONSUME_SUCCESS
    assert listener(GrpcMessage("g-1", keys={"order-1"}, body=b"2 books")) is (
        ConsumeStatus.CONSUME_SUCCESS
    )
    assert [r.getMessage() for r in caplog.records if r.name == "orders"] == [
        "order order-1 handled: 2 books",
        "order order-1: duplicate (CONSUMED), skipped",
    ]
