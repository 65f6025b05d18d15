"""A misconfigured Redis store: an ACL user that may not write the records (reads only; all
commands but on other keys; the store's commands but not its scripts'), a read-only replica.
The start-up check refuses it naming the ACL rule or the replica; at run time
(``check_store=False``) every delivery is answered RECONSUME_LATER and no handler runs without
dedup, whatever ``store_failure_policy`` says. The ACL rules the README lists are enough; a
``maxmemory-policy`` that evicts keys is a WARNING at start-up and a ``warn`` line of
``rocketmq-dedup check``. ACL users are made on the shared Redis (unique names, deleted after);
the replica and the eviction policies are private redis-servers."""

from __future__ import annotations

import logging
import uuid
from typing import Callable, Iterator, List

import pytest
import redis

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupConfigError
from rocketmq_dedup.stores.redis.acl import acl_rules
from rocketmq_dedup.testing import ClassicMessage, deliver
from tests.integration.misconfigured import Counting, assert_never_run_without_dedup
from tests.integration.private_servers import PrivateRedis, free_port
from tests.integration.test_cli import run
from tests.support import REDIS_URL

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
PASSWORD = "pw-misconfig"
#: What the README tells users to give the application's user (tests/unit/test_readme.py).
README_RULES = acl_rules("MSGDEDUP:*")


@pytest.fixture
def acl_user(redis_client: redis.Redis) -> Iterator[Callable[..., redis.Redis]]:
    """``acl_user(rule, ...)``: a client of a new user of the shared Redis with those ACL
    rules; the user is deleted after the test."""
    users: List[str] = []
    clients: List[redis.Redis] = []

    def make(*rules: str) -> redis.Redis:
        user = f"mc-{uuid.uuid4().hex[:10]}"
        redis_client.execute_command("ACL", "SETUSER", user, "on", f">{PASSWORD}", *rules)
        users.append(user)
        client = redis.Redis.from_url(REDIS_URL, username=user, password=PASSWORD)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
    for user in users:
        redis_client.acl_deluser(user)


@pytest.fixture
def private_redis() -> Iterator[Callable[..., PrivateRedis]]:
    """``private_redis(option, ...)``: a redis-server of this test, stopped after it."""
    servers: List[PrivateRedis] = []

    def start(*options: str) -> PrivateRedis:
        servers.append(PrivateRedis(*options))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def app() -> str:
    return f"app-{uuid.uuid4().hex[:12]}"


def user_of(client: redis.Redis) -> str:
    return str(client.connection_pool.connection_kwargs["username"])


def test_a_read_only_acl_user_is_refused_at_start_naming_the_command(
    acl_user: Callable[..., redis.Redis],
) -> None:
    """A user allowed only reads (+get +ping ...): the start-up check's probe claim is refused,
    and the error names the command and the rules the store needs (before: PING passed)."""
    client = acl_user("~*", "+get", "+ping", "+pttl", "+info")
    with pytest.raises(DedupConfigError) as caught:
        DedupConfig.enable_dedup_consume_config(app(), client)
    message = str(caught.value)
    assert f"the Redis user '{user_of(client)}' may not run 'set' (ACL)" in message
    assert f"the store needs {README_RULES}" in message


def test_a_user_allowed_other_keys_only_is_refused_at_start_naming_the_key_pattern(
    acl_user: Callable[..., redis.Redis],
) -> None:
    """A user allowed every command on other keys (~other:*): refused, naming the key pattern
    of the records."""
    client = acl_user("~other:*", "+@all")
    with pytest.raises(DedupConfigError) as caught:
        DedupConfig.enable_dedup_consume_config(app(), client)
    assert f"'{user_of(client)}' may not use the dedup keys (ACL)" in str(caught.value)
    assert "~MSGDEDUP:*" in str(caught.value)


def test_a_user_whose_scripts_may_not_run_their_commands_is_refused_naming_them(
    acl_user: Callable[..., redis.Redis],
) -> None:
    """The store's commands without those its Lua scripts run (del, pexpire): refused by the
    probe's renewal, naming the scripts' commands."""
    client = acl_user("~MSGDEDUP:*", "+ping", "+get", "+set", "+pttl", "+evalsha", "+script|load")
    with pytest.raises(DedupConfigError, match="may not run a command of the store's Lua scripts"):
        DedupConfig.enable_dedup_consume_config(app(), client)


