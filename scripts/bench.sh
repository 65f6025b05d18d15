#!/usr/bin/env bash
# Run the benchmark harness (bench/): python -m bench in .venv-classic with the bench-only
# requirements, against the project's Redis, MariaDB and PostgreSQL (and the RocketMQ broker for
# e2e cases).
#   scripts/bench.sh [--quick] [--json PATH] [--chart PATH] [--cases NAMES] [--reps N] [--check]
#   scripts/bench.sh --help            all options (python -m bench --help)
# Servers that are not running are started and, at exit, stopped again; servers that were
# already running are used and left alone. --help and --list start nothing (no bootstrap either).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

if info_only --list "$@"; then exec "$(info_python)" -m bench "$@"; fi

PY=.venv-classic/bin/python

"$REPO_ROOT/scripts/bootstrap.sh"

install_bench_requirements

needs=$("$PY" -m bench --services "$@")   # e.g. "redis mysql broker"; exits non-zero on bad args

trap run_cleanups EXIT

if [[ $needs == *redis* || $needs == *mysql* || $needs == *postgres* ]]; then
  if scripts/services.sh status >/dev/null 2>&1; then
    log "services already running; leaving them running"
  elif scripts/services.sh status 2>/dev/null | grep -q ': running'; then
    log "some services are running: starting the rest, stopping none at exit"
    scripts/services.sh up
  else
    scripts/services.sh up
    cleanups+=("scripts/services.sh down")
  fi
fi

if [[ $needs == *broker* ]]; then
  if scripts/rocketmq.sh status >/dev/null 2>&1; then
    log "RocketMQ already running; leaving it running"
  else
    scripts/rocketmq.sh up
    cleanups+=("scripts/rocketmq.sh down")
  fi
fi

export_server_env

# the RocketMQ client's logs (e2e cases) go to $STATE_ROOT/bench-home, not to ~/logs
with_client_home bench "$PY" -m bench "$@"
