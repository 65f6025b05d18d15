#!/usr/bin/env bash
# Creates the project's Python environments (idempotent; rebuilt when their inputs change):
#   .venv          the library with [redis,mysql,postgres] + test/lint tools
#   .venv-classic  + rocketmq-client-python 0.5.0rc2 (bundles librocketmq) for e2e/demo
#   .venv-grpc     + rocketmq-python-client 5.1.2 (5.x gRPC client) for e2e
# The two RocketMQ clients install the same top-level package `rocketmq`, hence two venvs.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

PYTHON="${PYTHON:-python3}"
CLASSIC_CLIENT="rocketmq-client-python==0.5.0rc2"
GRPC_CLIENT="rocketmq-python-client==5.1.2"

# long steps log a progress line every 15 s (with_progress, scripts/lib.sh)
# prometheus: promtool, for the unit tests of the operator kit (rocketmq_dedup/ops/prometheus)
with_progress 15 "installing Debian packages" apt_install libmariadb-dev pkg-config gcc prometheus

install_venv() {  # install_venv DIR PIP-ARGS...
  "$PYTHON" -m venv "$1"
  "$1/bin/pip" install -q --disable-pip-version-check -U pip
  "$1/bin/pip" install -q --disable-pip-version-check "${@:2}"
}

make_venv() {  # make_venv DIR PIP-ARGS...
  local dir=$1; shift
  local stamp
  stamp=$(cat pyproject.toml requirements-dev.txt | sha256sum | cut -c1-16)-$(echo "$*" | sha256sum | cut -c1-8)
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$stamp" ]]; then return; fi
  log "creating $dir"
  rm -rf "$dir"
  with_progress 15 "creating $dir" install_venv "$dir" "$@" || die "could not create $dir"
  echo "$stamp" >"$dir/.stamp"
}

make_venv .venv -e ".[redis,mysql,postgres,cli,prometheus,otel]" -r requirements-dev.txt
make_venv .venv-classic -e ".[redis,mysql,postgres,cli,prometheus,otel]" -r requirements-dev.txt "$CLASSIC_CLIENT"
make_venv .venv-grpc -e ".[redis,mysql,postgres,cli,prometheus,otel]" -r requirements-dev.txt "$GRPC_CLIENT"
