"""Every install line the README gives runs the commands that follow it.

An install line is a ``pip install`` of ``rocketmq-dedup`` anywhere in the README (a shell
block, a sample's docstring shown in a python block, inline code). The commands it precedes
are those after it, up to the next install line or the next ``## `` heading: the lines of shell
blocks, the ``$``-lines of console transcripts, the rest of a sample's docstring, python blocks
(their imports) and inline ``python``/``rocketmq-dedup`` code. What a command needs is read
from the code it runs (a sample's imports, followed into the samples it imports; the command
line's store options), and what a line installs from pyproject.toml's extras: the first must be
within the second. The command line's own commands are also run, with every module the install
line does not provide hidden, and must not ask for an extra."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from tests.unit.test_readme import README, REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

#: The distribution that provides each module a README command may import (the classic and the
#: 5.x RocketMQ clients both provide ``rocketmq``: told apart by what is imported from it).
PROVIDERS = {
    "redis": "redis",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "click": "click",
    "prometheus_client": "prometheus_client",
    "opentelemetry": "opentelemetry-api",
    "sqlalchemy": "SQLAlchemy",
    "psycopg": "psycopg",
    "psycopg_pool": "psycopg-pool",
    "pytest": "pytest",
    "rocketmq.client": "rocketmq-client-python",
    "rocketmq": "rocketmq-python-client",
}
#: Modules of this package that need a distribution at import time.
PACKAGE_MODULES = {"rocketmq_dedup.cli": "click", "rocketmq_dedup.pytest_plugin": "pytest"}
#: The command line's store options, and the distributions that serve each (any one of them).
CLI_STORES = {
    "--redis": ("redis",),
    "--mysql": ("mysqlclient", "PyMySQL"),
    "--postgres": ("psycopg",),
}
PIP_INSTALL = re.compile(r"pip install ([^`;\n#]+)")


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


EXTRAS: Dict[str, Set[str]] = {
    extra: {canonical(requirement_name(r)) for r in requirements}
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items()
}


def installed_by(line: str) -> Set[str]:
    """The distributions ``pip install ARGS`` installs (canonical names): each extra's
    requirements for ``rocketmq-dedup[...]``, and every other package named."""
    found: Set[str] = set()
    for arg in shlex.split(line):
        match = re.fullmatch(r"rocketmq-dedup(?:\[([\w,]*)\])?", arg)
        if match:
            for extra in filter(None, (match.group(1) or "").split(",")):
                assert extra in EXTRAS, f"{line!r}: no extra {extra!r} in pyproject.toml"
                found |= EXTRAS[extra]
        elif not arg.startswith("-"):
            found.add(canonical(requirement_name(arg)))
    return found


# -- what a command needs --------------------------------------------------------------------


@dataclass
class Needs:
    """Distributions a command needs: every one of ``all_of``, and one of each ``any_of``."""

    all_of: Set[str] = field(default_factory=set)
    any_of: List[Tuple[str, ...]] = field(default_factory=list)

    def unmet(self, installed: Set[str]) -> List[str]:
        missing = sorted(canonical(d) for d in self.all_of if canonical(d) not in installed)
        for choice in self.any_of:
            if not {canonical(d) for d in choice} & installed:
                missing.append(" or ".join(choice))
        return missing


def imported_modules(code: str) -> Iterator[str]:
    """Every module ``code`` imports, at any depth (``from rocketmq import X`` as
    ``rocketmq``, ``from rocketmq.client import X`` as ``rocketmq.client``)."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def needs_of_code(code: str, seen: Optional[Set[str]] = None) -> Needs:
    """What running ``code`` imports, following ``samples.*`` into their files."""
    seen = set() if seen is None else seen
    needs = Needs()
    for module in imported_modules(code):
        top = module.partition(".")[0]
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        if top == "samples":
            if module not in seen:
                seen.add(module)
                path = REPO / (module.replace(".", "/") + ".py")
                needs.all_of |= needs_of_code(path.read_text(), seen).all_of
            continue
        if top == "rocketmq_dedup":
            needs.all_of |= {PACKAGE_MODULES[module]} if module in PACKAGE_MODULES else set()
            continue
        provider = PROVIDERS.get(module) or PROVIDERS.get(top)
        assert provider, f"unknown import {module!r}: say which distribution provides it"
        needs.all_of.add(provider)
    return needs


