"""The operator kit (rocketmq_dedup/ops/): the Prometheus rules pass ``promtool check rules`` and
their unit tests (``promtool test rules``), the Grafana dashboard's queries are valid PromQL,
and every metric and label the rules and the dashboard use is one PrometheusMetrics exports. No
server: promtool works on files (Debian's prometheus package, installed by
scripts/bootstrap.sh). The queries are evaluated against a real consumer by
tests/e2e/test_e2e_operations.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest
from prometheus_client import CollectorRegistry

from rocketmq_dedup import DedupConfig, MemoryDedupStore
from rocketmq_dedup.metrics import PrometheusMetrics
from rocketmq_dedup.testing import ClassicMessage, deliver
from tests.unit.test_readme import README, anchor, english_and_chinese
from tests.unit.test_testing import Recording

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rocketmq_dedup" / "ops" / "prometheus" / "rocketmq-dedup.rules.yml"
RULE_TESTS = REPO / "rocketmq_dedup" / "ops" / "prometheus" / "rocketmq-dedup.rules.test.yml"
DASHBOARD = REPO / "rocketmq_dedup" / "ops" / "grafana" / "rocketmq-dedup-dashboard.json"
#: What Grafana puts in place of the dashboard's variables (the e2e test does the same).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$app": ".*"}
METRIC = re.compile(r"\b(rocketmq_dedup_\w+)")
GROUPING = re.compile(r"\bby \(([^)]*)\)")


def promtool(*args: str, cwd: Path = REPO) -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: scripts/bootstrap.sh installs Debian's prometheus")
    result = subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def dashboard_queries() -> List[str]:
    """Every target's expression, with the variables put in as Grafana does."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            queries.append(expr)
    return queries


def rule_expressions() -> List[str]:
    """The ``expr:`` of every rule (block scalars: the indented lines after ``expr: |``)."""
    exprs: List[str] = []
    lines = RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)expr: (.*)$", line)
        if not match:
            continue
        if match.group(2) != "|":
            exprs.append(match.group(2))
            continue
        indent, block = len(match.group(1)), []
        for follow in lines[i + 1 :]:
            if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                break
            block.append(follow.strip())
        exprs.append(" ".join(block))
    return exprs


def exported() -> Dict[str, Set[str]]:
    """The samples PrometheusMetrics exports after one message, by name: their labels."""
    registry = CollectorRegistry()
    config = DedupConfig.enable_dedup_consume_config(
        "app", MemoryDedupStore(), metrics=PrometheusMetrics(registry)
    )
    deliver(Recording(config), ClassicMessage("m1", keys=b"k"), times=2)
    found: Dict[str, Set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    """8 rules, each with at least one firing and one quiet case in the unit tests."""
    assert "SUCCESS: 8 rules found" in promtool("check", "rules", str(RULES))
    assert "SUCCESS" in promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    alerts = re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.MULTILINE)
    tested = RULE_TESTS.read_text()
    for alert in alerts:
        assert re.search(rf"alertname: {alert}\n\s*exp_alerts:\n\s*- exp_labels", tested), alert
        assert re.search(rf"alertname: {alert}(?:,\s*|\n\s*)exp_alerts: \[\]", tested), alert


def test_the_promtool_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """The same unit tests fail on rules whose payload-mismatch alert never fires."""
    broken = RULES.read_text().replace(
        'outcome="payload_mismatch"}[10m])\n          ) > 0',
        ('outcome="payload_mismatch"}[10m])\n          ) > 100'),
    )
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    result = subprocess.run(
        ["promtool", "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "RocketmqDedupPayloadMismatch" in result.stdout + result.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel's queries (as recording rules of a scratch file)."""
    queries = dashboard_queries()
    assert len(queries) >= 8
    rules = "groups:\n  - name: dashboard\n    rules:\n" + "".join(
        f"      - record: dashboard:query_{i}\n        expr: {json.dumps(q)}\n"
        for i, q in enumerate(queries)
    )
    (tmp_path / "dashboard.yml").write_text(rules)
    assert f"SUCCESS: {len(queries)} rules found" in promtool(
        "check", "rules", str(tmp_path / "dashboard.yml")
    )


def test_the_dashboard_has_the_panels_an_operator_needs() -> None:
    """Outcomes, duplicate ratio, store latency and errors, leases, handler time; every panel
    queries through the data source variable and filters on $app."""
    dashboard: Dict[str, Any] = json.loads(DASHBOARD.read_text())
    titles = [panel["title"] for panel in dashboard["panels"]]
    for needed in (
        "Outcomes",
        "Duplicate ratio",
        "Store latency",
        "Store errors",
        "Leases",
        "Handler time",
    ):
        assert any(title.startswith(needed) for title in titles), needed
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "app"}
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'app=~"$app"' in target["expr"], panel["title"]


def test_the_rules_and_the_dashboard_use_only_what_the_library_exports() -> None:
    """Each metric name is a sample PrometheusMetrics exports, and each label grouped by is
    one it carries: a renamed metric or label fails here, not in production."""
    samples = exported()
    for expr in rule_expressions() + dashboard_queries():
        names = METRIC.findall(expr)
        assert names, expr
        labels = set(samples[names[0]]) if names[0] in samples else set()
        for name in names:
            assert name in samples, f"{name} is not exported ({expr})"
        for group in GROUPING.findall(expr):
            grouped = {label.strip() for label in group.split(",")} - {"le"}
            assert grouped <= labels, f"{grouped - labels} not on {names[0]} ({expr})"
    assert len(rule_expressions()) == 8


def alerts() -> List[Tuple[str, str, str]]:
    """(alert, severity, runbook_url) of every rule, in order."""
    found = []
    for block in re.split(r"^\s*- alert: ", RULES.read_text(), flags=re.MULTILINE)[1:]:
        name = block.split("\n", 1)[0].strip()
        [severity] = re.findall(r"^\s+severity: (\w+)$", block, re.MULTILINE)
        [runbook] = re.findall(r"^\s+runbook_url: (\S+)$", block, re.MULTILINE)
        found.append((name, severity, runbook))
    return found


def test_every_alert_links_its_runbook_in_the_readme() -> None:
    """Each alert's runbook_url is the README on the project's repository address (pyproject's
    [project.urls]) with the anchor of a heading named after the alert, and that section says
    what it means, what to check and what to do; the Chinese part names every alert."""
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    readme_url = f"{urls['Repository']}/blob/main/README.md"
    text = README.read_text()
    headings = {anchor(h): h for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    _, chinese = english_and_chinese()
    found = alerts()
    assert len(found) == 8
    for name, _, runbook in found:
        assert runbook == f"{readme_url}#{name.lower()}", runbook
        assert headings.get(name.lower()) == name, f"no README heading {name!r}"
        start = text.index(f"\n### {name}\n")
        end = text.find("\n#", start + 1)
        runbook_text = text[start:end]
        for part in ("**What it means**", "**What to check**", "**What to do**"):
            assert part in runbook_text, (name, part)
        assert f"`{name}`" in chinese, name


def test_only_the_store_outage_pages() -> None:
    """One critical alert, RocketmqDedupStoreUnavailable (sustained, one per application): a
    store outage pages once, not under two names; every other alert is a warning."""
    severities = {name: severity for name, severity, _ in alerts()}
    assert {n for n, s in severities.items() if s == "critical"} == {
        "RocketmqDedupStoreUnavailable"
    }
    assert set(severities.values()) == {"critical", "warning"}
