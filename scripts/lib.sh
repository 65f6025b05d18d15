# Shared helpers for the project's scripts (sourced, not run).
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source it

STATE_ROOT="${ROCKETMQ_DEDUP_STATE_ROOT:-/tmp/rocketmq-dedup}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The RocketMQ server's ports (scripts/rocketmq.sh; the broker also takes BROKER_PORT-2 and
# BROKER_PORT+1), overridable to run a private server beside the project's (the soak on a shared
# machine). The clients find it through ROCKETMQ_NAMESRV and ROCKETMQ_PROXY (`services.sh env`).
ROCKETMQ_NAMESRV_PORT="${ROCKETMQ_DEDUP_NAMESRV_PORT:-9876}"
ROCKETMQ_GRPC_PORT="${ROCKETMQ_DEDUP_GRPC_PORT:-8081}"
ROCKETMQ_REMOTING_PORT="${ROCKETMQ_DEDUP_REMOTING_PORT:-8080}"
ROCKETMQ_BROKER_PORT="${ROCKETMQ_DEDUP_BROKER_PORT:-10911}"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# wait_until SECONDS DESCRIPTION CMD...: poll CMD every 0.2 s until it succeeds or time runs out.
wait_until() {
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then die "timed out after ${seconds}s waiting for $what"; fi
    sleep 0.2
  done
}

# info_only WORDS ARG...: whether ARG... holds -h, --help or one of WORDS (e.g. "--list"): the
# caller then prints and exits without bootstrapping or starting a server.
info_only() {
  local words=" -h --help $1 " arg
  shift
  for arg in "$@"; do [[ $words == *" $arg "* ]] && return 0; done
  return 1
}

# info_python: the Python for info_only runs: .venv-classic's once bootstrapped, else python3 (the
# harnesses' --help and --list import only the standard library and the repository).
info_python() {
  if [[ -x $REPO_ROOT/.venv-classic/bin/python ]]; then echo "$REPO_ROOT/.venv-classic/bin/python"
  else echo python3; fi
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pid PIDFILE NAME [GRACE] [SIGNAL]: send SIGNAL (default TERM) to the process, wait up to
# GRACE seconds (default 30), then KILL. Removes the pid file.
stop_pid() {
  local pidfile=$1 name=$2 grace=${3:-30} signal=${4:-TERM} pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -"$signal" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + grace))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored $signal; killing"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}

# apt_install PKG...: install the Debian packages that are missing (apt-get update once).
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# with_progress EVERY WHAT CMD...: run CMD (a command or a function) and, while it runs, log
# "WHAT: Ns so far" every EVERY seconds, so that a long step is never a silent minute. Returns
# CMD's exit status.
with_progress() {
  local every=$1 what=$2; shift 2
  local start=$SECONDS next=$((SECONDS + every)) pid rc=0
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= next)); then
      log "$what: $((SECONDS - start))s so far"
      next=$((next + every))
    fi
    sleep 0.2
  done
  wait "$pid" || rc=$?
  return "$rc"
}

# with_client_home NAME CMD...: run CMD with HOME=$STATE_ROOT/NAME-home (created). The RocketMQ
# Python clients write their logs under $HOME, with no setting of their own for it: the classic
# client (librocketmq) to ~/logs/rocketmq-cpp, the 5.x client to ~/logs/rocketmq_python (its
# log_config.py expands ~ at import). This keeps them in the state directory, out of the real
# home; rocketmq.sh's jar cache stays where it was (ROCKETMQ_DEDUP_CACHE).
with_client_home() {
  local home="$STATE_ROOT/$1-home" cache="${ROCKETMQ_DEDUP_CACHE:-$HOME/.cache/rocketmq-dedup}"
  shift
  mkdir -p "$home"
  ROCKETMQ_DEDUP_CACHE="$cache" HOME="$home" "$@"
}

# SERVER_CPUS: the command prefix that runs a server on the servers' CPUs: DEDUP_SERVER_CPUS (a
# taskset CPU list), by default the last CPU when there are two or more; "all" leaves the
# scheduler free. The bench pins the consumer to CPU 0, so every round trip to a server crosses
# CPUs, as it would cross a network. Left free, a server thread sometimes lands on the consumer's
# CPU and sometimes not, and the same code's throughput swings 1.6x between repetitions
# (BENCHMARKS.md, "Where things run").
SERVER_CPUS=()
_server_cpus="${DEDUP_SERVER_CPUS:-}"
if [[ -z $_server_cpus ]]; then
  _server_cpus=all
  if (($(nproc) >= 2)); then _server_cpus=$(($(nproc) - 1)); fi
fi
if [[ $_server_cpus != all ]] && command -v taskset >/dev/null; then
  SERVER_CPUS=(taskset -c "$_server_cpus")
fi

# The bench-only packages (requirements-bench.txt: matplotlib for the charts, the compared
# libraries) in .venv-classic, reinstalled when that file or the venv itself changed.
install_bench_requirements() {
  local stamp
  stamp=$(cat requirements-bench.txt .venv-classic/.stamp | sha256sum | cut -c1-16)
  if [[ -f .venv-classic/.bench-stamp && $(cat .venv-classic/.bench-stamp) == "$stamp" ]]; then
    return
  fi
  log "installing requirements-bench.txt into .venv-classic"
  with_progress 15 "installing requirements-bench.txt" \
    .venv-classic/bin/pip install -q --disable-pip-version-check -r requirements-bench.txt
  echo "$stamp" >.venv-classic/.bench-stamp
}

# export_server_env: export the servers' addresses (`scripts/services.sh env`, as the tests get
# them), each unless the caller has set it (a private stack's ports win).
export_server_env() {
  local assignment name
  for assignment in $(scripts/services.sh env | sed 's/^export //'); do
    name=${assignment%%=*}
    [[ -n ${!name:-} ]] || export "${assignment?}"
  done
}

# At exit, undo what this script started: `cleanups+=("scripts/x.sh down")` after starting
# something, `trap run_cleanups EXIT` once; run last-first, a failing one never stops the rest.
cleanups=()
run_cleanups() {
  local i
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do ${cleanups[i]} || true; done
}