def sample_file(name: str) -> Optional[Path]:
    """The sample a command names (``samples/x.py`` or, in its own docstring, ``x.py``)."""
    path = REPO / "samples" / Path(name).name
    return path if name.endswith(".py") and path.is_file() else None


def needs_of_command(command: str) -> Optional[Needs]:
    """What a shell command needs, or None for a command that does not run this package
    (``scripts/...``, ``python -m build``)."""
    words = shlex.split(command, comments=True)
    if not words:
        return None
    if words[0] == "rocketmq-dedup":
        return cli_needs(words[1:])
    if words[0] not in ("python", "python3"):
        return None
    if words[1:3] == ["-m", "rocketmq_dedup"]:
        return cli_needs(words[3:])
    if words[1:3] == ["-m", "pytest"]:
        tested = [sample_file(w) for w in words[3:]]
        needs = Needs({"pytest"})
        for path in filter(None, tested):
            needs.all_of |= needs_of_code(path.read_text()).all_of
        return needs
    path = sample_file(words[1]) if len(words) > 1 else None
    if path is not None:
        return needs_of_code(path.read_text())
    return None


def cli_needs(args: List[str]) -> Needs:
    """The command line: ``--version`` needs nothing; any command needs click, and a store
    option its store's driver."""
    if args in (["--version"], ["-V"]):
        return Needs()
    needs = Needs({"click"})
    for option, drivers in CLI_STORES.items():
        if any(arg == option or arg.startswith(option + "=") for arg in args):
            needs.any_of.append(drivers)
    return needs


# -- the README, in order: install lines and the commands after them --------------------------

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
COMMAND_SPAN = re.compile(r"^(?:python3? |rocketmq-dedup\b)")


@dataclass
class Step:
    """An install line (``install``) or a command (``command``, or ``code`` of a python
    block), with where it is."""

    where: str
    install: Optional[str] = None
    command: Optional[str] = None
    code: Optional[str] = None


def prose_steps(text: str, where: str) -> Iterator[Step]:
    for span in INLINE.findall(text):
        span = span.replace("\\|", "|")  # a pipe escaped in a table cell
        match = PIP_INSTALL.search(span)
        if match and "rocketmq-dedup" in match.group(1):
            yield Step(where, install=match.group(1).strip())
        elif COMMAND_SPAN.match(span):
            yield Step(where, command=span)


def shell_steps(code: str, where: str, prompt: bool) -> Iterator[Step]:
    code = re.sub(r"\s*\\\n\s*", " ", code)  # a command continued on the next line
    for line in code.splitlines():
        if prompt:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        for part in line.split(";"):
            part = re.sub(r"(^|\s)#.*$", "", part).strip()  # a comment
            match = PIP_INSTALL.search(part)
            if match:
                if "rocketmq-dedup" in match.group(1):
                    yield Step(where, install=match.group(1).strip())
            elif part:
                yield Step(where, command=part)


def python_steps(code: str, where: str) -> Iterator[Step]:
    """A sample's docstring lines (its install line and how to run it), then its code; an
    install line of the docstring serves that sample only (a Step with neither install nor
    command ends it)."""
    doc = ast.get_docstring(ast.parse(code)) or ""
    own_install = False
    for line in doc.splitlines():
        if "pip install" in line or COMMAND_SPAN.match(line.strip()):
            for step in shell_steps(line.strip(), where, prompt=False):
                own_install = own_install or step.install is not None
                yield step
    yield Step(where, code=code)
    if own_install:
        yield Step(where)


