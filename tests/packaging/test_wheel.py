"""The package as a user installs it: ``python -m build`` makes an sdist and a wheel, ``twine
check`` passes, and the wheel (not the checkout, not editable) installed with ``[cli]`` into a
fresh venv imports, answers ``rocketmq-dedup --version`` and runs a listener on the memory
store. Needs PyPI (the build's isolated environment and click), no server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

import rocketmq_dedup

REPO = Path(__file__).resolve().parents[2]
VERSION = rocketmq_dedup.__version__


def run(*args: object, cwd: Path, timeout: float = 600) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """The sdist and the wheel, built from the checkout into a temporary directory."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO, cwd=out)
    built = {p.suffix: p for p in out.iterdir()}
    assert sorted(built) == [".gz", ".whl"], sorted(out.iterdir())
    return {"sdist": built[".gz"], "wheel": built[".whl"]}


@pytest.fixture(scope="module")
def fresh_venv(dist: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv (no system site-packages) with the wheel and its [cli] extra installed."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home / "env", with_pip=True, clear=True)
    pip = home / "env" / "bin" / "pip"
    run(pip, "install", "-q", "--disable-pip-version-check", f"{dist['wheel']}[cli]", cwd=home)
    yield home / "env"


def test_sdist_and_wheel_pass_twine_check(dist: Dict[str, Path]) -> None:
    """twine check: the metadata and the README render as PyPI shows them."""
    out = run(sys.executable, "-m", "twine", "check", "--strict", *dist.values(), cwd=REPO)
    assert out.count("PASSED") == 2, out


def test_the_wheel_carries_one_version_and_the_metadata_a_user_needs(
    dist: Dict[str, Path],
) -> None:
    """Name and version from rocketmq_dedup.__version__ (declared once), the license expression,
    classifiers naming the Python versions, the project URLs, py.typed; no tests inside."""
    assert dist["wheel"].name == f"rocketmq_dedup-{VERSION}-py3-none-any.whl"
    assert dist["sdist"].name == f"rocketmq_dedup-{VERSION}.tar.gz"
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"rocketmq_dedup-{VERSION}.dist-info/METADATA").decode()
    assert "rocketmq_dedup/py.typed" in names and "rocketmq_dedup/testing.py" in names
    assert not [n for n in names if n.startswith(("tests/", "samples/", "bench/"))]
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "\nRequires-Python: >=3.11\n" in metadata
    assert "\nClassifier: Programming Language :: Python :: 3.11\n" in metadata
    urls = dict(re.findall(r"^Project-URL: (\w+), (\S+)$", metadata, re.MULTILINE))
    assert sorted(urls) == ["Changelog", "Documentation", "Homepage", "Repository"]
    with tarfile.open(dist["sdist"]) as sdist:
        files = {Path(n).name for n in sdist.getnames()}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= files


def test_the_project_urls_name_the_repository_and_files_it_has() -> None:
    """Every URL is under the repository's address, and the files they name exist here."""
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    base = urls["Repository"]
    assert urls["Homepage"] == base
    for name in ("Documentation", "Changelog"):
        path = urls[name].removeprefix(f"{base}/blob/main/")
        assert path != urls[name] and (REPO / path).is_file(), urls[name]


def test_the_changelog_starts_at_the_current_version() -> None:
    """CHANGELOG.md's first release heading is the package's version."""
    headings = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings and headings[0] == VERSION and headings[-1] == "0.1.0"


def test_the_installed_wheel_imports_runs_the_cli_and_a_listener(
    fresh_venv: Path, tmp_path: Path
) -> None:
    """From a directory outside the checkout: the package comes from the venv's
    site-packages, ``rocketmq-dedup --version`` prints the version, and a listener on the
    memory store handles one of two copies (through rocketmq_dedup.testing)."""
    python = fresh_venv / "bin" / "python"
    code = (
        "import json, rocketmq_dedup\n"
        "from rocketmq_dedup import DedupConcurrentListener, DedupConfig, MemoryDedupStore\n"
        "from rocketmq_dedup.testing import ClassicMessage, deliver\n"
        "class L(DedupConcurrentListener):\n"
        "    def do_handle_msg(self, msg): return True\n"
        "config = DedupConfig.enable_dedup_consume_config('app', MemoryDedupStore())\n"
        "report = deliver(L(config), ClassicMessage('m1', keys=b'order-1'), times=2)\n"
        "print(json.dumps({'file': rocketmq_dedup.__file__, 'version': rocketmq_dedup.__version__,"
        " 'runs': report.handler_runs, 'acked': report.acked}))\n"
    )
    found = json.loads(run(python, "-I", "-c", code, cwd=tmp_path))
    assert Path(found["file"]).is_relative_to(fresh_venv), found["file"]
    assert (found["version"], found["runs"], found["acked"]) == (VERSION, 1, 2)
    out = run(fresh_venv / "bin" / "rocketmq-dedup", "--version", cwd=tmp_path)
    assert out.strip() == f"rocketmq-dedup, version {VERSION}"
    listing: List[str] = run(python, "-m", "pip", "list", "--format=freeze", cwd=tmp_path).split()
    assert f"rocketmq-dedup=={VERSION}" in listing and any(
        p.lower().startswith("click==") for p in listing
    )
