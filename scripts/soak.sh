#!/usr/bin/env bash
# The fault soak (bench/soak): through the real broker, with consumers SIGKILLed, Redis and
# MariaDB killed with -9, the broker restarted; reports lost and doubly applied keys.
#   scripts/soak.sh [--quick] [--json PATH] [--modes plain-redis,plain-mysql,exactly-once] [--seed N]
# It kills and restarts the project's MariaDB and broker: do not run it beside the test suite.
# Servers that are not running are started and, at exit, stopped again; the soak's own Redis
# (AOF, port 16390) is started and stopped by the run itself.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

"$REPO_ROOT/scripts/bootstrap.sh"
install_bench_requirements   # matplotlib for --chart

cleanups=()
cleanup() {
  local i
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do ${cleanups[i]} || true; done
}
trap cleanup EXIT

if ! scripts/services.sh status >/dev/null 2>&1; then
  scripts/services.sh up
  cleanups+=("scripts/services.sh down")
fi
if ! scripts/rocketmq.sh status >/dev/null 2>&1; then
  scripts/rocketmq.sh up
  cleanups+=("scripts/rocketmq.sh down")
fi
for assignment in $(scripts/services.sh env | sed 's/^export //'); do
  name=${assignment%%=*}
  [[ -n ${!name:-} ]] || export "${assignment?}"
done

# the RocketMQ clients' logs go to $STATE_ROOT/soak/home (set per consumer), not to ~/logs
with_client_home soak .venv-classic/bin/python -m bench.soak "$@"