@pytest.mark.parametrize(
    "rules",
    [("~*", "+get", "+ping", "+pttl", "+info"), ("~other:*", "+@all")],
    ids=["reads-only", "other-keys"],
)
def test_an_acl_user_that_may_not_write_never_runs_a_handler_without_dedup(
    acl_user: Callable[..., redis.Redis], rules: List[str], caplog: pytest.LogCaptureFixture
) -> None:
    """check_store=False: NOPERM is RECONSUME_LATER, logged as a refusal naming the rule, never
    an outage (before: "dedup store unavailable", the handler ran in every delivery)."""
    client = acl_user(*rules)
    errors = assert_never_run_without_dedup(client, caplog)
    assert f"the Redis user '{user_of(client)}' may not" in errors


def test_the_readme_acl_rules_are_enough(
    acl_user: Callable[..., redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    """A user with exactly the README's rules: the start-up check passes (its probe keys fit
    ~MSGDEDUP:*), it says at INFO that it may not read maxmemory-policy, and the store works
    (a key once in three deliveries, a batch, concurrent copies)."""
    client = acl_user(*README_RULES.split())
    with caplog.at_level(logging.INFO, logger="rocketmq_dedup"):
        config = DedupConfig.enable_dedup_consume_config(app(), client)
    assert "could not read maxmemory-policy" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    listener = Counting(config)
    key = uuid.uuid4().hex
    assert deliver(listener, ClassicMessage("m1", uniq_key=key), times=3).handler_runs == 1
    batch = [ClassicMessage(f"b{n}", uniq_key=f"{key}-{n}") for n in range(3)]
    assert listener.consume_message(batch).status is SUCCESS
    together = deliver(
        listener, ClassicMessage("c", uniq_key=f"{key}-c"), times=3, concurrently=True
    )
    assert together.handler_runs == 1
    assert listener.runs == 5
    listener.close()


def test_a_read_only_replica_is_refused_at_start_and_never_runs_a_handler_without_dedup(
    private_redis: Callable[..., PrivateRedis], caplog: pytest.LogCaptureFixture
) -> None:
    """A client pointed at a replica (its master away: it serves reads, refuses writes with
    READONLY): refused at start naming the replica, and RECONSUME_LATER at run time (before:
    it passed PING and ran every delivery without dedup)."""
    replica = private_redis("--replicaof", "127.0.0.1", str(free_port()))
    with pytest.raises(
        DedupConfigError, match=f"127.0.0.1:{replica.port}/0 is a read-only replica"
    ):
        DedupConfig.enable_dedup_consume_config(app(), replica.client())
    errors = assert_never_run_without_dedup(replica.client(), caplog)
    assert "is a read-only replica: point the client at the primary" in errors


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_policy_is_a_warning_at_start_and_in_check(
    private_redis: Callable[..., PrivateRedis], policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """maxmemory-policy allkeys-* or volatile-* (every record has a TTL) may evict records:
    a WARNING naming it at start-up and a warn line of rocketmq-dedup check (exit 0)."""
    server = private_redis("--maxmemory-policy", policy, "--maxmemory", "64mb")
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        DedupConfig.enable_dedup_consume_config(app(), server.client())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"maxmemory-policy {policy} evicts keys" in warnings[0]
    checked = run("check", "--redis", server.url)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"warn eviction: maxmemory-policy {policy} evicts keys" in checked.stdout
    assert "ok   writes: claimed, renewed, read and released probe records" in checked.stdout


def test_noeviction_is_no_warning_and_check_shows_the_policy(
    private_redis: Callable[..., PrivateRedis], caplog: pytest.LogCaptureFixture
) -> None:
    """noeviction (Redis's default): nothing logged; check shows the policy as ok."""
    server = private_redis()
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        DedupConfig.enable_dedup_consume_config(app(), server.client())
    assert not caplog.records
    checked = run("check", "--redis", server.url)
    assert checked.returncode == 0 and "ok   eviction: maxmemory-policy noeviction" in (
        checked.stdout
    )


def test_check_names_the_acl_rule_and_the_replica(
    acl_user: Callable[..., redis.Redis], private_redis: Callable[..., PrivateRedis]
) -> None:
    """rocketmq-dedup check as a user that may not write the records, and on a replica: a
    FAIL line naming the ACL rule or the replica (exit 1); with --app, in that key space."""
    client = acl_user("~other:*", "+@all")
    url = REDIS_URL.replace("redis://", f"redis://{user_of(client)}:{PASSWORD}@")
    refused = run("check", "--redis", url, "--app", "orders")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"FAIL writes: the Redis user '{user_of(client)}' may not use the dedup keys" in (
        refused.stdout
    )
    replica = private_redis("--replicaof", "127.0.0.1", str(free_port()))
    on_replica = run("check", "--redis", replica.url)
    assert on_replica.returncode == 1 and "is a read-only replica" in on_replica.stdout
