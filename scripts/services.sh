#!/usr/bin/env bash
# Redis, MariaDB and PostgreSQL for tests, benchmarks and the demo: installed from Debian
# packages, bound to 127.0.0.1, state under $ROCKETMQ_DEDUP_STATE_ROOT/services, stopped by PID,
# run on the servers' CPUs (scripts/lib.sh, SERVER_CPUS: the last CPU unless DEDUP_SERVER_CPUS
# says otherwise).
#   scripts/services.sh up|down [redis|cluster|mysql|postgres|sentinel|prometheus ...]   (no names: all)
#   scripts/services.sh status [redis|cluster|mysql|postgres|sentinel|prometheus ...]   (exit 0 if those run)
#   scripts/services.sh restart-mysql|restart-sentinel-master|env
# `up NAME` starts only the services named and leaves running ones alone (e.g. `up postgres` on a
# stack started before PostgreSQL was part of it).
# env prints the servers' addresses as the tests read them, RocketMQ's too (ROCKETMQ_NAMESRV,
# ROCKETMQ_PROXY, from the ROCKETMQ_DEDUP_*_PORT variables of scripts/rocketmq.sh).
# Ports: DEDUP_REDIS_PORT, DEDUP_MYSQL_PORT, DEDUP_PG_PORT, DEDUP_SENTINEL_MASTER_PORT,
# DEDUP_SENTINEL_PORT, DEDUP_PROMETHEUS_PORT (the cluster's 17000-17002 are fixed).
# Redis: 127.0.0.1:16379.  Redis Cluster: 127.0.0.1:17000-17002 (3 masters).  MariaDB: 127.0.0.1:13306, database dedup_test, user dedup/dedup.
# PostgreSQL: 127.0.0.1:15432, database dedup_test, user dedup/dedup; its own cluster (initdb) under
# $STATE/postgres, run as the OS user `postgres` when this script runs as root (the server refuses
# root), superuser `postgres` through the Unix socket in $STATE/postgres/run only.
# Redis Sentinel: a master on 127.0.0.1:16380 watched by one sentinel on 127.0.0.1:26379 (service mymaster).
# Prometheus: 127.0.0.1:19090, scraping every second the targets whose file_sd files tests drop in
# $STATE/prometheus/targets/*.json, evaluating the rule files in $STATE/prometheus/rules/*.yml
# (POST /-/reload after a change: tests copy rocketmq_dedup/ops/prometheus/*.rules.yml there).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE="$STATE_ROOT/services"
REDIS_PORT="${DEDUP_REDIS_PORT:-16379}"
MYSQL_PORT="${DEDUP_MYSQL_PORT:-13306}"
MYSQL_SOCK="$STATE/mariadb.sock"
SENTINEL_MASTER_PORT="${DEDUP_SENTINEL_MASTER_PORT:-16380}"
SENTINEL_PORT="${DEDUP_SENTINEL_PORT:-26379}"
SENTINEL_SERVICE=mymaster
PROMETHEUS_PORT="${DEDUP_PROMETHEUS_PORT:-19090}"
PG_PORT="${DEDUP_PG_PORT:-15432}"
PG_HOME="$STATE/postgres"  # owned by the server's OS user: data/, run/ (socket), postgres.log
SERVICES="redis cluster mysql postgres sentinel prometheus"

print_env() {
  cat <<ENV
export DEDUP_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export DEDUP_REDIS_CLUSTER_URL=redis://127.0.0.1:${CLUSTER_PORTS[0]}/0
export DEDUP_MYSQL_HOST=127.0.0.1 DEDUP_MYSQL_PORT=$MYSQL_PORT
export DEDUP_MYSQL_USER=dedup DEDUP_MYSQL_PASSWORD=dedup DEDUP_MYSQL_DATABASE=dedup_test
export DEDUP_PG_DSN=postgresql://dedup:dedup@127.0.0.1:$PG_PORT/dedup_test DEDUP_PG_BINDIR=$(pg_bindir)
export DEDUP_REDIS_SENTINEL=127.0.0.1:$SENTINEL_PORT DEDUP_REDIS_SENTINEL_MASTER=$SENTINEL_SERVICE
export DEDUP_PROMETHEUS_URL=http://127.0.0.1:$PROMETHEUS_PORT DEDUP_PROMETHEUS_DIR=$STATE/prometheus
export ROCKETMQ_NAMESRV=127.0.0.1:$ROCKETMQ_NAMESRV_PORT ROCKETMQ_PROXY=127.0.0.1:$ROCKETMQ_GRPC_PORT
ENV
}

