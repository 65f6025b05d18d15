#!/usr/bin/env bash
# The fault soak (bench/soak): through the real broker, with consumers SIGKILLed, Redis and
# MariaDB killed with -9, the broker restarted; reports lost, delayed and doubly applied keys of
# each mode beside a control without dedup (SOAK.md).
#   scripts/soak.sh [--quick] [--json PATH] [--chart PATH] [--seed N]
#                   [--modes plain-redis,plain-mysql,exactly-once,no-dedup[,exactly-once-postgres]
#                            [,MODE:VARIANT]]
#                   [--options K=V,...] [--variant NAME=K=V,...] [--consumers KINDS]
#   scripts/soak.sh --help            all options (python -m bench.soak --help); starts nothing
# It kills and restarts the project's MariaDB and broker: do not run it beside the test suite,
# or give it a private stack: ROCKETMQ_DEDUP_STATE_ROOT, DEDUP_MYSQL_PORT, SOAK_REDIS_PORT,
# ROCKETMQ_DEDUP_STORE and the ROCKETMQ_DEDUP_*_PORT variables of scripts/rocketmq.sh.
# MariaDB and the broker, if not running, are started and, at exit, stopped again; the soak's
# own Redis (AOF, port SOAK_REDIS_PORT, default 16390) is started and stopped by the run itself,
# and so is its own PostgreSQL (a cluster under the state root, a free port) when the
# exactly-once-postgres mode is named.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

if info_only "" "$@"; then exec "$(info_python)" -m bench.soak "$@"; fi

"$REPO_ROOT/scripts/bootstrap.sh"
install_bench_requirements   # matplotlib for --chart

trap run_cleanups EXIT

if ! scripts/services.sh status mysql >/dev/null 2>&1; then   # the soak needs MariaDB only
  scripts/services.sh up mysql
  cleanups+=("scripts/services.sh down mysql")
fi
if ! scripts/rocketmq.sh status >/dev/null 2>&1; then
  scripts/rocketmq.sh up
  cleanups+=("scripts/rocketmq.sh down")
fi
export_server_env

# the RocketMQ clients' logs go to $STATE_ROOT/soak/home (set per consumer), not to ~/logs
with_client_home soak .venv-classic/bin/python -m bench.soak "$@"
