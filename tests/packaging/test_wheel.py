"""The package as a user installs it: ``python -m build`` makes an sdist and a wheel, ``twine
check`` passes, and the long description's links are absolute (the package index resolves no
relative one). The wheel (not the checkout, not editable) installed into fresh venvs: with
``[cli]`` it imports, answers ``rocketmq-dedup --version``, runs a listener on the memory store
and writes out the operator kit it ships (``rocketmq-dedup ops export``); with no extra
``--version`` still answers, and pytest finds the package's plugin by its entry point (the
README's sample test passes with its fixtures); with both client extras, the adapters refuse
the pair. Needs PyPI (the build's isolated environment, click, pytest, the two clients), no
server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest

import rocketmq_dedup

REPO = Path(__file__).resolve().parents[2]
VERSION = rocketmq_dedup.__version__


#: The environment of the commands run here, without PYTHONPATH: a checkout on it (with its
#: egg-info) would pass for the installed package, and pip would not install the wheel.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(*args: object, cwd: Path, timeout: float = 600) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=CLEAN_ENV,
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


def venv_with(wheel: str, *also: str, home: Path) -> Path:
    """A new venv (no system site-packages) with ``wheel`` (and ``also``) installed."""
    venv.create(home / "env", with_pip=True, clear=True)
    pip = home / "env" / "bin" / "pip"
    run(pip, "install", "-q", "--disable-pip-version-check", wheel, *also, cwd=home)
    return home / "env"


@pytest.fixture(scope="module")
def fresh_venv(dist: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel and its [cli] extra installed."""
    return venv_with(f"{dist['wheel']}[cli]", home=tmp_path_factory.mktemp("venv"))


@pytest.fixture(scope="module")
def bare_venv(dist: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel, no extra, and pytest (a user testing a listener)."""
    return venv_with(str(dist["wheel"]), "pytest", home=tmp_path_factory.mktemp("bare"))


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
    assert "rocketmq_dedup/ops/prometheus/rocketmq-dedup.rules.yml" in names
    assert "rocketmq_dedup/ops/grafana/rocketmq-dedup-dashboard.json" in names
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


MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_long_description_has_only_absolute_links(dist: Dict[str, Path]) -> None:
    """The README as the wheel's METADATA carries it (what the package index renders): every
    link and image is an absolute https URL, the images and files under the repository's
    address."""
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        metadata = wheel.read(f"rocketmq_dedup-{VERSION}.dist-info/METADATA").decode()
    description = metadata.split("\n\n", 1)[1]
    assert description.startswith("# rocketmq-dedup")
    links = MARKDOWN_LINK.findall(description)
    assert len(links) >= 30
    relative = [link for link in links if not link.startswith("https://")]
    assert not relative, relative
    repository = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"][
        "Repository"
    ]
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", description)
    assert images and all(url.startswith(f"{repository}/raw/main/") for url in images), images


def test_the_installed_wheel_writes_out_the_operator_kit(fresh_venv: Path, tmp_path: Path) -> None:
    """``rocketmq-dedup ops export DIR`` from the installed wheel writes the rules, their
    promtool tests and the dashboard, byte for byte the checkout's; a second export leaves
    them alone unless --force."""
    kit = REPO / "rocketmq_dedup" / "ops"
    expected = sorted(p.relative_to(kit).as_posix() for p in kit.rglob("*") if p.is_file())
    assert "prometheus/rocketmq-dedup.rules.yml" in expected and len(expected) == 4
    command = fresh_venv / "bin" / "rocketmq-dedup"
    out_dir = tmp_path / "kit"
    out = run(command, "ops", "export", out_dir, cwd=tmp_path)
    written = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    assert written == expected, out
    for name in expected:
        assert (out_dir / name).read_bytes() == (kit / name).read_bytes(), name
    again = subprocess.run(
        [command, "ops", "export", out_dir], capture_output=True, text=True, env=CLEAN_ENV
    )
    assert again.returncode == 2 and "--force overwrites" in again.stderr
    run(command, "ops", "export", "--force", out_dir, cwd=tmp_path)


def test_without_extras_version_answers_and_pytest_finds_the_plugin(
    bare_venv: Path, tmp_path: Path
) -> None:
    """No extra installed: ``rocketmq-dedup --version`` answers (no click), a command says
    which extra it needs; and the README's sample test, run by plain ``pytest`` there, gets
    its fixtures from the plugin the wheel registers (entry point pytest11)."""
    out = run(bare_venv / "bin" / "rocketmq-dedup", "--version", cwd=tmp_path)
    assert out == f"rocketmq-dedup, version {VERSION}\n"
    command = subprocess.run(
        [bare_venv / "bin" / "rocketmq-dedup", "stats"],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
    )
    assert command.returncode == 2 and "pip install 'rocketmq-dedup[cli]'" in command.stderr
    sample = REPO / "samples" / "test_payment_listener.py"
    (tmp_path / sample.name).write_bytes(sample.read_bytes())
    result = subprocess.run(
        [bare_venv / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", sample.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=CLEAN_ENV,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
    plugins = run(bare_venv / "bin" / "python", "-m", "pytest", "--trace-config", "--co", "-q",
                  sample.name, cwd=tmp_path)  # fmt: skip
    assert "rocketmq_dedup.pytest_plugin" in plugins


def test_both_client_extras_are_refused_when_an_adapter_is_used(
    dist: Dict[str, Path], tmp_path: Path
) -> None:
    """pip installs ``[rocketmq,rocketmq5]`` (extras cannot declare a conflict); the adapters
    then raise ClientConflictError naming whose rocketmq/__init__.py is on disk."""
    env = venv_with(f"{dist['wheel']}[rocketmq,rocketmq5]", home=tmp_path)
    code = (
        "from rocketmq_dedup.adapters.classic import set_name_server\n"
        "from rocketmq_dedup.errors import ClientConflictError\n"
        "try:\n    set_name_server(object(), '127.0.0.1:9876')\n"
        "except ClientConflictError as exc:\n    print(exc)\n"
    )
    out = run(env / "bin" / "python", "-c", code, cwd=tmp_path)
    assert out.startswith("both RocketMQ clients are installed in this environment"), out
    assert re.search(
        r"its rocketmq/__init__\.py is (rocketmq-client-python|rocketmq-python-client|neither)'s",
        out,
    ), out
