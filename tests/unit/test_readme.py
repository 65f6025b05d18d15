"""The README's runnable code is the sample files: every ```python block marked with an HTML
comment naming a sample (``<!-- samples/quickstart_redis.py -->``) is that file, verbatim, and
every quick-start sample is shown in the README."""

from __future__ import annotations

import ast
import enum
import inspect
import logging
import re
import tomllib
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

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
#: The quick starts of AsyncDedupConcurrentListener (the classic push client, the 5.x simple).
ASYNC_QUICKSTARTS = [p for p in QUICKSTARTS if p.name.startswith("quickstart_asyncio")]
#: The quick starts of DedupConcurrentListener (the others: exactly-once, asyncio).
PLAIN_QUICKSTARTS = [
    p for p in QUICKSTARTS if "exactly_once" not in p.name and p not in ASYNC_QUICKSTARTS
]


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
    """samples/quickstart_*.py: all nine, each shown once; and the testing sample once."""
    shown = [path for path, _ in marked_blocks(README.read_text())]
    expected = [f"samples/{p.name}" for p in QUICKSTARTS]
    assert len(expected) == 9
    assert sorted(p for p in shown if "/quickstart_" in p) == expected
    assert shown.count("samples/test_payment_listener.py") == 1


def test_the_marker_check_catches_a_difference() -> None:
    """A block that differs from its file by one character is reported as different."""
    path = "samples/quickstart_redis.py"
    code = (REPO / path).read_text()
    text = f"<!-- {path} -->\n```python\n{code.replace('Ctrl-C', 'Ctrl-D', 1)}```\n"
    [(found, block)] = marked_blocks(text)
    assert found == path and block != code


def class_sources(name: str, paths: Any = None) -> Dict[str, str]:
    """The source of class ``name`` in each quick start (of ``paths``: the plain ones)."""
    sources = {}
    for path in PLAIN_QUICKSTARTS if paths is None else paths:
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                sources[path.name] = ast.get_source_segment(text, node) or ""
    return sources


def test_one_listener_class_serves_both_clients() -> None:
    """Every plain quick start (classic and 5.x) defines the same OrderListener, word for
    word."""
    sources = class_sources("OrderListener")
    assert sorted(sources) == [p.name for p in PLAIN_QUICKSTARTS] and len(sources) == 5
    assert len(set(sources.values())) == 1
    assert "message_keys(msg)" in next(iter(sources.values()))


def test_the_asyncio_quick_starts_share_one_listener_class() -> None:
    """Both asyncio quick starts (the classic push client's bridge, the 5.x SimpleConsumer's
    driver) define the same asyncio OrderListener, word for word."""
    sources = class_sources("OrderListener", ASYNC_QUICKSTARTS)
    assert len(sources) == 2 and len(set(sources.values())) == 1
    assert "AsyncDedupConcurrentListener" in next(iter(sources.values()))


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


# -- the first screen, and what a user acts on ----------------------------------------------

CHINESE = "## 中文快速上手"


def english_and_chinese() -> Tuple[str, str]:
    text = README.read_text()
    english, _, chinese = text.partition(CHINESE)
    assert chinese, "the Chinese section is missing"
    return english, chinese


