"""Every extra of pyproject.toml installs something that imports on a fresh machine.

A fresh venv per group of extras (``rocketmq`` and ``rocketmq5`` each alone: both install the
top-level package ``rocketmq``), a real ``pip install "<project>[extras]"`` from the package
index (network; pip's cache lives in the state directory), then the import a user's code
makes. The three venvs are installed side by side: about 10 s with a warm cache, a minute or
two with a cold one (mysqlclient compiles)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("ROCKETMQ_DEDUP_STATE_ROOT", "/tmp/rocketmq-dedup"))

#: What a user's code imports after ``pip install 'rocketmq-dedup[extra]'``.
EXTRA_IMPORTS = {
    "redis": "import redis",
    "mysql": "import MySQLdb",
    # the binary wheel: its libpq loads without the system's
    "postgres": "import psycopg; assert psycopg.pq.__impl__ == 'binary', psycopg.pq.__impl__",
    # loads librocketmq: fails with "rocketmq dynamic library not found" when it is not bundled
    "rocketmq": "from rocketmq.client import PushConsumer",
    "rocketmq5": "from rocketmq import ClientConfiguration",
    "cli": "import click",
    "prometheus": "import prometheus_client",
    "otel": "import opentelemetry.metrics",
    "sqlalchemy": "import sqlalchemy",
    "asyncmysql": "import asyncmy",
}
#: The venvs, by the extras installed together.
VENVS = {
    "rocketmq": ["rocketmq"],
    "rocketmq5": ["rocketmq5"],
    "others": [e for e in EXTRA_IMPORTS if e not in ("rocketmq", "rocketmq5")],
}
VENV_OF = {extra: venv for venv, extras in VENVS.items() for extra in extras}


def declared_extras() -> Dict[str, list[str]]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["optional-dependencies"])


def install(root: Path, name: str, project: Path) -> Path:
    """A fresh venv ``root/name`` with ``project[extras]`` installed; its python."""
    venv = root / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {**os.environ, "PIP_CACHE_DIR": str(STATE / "pip-cache")}
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{project}[{','.join(VENVS[name])}]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"pip install [{name}] failed:\n{result.stderr[-3000:]}"
    return python


@pytest.fixture(scope="module")
def venvs() -> Iterator[Dict[str, Path]]:
    """The venvs, installed in parallel from a copy of the project's sources (a build in the
    working tree would leave build/ behind)."""
    STATE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=STATE, prefix="extras-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(REPO / name, project / name)
        shutil.copytree(
            REPO / "rocketmq_dedup",
            project / "rocketmq_dedup",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        with ThreadPoolExecutor(len(VENVS)) as pool:
            futures = {name: pool.submit(install, root, name, project) for name in VENVS}
            yield {name: future.result() for name, future in futures.items()}


def run_python(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    home = STATE / "extras-home"  # the RocketMQ clients log under $HOME
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not the checkout
    return subprocess.run(
        [str(python), "-c", code],
        cwd=home,  # not the repository: import what the venv installed
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_extra_is_checked() -> None:
    """Each extra declared in pyproject.toml has its import here (a new extra needs one)."""
    assert set(declared_extras()) == set(EXTRA_IMPORTS)


def test_the_rocketmq_extra_pins_the_release_that_bundles_librocketmq() -> None:
    """[rocketmq] is rocketmq-client-python 0.5.0rc2, the one with manylinux wheels."""
    assert declared_extras()["rocketmq"] == ["rocketmq-client-python==0.5.0rc2"]


@pytest.mark.parametrize("extra", list(EXTRA_IMPORTS))
def test_extra_installs_an_importable_client(extra: str, venvs: Dict[str, Path]) -> None:
    """After a fresh `pip install 'rocketmq-dedup[extra]'`, the client module imports, and so
    does rocketmq_dedup (from the venv, not the working tree)."""
    code = f"{EXTRA_IMPORTS[extra]}\nimport rocketmq_dedup\nprint(rocketmq_dedup.__file__)"
    result = run_python(venvs[VENV_OF[extra]], code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "site-packages" in result.stdout


def test_classic_extra_loads_the_bundled_native_library(venvs: Dict[str, Path]) -> None:
    """[rocketmq]: 0.5.0rc2 is installed and librocketmq comes from its own package."""
    code = (
        "import importlib.metadata, rocketmq.ffi\n"
        "print(importlib.metadata.version('rocketmq-client-python'), rocketmq.ffi.dll._name)"
    )
    result = run_python(venvs["rocketmq"], code)
    assert result.returncode == 0, result.stderr[-3000:]
    version, library = result.stdout.split()
    assert version == "0.5.0rc2"
    assert "site-packages/rocketmq/" in library


def test_cli_extra_installs_the_command(venvs: Dict[str, Path]) -> None:
    """[cli]: the `rocketmq-dedup` console script runs."""
    script = venvs["others"].parent / "rocketmq-dedup"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "schema" in result.stdout