def readme_steps(text: str) -> Iterator[Step]:
    """Every step of the README in order; a ``## `` heading ends what an install line
    serves, and so does the end of a sample with its own (a Step with neither install nor
    command)."""
    for chunk in re.split(r"^(?=## )", text, flags=re.MULTILINE):
        heading = chunk.splitlines()[0] if chunk else ""
        yield Step(heading)
        position = 0
        for block in FENCE.finditer(chunk):
            yield from prose_steps(chunk[position : block.start()], heading)
            language, code = block.group(1), block.group(2)
            if language == "python":
                yield from python_steps(code, heading)
            elif language in ("bash", "sh", "shell"):
                yield from shell_steps(code, heading, prompt=False)
            elif language in ("", "console") and code.startswith("$ "):
                yield from shell_steps(code, heading, prompt=True)
            position = block.end()
        yield from prose_steps(chunk[position:], heading)


@dataclass
class Checked:
    install: str
    where: str
    commands: List[str]
    unmet: Dict[str, List[str]]


def check_install_lines(text: str) -> List[Checked]:
    """Each install line with the commands it precedes and what they need that it lacks."""
    checked: List[Checked] = []
    current: Optional[Checked] = None
    installed: FrozenSet[str] = frozenset()
    for step in readme_steps(text):
        if step.install is not None:
            current = Checked(step.install, step.where, [], {})
            installed = frozenset(installed_by(step.install))
            checked.append(current)
            continue
        if step.command is None and step.code is None:
            current = None  # a heading, or a sample's end: the line served its part
            continue
        if current is None:
            continue
        needs = needs_of_code(step.code) if step.code is not None else None
        if step.command is not None:
            needs = needs_of_command(step.command)
        if needs is None:
            continue
        label = step.command or "python block"
        current.commands.append(label)
        unmet = needs.unmet(set(installed))
        if unmet:
            current.unmet[label] = unmet
    return checked


def test_every_install_line_provides_what_the_commands_after_it_need() -> None:
    """The README's install lines (at least one per quick start, the command line's, the
    testing sample's), each checked against the commands after it."""
    checked = check_install_lines(README.read_text())
    with_commands = [c for c in checked if c.commands]
    assert len(with_commands) >= 10, [(c.install, c.where) for c in checked]
    problems = [(c.where, c.install, c.unmet) for c in checked if c.unmet]
    assert not problems, problems


def test_the_check_catches_the_missing_cli_extra_of_the_mysql_quick_start() -> None:
    """The quick start as it was: ``[mysql,rocketmq]`` then ``python -m rocketmq_dedup schema
    mysql``, which needs click; and Redis commands (one continued on a second line) after a
    MySQL-only install."""
    text = (
        "## Quick start (MySQL / MariaDB)\n\n```bash\n"
        "pip install 'rocketmq-dedup[mysql,rocketmq]'        # mysqlclient; PyMySQL works too\n"
        "python -m rocketmq_dedup schema mysql               # prints the DDL\n"
        "python samples/quickstart_mysql.py\n```\n\n"
        "## Operating it\n\n(`pip install 'rocketmq-dedup[cli,mysql]'`)\n\n"
        "```\n$ rocketmq-dedup check --redis redis://127.0.0.1:16379/0\n```\n\n"
        "```bash\nrocketmq-dedup stats --app orders \\\n  --redis redis://127.0.0.1:16379/0\n```\n"
    )
    [quick_start, operating] = check_install_lines(text)
    assert quick_start.commands == ["python -m rocketmq_dedup schema mysql",
                                    "python samples/quickstart_mysql.py"]  # fmt: skip
    assert quick_start.unmet == {"python -m rocketmq_dedup schema mysql": ["click"]}
    assert operating.unmet == {
        "rocketmq-dedup check --redis redis://127.0.0.1:16379/0": ["redis"],
        "rocketmq-dedup stats --app orders --redis redis://127.0.0.1:16379/0": ["redis"],
    }