def section(title: str) -> str:
    """The text of the README section ``## title`` (up to the next ``## ``)."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


PROJECT_URLS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
REPOSITORY = PROJECT_URLS["Repository"]
REPO_LINK = re.compile(rf"^{re.escape(REPOSITORY)}/(blob|tree|raw)/main/([^#]+)(?:#(.+))?$")


def repo_target(url: str) -> Tuple[str, str, str]:
    """(kind, path, fragment) of a link to this repository's main branch: ``blob`` (a file),
    ``tree`` (a folder) or ``raw`` (a file's bytes, for images)."""
    match = REPO_LINK.match(url)
    assert match, f"{url} is not a link to {REPOSITORY}'s main branch"
    return match.group(1), match.group(2), match.group(3) or ""


def assert_resolves(url: str) -> None:
    """An absolute link; one into the repository names a file or folder that exists here,
    and an anchor of the README one of its headings."""
    assert url.startswith("https://"), f"{url}: not absolute (the package index shows it)"
    if not url.startswith(REPOSITORY + "/"):
        return
    kind, path, fragment = repo_target(url)
    target = REPO / path
    assert target.is_dir() if kind == "tree" else target.is_file(), url
    if fragment:
        assert path == "README.md", url
        headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", README.read_text(), re.M)}
        assert fragment in headings, url


QUICK_START = re.compile(r"^## Quick start\n.*?^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_first_screen_says_what_why_how_to_set_up_and_a_short_quick_start() -> None:
    """Before the table of contents: what it is, why (the Java original's defects), the two
    set-up commands and a quick start of at most 15 lines of code; then a contents list whose
    every link reaches a heading or a file."""
    text = README.read_text()
    first = text[: text.index("\n## Contents\n")]
    assert len(first.splitlines()) <= 50
    assert "RocketMQDedupListener" in first and "Why not the Java original" in first
    assert "scripts/demo.sh" in first and "scripts/test.sh" in first
    [code] = QUICK_START.findall(first)
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 15, len(lines)
    contents = section("Contents")
    links = [repo_target(link) for link in re.findall(r"\]\(([^)]+)\)", contents)]
    anchors = {fragment for _, path, fragment in links if path == "README.md"}
    for needed in ("configuration", "operating-it", "performance", "under-faults"):
        assert needed in anchors, needed
    assert any(a.startswith("exactly-once") for a in anchors)
    for link in re.findall(r"\]\(([^)]+)\)", contents + first):
        assert_resolves(link)


MARKDOWN_LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")


def test_every_link_and_image_is_absolute_and_resolves() -> None:
    """The README is the package's long description, and the package index resolves no
    relative link: every link and image is an absolute URL; those into the repository name
    files and folders that exist and README headings, images by their raw bytes."""
    links = MARKDOWN_LINK.findall(README.read_text())
    assert len(links) >= 30
    for bang, url in links:
        assert_resolves(url)
        if bang and url.startswith(REPOSITORY):
            assert repo_target(url)[0] == "raw", url


def test_the_quick_start_is_the_samples_essentials() -> None:
    """Every line of the 15-line quick start's listener and consumer calls is in
    samples/quickstart_redis.py, bar the business logic placeholder and the literals the sample
    reads from its environment (the defaults, the same values)."""
    [code] = QUICK_START.findall(README.read_text())
    sample = (REPO / "samples/quickstart_redis.py").read_text()
    for call in ("DedupConfig.enable_dedup_consume_config(", "PushConsumer(", "set_name_server(",
                 "consumer.subscribe(", "consumer.start()", "message_keys(msg)"):  # fmt: skip
        assert call in code and call in sample, call
    for literal in ('"order-service"', "16379", '"order-consumer-group"', '"127.0.0.1:9876"',
                    '"ORDER-TOPIC"'):  # fmt: skip
        assert literal in code and literal.strip('"') in sample, literal


def table_rows(text: str, header: str) -> List[List[str]]:
    """The cells of the Markdown table under ``header`` (its first line)."""
    lines = text[text.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def readme_default(cell: str) -> Any:
    """A default as the options table writes it: 60 000, `"consume"`, `True`, `None`..."""
    cell = cell.strip("`")
    if cell in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[cell]
    if re.fullmatch(r"[\d ]+(\.\d+)?", cell):
        return float(cell.replace(" ", ""))
    return cell.strip('"')


def code_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def test_the_options_table_is_dedup_configs_settings_with_their_defaults() -> None:
    """Each option DedupConfig.enable_dedup_consume_config takes (its settings, the stores'
    options, check_store) is a row, no row is anything else, and each default is the code's."""
    from rocketmq_dedup import MySQLDedupStore, RedisDedupStore
    from rocketmq_dedup.stores import STORE_OPTIONS

    rows = table_rows(section("Configuration"), "| option | default | meaning |")
    documented = {row[0].strip("`"): readme_default(row[1]) for row in rows}
    settings = DedupConfig.settings()
    assert set(documented) == set(settings) | set(STORE_OPTIONS) | {"check_store"}
    defaults: Dict[str, Any] = {k: code_default(v) for k, v in settings.items()}
    for function in (
        DedupConfig.enable_dedup_consume_config,
        MySQLDedupStore.__init__,
        RedisDedupStore.__init__,
    ):
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.default is not inspect.Parameter.empty:
                defaults[name] = code_default(parameter.default)
    for name, default in documented.items():
        assert default == defaults[name], name


#: A non-default value of each store option, and the client of the store that takes it (built
#: without a server: check_store=False, no connection until a message).
STORE_OPTION_VALUES = {
    "table_name": ("mysql", "t_orders_dedup"),
    "pool_size": ("mysql", 3),
    "pool_timeout": ("mysql", 1.5),
    "key_prefix": ("redis", "ORDERS"),
    "defer_marks_ms": ("mysql", 0),
}


def store_client(kind: str) -> Any:
    if kind == "redis":
        import redis

        return redis.Redis(port=1)
    return lambda: None  # a MySQL connection factory never called


def test_the_readme_says_which_options_are_attributes_and_where_to_read_the_others() -> None:
    """Every setting row is an attribute of the config, read back and assigned; every row
    that points at ``config.persist.NAME`` is the store's option, readable there with the
    value given and not an attribute of the config; the paragraph names exactly those; and
    check_store, said to be not kept, is not kept."""
    from rocketmq_dedup.stores import STORE_OPTIONS

    text = section("Configuration")
    rows = {row[0].strip("`"): row[2] for row in table_rows(text, "| option | default | meaning |")}
    on_store = {name for name, meaning in rows.items() if f"`config.persist.{name}`" in meaning}
    assert on_store == set(STORE_OPTIONS) == set(STORE_OPTION_VALUES)
    paragraph = text[: text.index("| option | default | meaning |")]
    claim = paragraph[paragraph.index("The store's options (") :]
    assert set(re.findall(r"`(\w+)`", claim[: claim.index(")")])) == on_store
    assert "read as `config.persist.table_name`" in paragraph
    for name in on_store:
        kind, value = STORE_OPTION_VALUES[name]
        config = DedupConfig.enable_dedup_consume_config(
            "app", store_client(kind), check_store=False, **{name: value}
        )
        assert getattr(config.persist, name) == value, name
        assert not hasattr(config, name), name
    assert "not kept" in rows["check_store"]
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore(), check_store=True)
    assert not hasattr(config, "check_store")
    settings = set(rows) - on_store - {"check_store"}
    assert settings == set(DedupConfig.settings())
    assert "Every setting is\nalso an attribute of the config" in paragraph
    for name in settings:
        default = DedupConfig.settings()[name]
        setattr(config, name, default)  # the Java setter, validated
        assert getattr(config, name) == default, name


def every_event(metrics: Any) -> None:
    """Every kind of event a metrics object hears: a decision, store calls that succeeded and
    failed, a renewal round, a purge, an outbox relay's batch and backlog."""
    from rocketmq_dedup.metrics import Decision, Outcome, StoreOp

    metrics.message(Decision("app", "T", Outcome.CONSUMED, None, 0, 0.1))
    metrics.store_operation("app", StoreOp.CLAIM, 0.001, True)
    metrics.store_operation("app", StoreOp.CLAIM, 0.001, False)
    metrics.leases("app", 1, 1)
    metrics.purge("t_rocketmq_dedup", 1, 2.0)
    metrics.outbox_sent("t_outbox", "T", 2)
    metrics.outbox_failed("t_outbox", "T", 1)
    metrics.outbox_parked("t_outbox", "T", 1)
    metrics.outbox_backlog("t_outbox", 3, 1.5, 1)


def exported_prometheus() -> Set[str]:
    """The sample names PrometheusMetrics exports once every kind of event happened."""
    from prometheus_client import CollectorRegistry

    from rocketmq_dedup.metrics import PrometheusMetrics

    registry = CollectorRegistry()
    every_event(PrometheusMetrics(registry))
    return {sample.name for family in registry.collect() for sample in family.samples}


def exported_opentelemetry() -> Set[str]:
    """The instrument names OpenTelemetryMetrics records once every kind of event happened."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from rocketmq_dedup.metrics import OpenTelemetryMetrics

    reader = InMemoryMetricReader()
    every_event(OpenTelemetryMetrics(MeterProvider(metric_readers=[reader])))
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_the_metrics_list_is_what_the_backends_export() -> None:
    """The Prometheus names the README shows are exported, and every exported family is
    listed; the same for the OpenTelemetry instruments; every outcome and op is named."""
    from rocketmq_dedup.metrics import Outcome, StoreOp

    text = README.read_text()
    samples = exported_prometheus()
    shown = set(re.findall(r"\brocketmq_dedup_[a-z_]+[a-z]", text))
    histograms = {name[: -len("_bucket")] for name in samples if name.endswith("_bucket")}
    assert shown <= samples | histograms, shown - samples - histograms
    counters = {name for name in samples if name.endswith("_total")}
    assert counters | histograms <= shown, (counters | histograms) - shown
    instruments = exported_opentelemetry()
    otel = section("Operating it")
    otel = otel[otel.index("`OpenTelemetryMetrics(") :]
    otel = otel[
        otel.index("the\n  same instruments (") : otel.index(")", otel.index("same instruments"))
    ]
    assert set(re.findall(r"`(rocketmq_dedup\.[a-z_.]+[a-z])`", otel)) == instruments
    metrics_text = section("Operating it")
    for name in [o.value for o in Outcome] + [op.value for op in StoreOp]:
        assert f"`{name}`" in metrics_text, name


def test_the_commands_table_is_the_command_line() -> None:
    """Each command the README's table shows is one of the CLI's, and each of its commands is
    shown; every --option the README names for it exists."""
    from rocketmq_dedup.cli import cli

    rows = table_rows(section("Operating it"), "| command | what it does |")
    shown = {row[0].strip("`").split()[0] for row in rows}
    assert shown == set(cli.commands)  # type: ignore[attr-defined]
    options = {
        opt
        for command in cli.commands.values()  # type: ignore[attr-defined]
        for group in [command, *getattr(command, "commands", {}).values()]
        for param in group.params
        for opt in param.opts
    } | {"--version", "--help"}
    text = README.read_text()
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", section("Operating it")))
    named -= {"--app", "--topic", "--metrics-port"} - options  # the sample consumer's own
    assert named <= options, named - options
    assert "rocketmq-dedup --version" in text or "`--version`" in text


def code_text() -> str:
    files = [
        *REPO.glob("rocketmq_dedup/**/*.py"),
        *REPO.glob("samples/*.py"),
        *REPO.glob("scripts/*.sh"),
        *REPO.glob("scripts/rocketmq/*"),
    ]
    return "\n".join(path.read_text(errors="replace") for path in files if path.is_file())


def test_env_vars_and_ports_in_the_readme_are_the_codes() -> None:
    """Each environment variable and each port the README (either language) names appears in
    the code, samples or scripts that read or open it."""
    text, code = README.read_text(), code_text()
    prefixes = "ROCKETMQ|REDIS|MYSQL|POSTGRES|ORDER|DEDUP"
    env_vars = set(re.findall(rf"\b((?:{prefixes})_[A-Z_]+[A-Z])\b", text))
    env_vars |= {"REDISCLI_AUTH"}
    assert len(env_vars) >= 10
    for name in env_vars:
        assert name in code, name
    ports = set(re.findall(r"(?:127\.0\.0\.1:|port=|\()(\d{4,5})\b", text))
    ports |= set(re.findall(r"(?:server|gRPC|remoting|broker) (\d{4,5})\b", text))
    ports |= {p for pair in re.findall(r"\b(\d{5})-(\d{5})\b", text) for p in pair}
    assert {"16379", "13306", "15432", "9876", "8081", "19090", "8000"} <= ports
    for port in ports:
        assert re.search(rf"\b{port}\b", code), port


def test_the_chinese_section_names_what_the_english_one_does() -> None:
    """What a user acts on, named in backticks in the Chinese section (options, functions and
    metrics in snake_case, env vars, files, --flags, commands, extras, ports), is in the English
    part as written; so are its host:port addresses."""
    english, chinese = english_and_chinese()
    chinese = re.sub(r"^```.*?^```$", "", chinese, flags=re.MULTILINE | re.DOTALL)
    checked = 0
    for quoted in re.findall(r"`([^`]+)`", chinese):
        for word in re.findall(r"\[\w+\]|--[\w-]+|[A-Za-z_][\w./:-]*[\w/]|\d{4,5}", quoted):
            acted_on = (
                re.search(r"[_/\[]|^--|^\d+$", word)
                or word.isupper()
                or word in ("check", "inspect", "release", "stats", "purge", "schema")
            )
            if acted_on:
                checked += 1
                assert word in english, f"{word!r} (from `{quoted}`)"
    assert checked >= 40
    for address in re.findall(r"127\.0\.0\.1:\d+", chinese):
        assert address in english, address


def test_the_store_accounts_needs_are_the_codes() -> None:
    """The Redis ACL rules the README gives the application's user are the commands the store
    sends and its scripts run, on its key pattern (in both languages); the MySQL GRANTs are
    the privileges the store names in its refusals, on the dedup and sequence tables."""
    from rocketmq_dedup.stores.mysql.privileges import PRIVILEGES
    from rocketmq_dedup.stores.redis.acl import acl_rules

    _, chinese = english_and_chinese()
    rules = acl_rules("MSGDEDUP:*")
    assert f"ACL SETUSER order-service on >password {rules}\n" in section("Quick start (Redis)")
    assert f"`{rules}`" in chinese
    grant = f"GRANT {', '.join(PRIVILEGES)} ON dedup_test.t_rocketmq_dedup"
    mysql = section("Quick start (MySQL / MariaDB)")
    assert f"{grant} TO 'order-service'@'%';" in mysql
    assert f"{grant}_seq TO 'order-service'@'%';" in mysql
    assert f"`{', '.join(PRIVILEGES)}`" in chinese