redis_up() {
  if pid_alive "$STATE/redis.pid"; then log "redis already running"; return; fi
  mkdir -p "$STATE/redis"
  "${SERVER_CPUS[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes \
    --pidfile "$STATE/redis.pid" --dir "$STATE/redis" --logfile "$STATE/redis.log" \
    --save "" --appendonly no
  wait_until 20 "redis" redis-cli -p "$REDIS_PORT" ping
  log "redis up on 127.0.0.1:$REDIS_PORT (pid $(cat "$STATE/redis.pid"))"
}

CLUSTER_PORTS=(17000 17001 17002)

cluster_up() {
  if pid_alive "$STATE/redis-cluster-${CLUSTER_PORTS[0]}.pid"; then log "redis cluster already running"; return; fi
  local nodes=()
  for port in "${CLUSTER_PORTS[@]}"; do
    rm -rf "$STATE/redis-cluster-$port"; mkdir -p "$STATE/redis-cluster-$port"
    "${SERVER_CPUS[@]}" redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --cluster-enabled yes \
      --cluster-config-file nodes.conf --dir "$STATE/redis-cluster-$port" \
      --pidfile "$STATE/redis-cluster-$port.pid" --logfile "$STATE/redis-cluster-$port.log" \
      --save "" --appendonly no
    nodes+=("127.0.0.1:$port")
  done
  for port in "${CLUSTER_PORTS[@]}"; do wait_until 20 "redis cluster node $port" redis-cli -p "$port" ping; done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$STATE/redis-cluster-create.log" 2>&1 \
    || die "redis cluster create failed; see $STATE/redis-cluster-create.log"
  cluster_ok() { redis-cli -p "${CLUSTER_PORTS[0]}" cluster info | grep -q 'cluster_state:ok'; }
  wait_until 30 "redis cluster state ok" cluster_ok
  log "redis cluster up on 127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[2]}"
}

# The master Sentinel watches; started with the same arguments by up and restart-sentinel-master.
sentinel_master_start() {
  mkdir -p "$STATE/sentinel-master"
  "${SERVER_CPUS[@]}" redis-server --port "$SENTINEL_MASTER_PORT" --bind 127.0.0.1 --daemonize yes \
    --pidfile "$STATE/sentinel-master.pid" --dir "$STATE/sentinel-master" \
    --logfile "$STATE/sentinel-master.log" --save "" --appendonly no
  wait_until 20 "sentinel master" redis-cli -p "$SENTINEL_MASTER_PORT" ping
}

sentinel_up() {
  if pid_alive "$STATE/sentinel-master.pid"; then log "sentinel master already running"
  else sentinel_master_start; fi
  if pid_alive "$STATE/sentinel.pid"; then log "sentinel already running"; return; fi
  # Sentinel rewrites its config file (the state it learns), so it lives in the state dir and
  # is written afresh on every start.
  mkdir -p "$STATE/sentinel"
  cat >"$STATE/sentinel/sentinel.conf" <<CONF
port $SENTINEL_PORT
bind 127.0.0.1
daemonize yes
pidfile $STATE/sentinel.pid
logfile $STATE/sentinel.log
dir $STATE/sentinel
sentinel monitor $SENTINEL_SERVICE 127.0.0.1 $SENTINEL_MASTER_PORT 1
sentinel down-after-milliseconds $SENTINEL_SERVICE 60000
sentinel failover-timeout $SENTINEL_SERVICE 180000
CONF
  "${SERVER_CPUS[@]}" redis-server "$STATE/sentinel/sentinel.conf" --sentinel
  sentinel_ok() {
    redis-cli -p "$SENTINEL_PORT" sentinel get-master-addr-by-name "$SENTINEL_SERVICE" \
      | grep -q "^$SENTINEL_MASTER_PORT\$"
  }
  wait_until 20 "sentinel" sentinel_ok
  log "sentinel up on 127.0.0.1:$SENTINEL_PORT (pid $(cat "$STATE/sentinel.pid")), master $SENTINEL_SERVICE on 127.0.0.1:$SENTINEL_MASTER_PORT (pid $(cat "$STATE/sentinel-master.pid"))"
}

mysql_start() {
  # setsid: its own session, so it outlives the process group of whoever (re)started it
  nohup setsid "${SERVER_CPUS[@]}" mariadbd --no-defaults --user=root --datadir="$STATE/mariadb" \
    --bind-address=127.0.0.1 --port="$MYSQL_PORT" --socket="$MYSQL_SOCK" \
    --pid-file="$STATE/mariadb.pid" --log-error="$STATE/mariadb.err" --skip-name-resolve \
    --innodb-buffer-pool-size=128M --innodb-log-file-size=48M \
    --innodb-flush-log-at-trx-commit=2 --max-connections=500 >/dev/null 2>&1 &
  echo $! >"$STATE/mariadb.pid"
  wait_until 60 "mariadb" mariadb-admin --socket="$MYSQL_SOCK" -uroot ping
}

