#!/usr/bin/env bash
# The demo, end to end on a fresh machine: installs what it needs, starts Redis and a RocketMQ
# broker on 127.0.0.1, runs the sample consumer (samples/demo.py) against them with duplicate
# messages, prints a report, and stops what it started.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

stop_redis=0 stop_rocketmq=0
cleanup() {
  local rc=$?
  ((stop_rocketmq)) && scripts/rocketmq.sh down || true
  ((stop_redis)) && scripts/services.sh down redis || true
  exit $rc
}
trap cleanup EXIT

scripts/bootstrap.sh
pid_alive "$STATE_ROOT/services/redis.pid" || stop_redis=1
scripts/services.sh up redis
scripts/rocketmq.sh status >/dev/null 2>&1 || stop_rocketmq=1
scripts/rocketmq.sh up
eval "$(scripts/services.sh env)"
HOME_DIR="$STATE_ROOT/demo-home"; mkdir -p "$HOME_DIR"  # the client writes its logs under $HOME
HOME="$HOME_DIR" .venv-classic/bin/python -m samples.demo "$@"