def test_what_a_sample_needs_is_read_from_its_imports() -> None:
    """The classic and the 5.x quick starts need their own client, and a sample that
    imports another sample needs what that one imports."""
    grpc = needs_of_command("python samples/quickstart_grpc_push.py")
    classic = needs_of_command("python samples/quickstart_redis.py")
    consumer = needs_of_command("python samples/redis_consumer.py")
    assert grpc is not None and classic is not None and consumer is not None
    assert grpc.all_of == {"redis", "rocketmq-python-client"}
    assert classic.all_of == {"redis", "rocketmq-client-python"}
    assert "rocketmq-client-python" in consumer.all_of  # through samples.rocketmq_clients


HIDE_ALL_BUT = """
import importlib.abc, sys
HIDDEN = {hidden!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
sys.argv = ["rocketmq-dedup", *{args!r}]
from rocketmq_dedup.__main__ import run
sys.exit(run())
"""
#: The modules each distribution of an extra provides (to hide those a line does not install).
MODULES_OF = {
    "redis": "redis",
    "mysqlclient": "MySQLdb",
    "pymysql": "pymysql",
    "click": "click",
    "prometheus-client": "prometheus_client",
    "opentelemetry-api": "opentelemetry",
    "sqlalchemy": "sqlalchemy",
    "rocketmq-client-python": "rocketmq",
    "rocketmq-python-client": "rocketmq",
}


#: The commands the test may run for real: they read, or write only in the test's folder
#: (``ops export``). The others (``release``, ``purge``, commands that send messages) are
#: checked from what they need, never run.
SAFE_TO_RUN = {"--version", "-V", "schema", "check", "stats", "inspect", "ops"}


def cli_runs() -> Iterator[Tuple[str, List[str], Set[str]]]:
    """(install line, command line arguments, modules to hide) of each command-line command
    the README runs after an install line that is safe to run here."""
    for checked in check_install_lines(README.read_text()):
        installed = installed_by(checked.install)
        hidden = {m for d, m in MODULES_OF.items() if d not in installed}
        for command in checked.commands:
            words = shlex.split(command, comments=True)
            if words[0] == "rocketmq-dedup":
                args = words[1:]
            elif words[1:3] == ["-m", "rocketmq_dedup"]:
                args = words[3:]
            else:
                continue
            if args and args[0] in SAFE_TO_RUN:
                yield checked.install, args, hidden


def test_the_command_lines_commands_run_with_only_what_their_install_line_gives(
    tmp_path: Path,
) -> None:
    """Each ``rocketmq-dedup``/``python -m rocketmq_dedup`` command after an install line,
    run with every module that line does not install hidden, never stops to ask for an extra
    (it may still fail to reach a server that is not running)."""
    runs = list(cli_runs())
    assert any(args[:2] == ["schema", "mysql"] for _, args, _ in runs)
    for install, args, hidden in runs:
        result = run_hidden(sorted(hidden), args, cwd=tmp_path)
        output = result.stdout + result.stderr
        assert "pip install" not in output and "Traceback" not in output, (install, args, output)


def run_hidden(
    hidden: List[str], args: List[str], cwd: Optional[Path] = None
) -> subprocess.CompletedProcess[str]:
    """``rocketmq-dedup ARGS`` with the modules ``hidden`` not importable, in ``cwd`` (a
    command may write there: ``ops export DIR``)."""
    return subprocess.run(
        [sys.executable, "-c", HIDE_ALL_BUT.format(hidden=sorted(hidden), args=args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_version_answers_without_click() -> None:
    """``rocketmq-dedup --version`` (and ``-V``) with click hidden: the version, exit 0, the
    same line the command line prints when click is there. (Any command without click says
    which extra to install: tests/unit/test_packaging.py.)"""
    from rocketmq_dedup import __version__

    with_click = subprocess.run(
        [sys.executable, "-c", "from rocketmq_dedup.cli import main; main(['--version'])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert with_click.stdout == f"rocketmq-dedup, version {__version__}\n"
    for flag in ("--version", "-V"):
        result = run_hidden(["click"], [flag])
        assert result.returncode == 0, result.stderr
        assert result.stdout == with_click.stdout