mysql_up() {
  if pid_alive "$STATE/mariadb.pid"; then log "mariadb already running"; return; fi
  if [[ ! -d $STATE/mariadb/mysql ]]; then
    mkdir -p "$STATE/mariadb"
    mariadb-install-db --no-defaults --user=root --datadir="$STATE/mariadb" \
      --auth-root-authentication-method=socket --skip-test-db >"$STATE/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed; see $STATE/mariadb-install.log"
  fi
  mysql_start
  mariadb --socket="$MYSQL_SOCK" -uroot <<'SQL'
CREATE DATABASE IF NOT EXISTS dedup_test CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER IF NOT EXISTS 'dedup'@'127.0.0.1' IDENTIFIED BY 'dedup';
CREATE USER IF NOT EXISTS 'dedup'@'localhost' IDENTIFIED BY 'dedup';
GRANT ALL PRIVILEGES ON dedup_test.* TO 'dedup'@'127.0.0.1';
GRANT ALL PRIVILEGES ON dedup_test.* TO 'dedup'@'localhost';
SQL
  log "mariadb up on 127.0.0.1:$MYSQL_PORT (pid $(cat "$STATE/mariadb.pid"))"
}

# The newest PostgreSQL server's binaries (Debian keeps them off PATH, by major version).
pg_bindir() { find /usr/lib/postgresql -path '*/bin/pg_ctl' 2>/dev/null | sort -V | tail -1 | xargs -r dirname; }

# as_pg_user CMD...: run CMD as the server's OS user: `postgres` (made by the Debian package) when
# root, since PostgreSQL refuses to run as root; else the user running this script. setpriv execs
# CMD (no process of its own in between).
as_pg_user() {
  if [[ $(id -u) == 0 ]]; then setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
  else "$@"; fi
}

# psql_admin SQL: run SQL as the superuser, through the server's Unix socket (trust auth; the
# socket's directory is the server user's alone); prints the rows unaligned.
psql_admin() {
  as_pg_user "$(pg_bindir)/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$PG_HOME/run" -p "$PG_PORT" \
    -U postgres -d postgres -c "$1"
}

postgres_start() {
  # pg_ctl detaches the server in its own session (setsid) and -w waits until it takes
  # connections. fsync=off: commits are written to the OS, not flushed to the disk (they survive
  # a killed server, not a crashed machine), as MariaDB's innodb-flush-log-at-trx-commit=2 here.
  as_pg_user "${SERVER_CPUS[@]}" "$(pg_bindir)/pg_ctl" -D "$PG_HOME/data" -l "$PG_HOME/postgres.log" \
    -w -t 60 -s -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $PG_HOME/run \
      -c max_connections=300 -c fsync=off" start \
    || die "postgresql did not start; see $PG_HOME/postgres.log"
  head -1 "$PG_HOME/data/postmaster.pid" >"$STATE/postgres.pid"
}

postgres_up() {
  if pid_alive "$STATE/postgres.pid"; then log "postgresql already running"; return; fi
  [[ -n $(pg_bindir) ]] || die "no PostgreSQL server under /usr/lib/postgresql (package postgresql)"
  mkdir -p "$PG_HOME/data" "$PG_HOME/run"
  chmod 700 "$PG_HOME/data" "$PG_HOME/run"
  if [[ $(id -u) == 0 ]]; then chown -R postgres:postgres "$PG_HOME"; fi
  if [[ ! -f $PG_HOME/data/PG_VERSION ]]; then
    as_pg_user "$(pg_bindir)/initdb" -D "$PG_HOME/data" -U postgres --auth-local=trust \
      --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$PG_HOME/initdb.log" 2>&1 \
      || die "initdb failed; see $PG_HOME/initdb.log"
  fi
  postgres_start
  psql_admin "DO \$\$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'dedup') THEN
      CREATE ROLE dedup LOGIN PASSWORD 'dedup';
    END IF; END \$\$"
  # the test user owns its database (PostgreSQL 15: so it may create tables in its public schema)
  [[ -n $(psql_admin "SELECT 1 FROM pg_database WHERE datname = 'dedup_test'") ]] \
    || psql_admin "CREATE DATABASE dedup_test OWNER dedup ENCODING 'UTF8'"
  log "postgresql up on 127.0.0.1:$PG_PORT (pid $(cat "$STATE/postgres.pid"))"
}

