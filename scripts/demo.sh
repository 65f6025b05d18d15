#!/usr/bin/env bash
# The demo, end to end on a fresh machine: installs what it needs, starts Redis, MariaDB and a
# RocketMQ broker on 127.0.0.1, runs the sample consumer (samples/demo.py) against them with
# duplicate messages and prints a report; then the exactly-once order flow
# (samples/orders_exactly_once.py: steps sent out of order, with duplicates) and its report;
# and stops what it started.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

stop_redis=0 stop_mysql=0 stop_rocketmq=0
cleanup() {
  local rc=$?
  if ((stop_rocketmq)); then scripts/rocketmq.sh down || true; fi
  if ((stop_mysql)); then scripts/services.sh down mysql || true; fi
  if ((stop_redis)); then scripts/services.sh down redis || true; fi
  exit $rc
}
trap cleanup EXIT

scripts/bootstrap.sh
pid_alive "$STATE_ROOT/services/redis.pid" || stop_redis=1
pid_alive "$STATE_ROOT/services/mariadb.pid" || stop_mysql=1
scripts/services.sh up redis mysql
scripts/rocketmq.sh status >/dev/null 2>&1 || stop_rocketmq=1
scripts/rocketmq.sh up
eval "$(scripts/services.sh env)"
with_client_home demo .venv-classic/bin/python -m samples.demo "$@"  # client logs: $STATE_ROOT/demo-home
log "exactly-once: 5 orders, their steps sent as 3, 1, 2, each twice"
with_client_home demo .venv-classic/bin/python -m samples.orders_exactly_once --orders 5
