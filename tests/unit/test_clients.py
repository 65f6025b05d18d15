"""Both RocketMQ clients in one environment are refused when an adapter is used: they install
the same ``rocketmq`` package over each other, and pip cannot refuse the pair
(``[rocketmq,rocketmq5]``). Here the two are stand-ins, distributions with the clients' names
and RECORDs on a directory of their own, in a subprocess; tests/packaging installs the real
pair from the package index."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

REPO = Path(__file__).resolve().parents[2]
CLASSIC_INIT = b"# the classic client's rocketmq/__init__.py\n"
GRPC_INIT = b"# the 5.x client's rocketmq/__init__.py\nclass MessageListener: pass\n"


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def fake_site(root: Path, dists: Dict[str, bytes], on_disk: bytes) -> Path:
    """A directory with a dist-info per client named in ``dists`` (its recorded
    ``rocketmq/__init__.py``) and the shared package as installed last (``on_disk``)."""
    site = root / "site"
    (site / "rocketmq").mkdir(parents=True)
    (site / "rocketmq" / "__init__.py").write_bytes(on_disk)
    for name, init in dists.items():
        info = site / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text(
            f"rocketmq/__init__.py,{record_hash(init)},{len(init)}\n{info.name}/RECORD,,\n"
        )
    return site


def use_adapters(site: Path) -> subprocess.CompletedProcess[str]:
    """In a subprocess seeing ``site`` first: each adapter, and what it raised."""
    code = (
        f"import sys; sys.path.insert(0, {str(site)!r})\n"
        "from rocketmq_dedup.adapters.classic import set_name_server\n"
        "from rocketmq_dedup.adapters.grpc import consume_simple, message_listener\n"
        "class Client:\n"
        "    def set_namesrv_addr(self, address): print('name server', address)\n"
        "for use in (lambda: set_name_server(Client(), '127.0.0.1:9876'),\n"
        "            lambda: message_listener(None),\n"
        "            lambda: consume_simple(None, None)):\n"
        "    try:\n"
        "        use()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"
    )
    return subprocess.run(  # -S: no site-packages, whatever client this interpreter has
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    ("last", "owner"),
    [(GRPC_INIT, "rocketmq-python-client"), (CLASSIC_INIT, "rocketmq-client-python")],
    ids=["5.x-installed-last", "classic-installed-last"],
)
def test_both_clients_are_refused_by_every_adapter(tmp_path: Path, last: bytes, owner: str) -> None:
    """Classic and 5.x both installed: set_name_server, message_listener and consume_simple
    raise ClientConflictError, naming whose rocketmq/__init__.py is on disk and how to get
    back to one client."""
    site = fake_site(
        tmp_path,
        {"rocketmq-client-python": CLASSIC_INIT, "rocketmq-python-client": GRPC_INIT},
        last,
    )
    result = use_adapters(site)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("ClientConflictError") for line in lines)
    assert f"its rocketmq/__init__.py is {owner}'s" in lines[0]
    assert "pip uninstall -y rocketmq-client-python rocketmq-python-client" in lines[0]
    assert "'rocketmq-dedup[rocketmq]' or 'rocketmq-dedup[rocketmq5]'" in lines[0]


def test_one_client_is_not_refused(tmp_path: Path) -> None:
    """The classic client alone: set_name_server sets the address; the 5.x adapter says it
    found the classic client (MissingExtraError), not a conflict."""
    site = fake_site(tmp_path, {"rocketmq-client-python": CLASSIC_INIT}, CLASSIC_INIT)
    result = use_adapters(site)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "name server 127.0.0.1:9876"
    assert lines[1].startswith("MissingExtraError") and "found the classic client" in lines[1]
    assert "ClientConflictError" not in result.stdout


def test_a_shared_file_of_neither_is_said_so(tmp_path: Path) -> None:
    """Both installed and the shared file matching neither RECORD (edited, or a third
    package's): the message says it is neither's."""
    site = fake_site(
        tmp_path,
        {"rocketmq-client-python": CLASSIC_INIT, "rocketmq-python-client": GRPC_INIT},
        b"# someone else's\n",
    )
    result = use_adapters(site)
    assert "its rocketmq/__init__.py is neither's" in result.stdout, result.stdout