prometheus_up() {
  if pid_alive "$STATE/prometheus.pid"; then log "prometheus already running"; return; fi
  local dir="$STATE/prometheus"
  mkdir -p "$dir/data" "$dir/targets" "$dir/rules"
  cat >"$dir/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $dir/rules/*.yml
scrape_configs:
  - job_name: rocketmq-dedup
    file_sd_configs:
      - files: ["$dir/targets/*.json"]
CONF
  # setsid: its own session, so it outlives the process group of whoever started it
  nohup setsid "${SERVER_CPUS[@]}" prometheus --config.file="$dir/prometheus.yml" \
    --storage.tsdb.path="$dir/data" --storage.tsdb.retention.time=1d \
    --web.listen-address="127.0.0.1:$PROMETHEUS_PORT" --web.enable-lifecycle \
    >"$dir/prometheus.log" 2>&1 &
  echo $! >"$STATE/prometheus.pid"
  wait_until 60 "prometheus" curl -sf "http://127.0.0.1:$PROMETHEUS_PORT/-/ready"
  log "prometheus up on 127.0.0.1:$PROMETHEUS_PORT (pid $(cat "$STATE/prometheus.pid"))"
}

status() {  # status [SERVICE...]: the pid files of those services (default all)
  local rc=0 names=() svc wanted
  wanted=("${@:-$SERVICES}"); wanted=(${wanted[*]})
  for svc in "${wanted[@]}"; do
    case "$svc" in
      redis) names+=(redis) ;; mysql) names+=(mariadb) ;; postgres) names+=(postgres) ;;
      cluster) names+=("${CLUSTER_PORTS[@]/#/redis-cluster-}") ;;
      sentinel) names+=(sentinel-master sentinel) ;;
      prometheus) names+=(prometheus) ;;
      *) die "unknown service $svc (${SERVICES// /, })" ;;
    esac
  done
  for name in "${names[@]}"; do
    if pid_alive "$STATE/$name.pid"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"
    else echo "$name: stopped"; rc=1; fi
  done
  return $rc
}

case "${1:-}" in
  up)
    shift
    wanted=("${@:-$SERVICES}"); wanted=(${wanted[*]})
    # postgresql: the distribution's supported server (Debian 12: postgresql-15)
    apt_install redis-server mariadb-server mariadb-client postgresql prometheus curl
    mkdir -p "$STATE"
    for svc in "${wanted[@]}"; do
      case "$svc" in
        redis) redis_up ;; cluster) cluster_up ;; mysql) mysql_up ;; sentinel) sentinel_up ;;
        postgres) postgres_up ;; prometheus) prometheus_up ;;
        *) die "unknown service $svc (${SERVICES// /, })" ;;
      esac
    done
    ;;
  down)
    shift
    wanted=("${@:-$SERVICES}"); wanted=(${wanted[*]})
    for svc in "${wanted[@]}"; do
      case "$svc" in
        redis) stop_pid "$STATE/redis.pid" redis ;;
        cluster)
          for port in "${CLUSTER_PORTS[@]}"; do
            stop_pid "$STATE/redis-cluster-$port.pid" "redis cluster node $port"
          done ;;
        mysql) stop_pid "$STATE/mariadb.pid" mariadb ;;
        # SIGINT: PostgreSQL's fast shutdown (SIGTERM would wait for every client to leave)
        postgres) stop_pid "$STATE/postgres.pid" postgresql 30 INT ;;
        sentinel)
          stop_pid "$STATE/sentinel.pid" sentinel
          stop_pid "$STATE/sentinel-master.pid" "sentinel master" ;;
        prometheus) stop_pid "$STATE/prometheus.pid" prometheus ;;
        *) die "unknown service $svc (${SERVICES// /, })" ;;
      esac
    done
    ;;
  restart-mysql)  # for the reconnect test: stop and start the same data directory
    stop_pid "$STATE/mariadb.pid" mariadb
    mysql_start
    log "mariadb restarted (pid $(cat "$STATE/mariadb.pid"))"
    ;;
  restart-sentinel-master)  # for the reconnect test: the same master, same address, no failover
    stop_pid "$STATE/sentinel-master.pid" "sentinel master"
    sentinel_master_start
    log "sentinel master restarted (pid $(cat "$STATE/sentinel-master.pid"))"
    ;;
  status) shift; status "$@" ;;
  env) print_env ;;
  *) echo "usage: $0 up|down|status|restart-mysql|restart-sentinel-master|env" >&2; exit 2 ;;
esac
