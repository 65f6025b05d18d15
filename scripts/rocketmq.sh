#!/usr/bin/env bash
# Run a throwaway single-node RocketMQ 5.3.x on loopback for tests, demos and benchmarks.
#
#   scripts/rocketmq.sh up       fetch jars (once, cached outside the repo), start, create topics/groups
#   scripts/rocketmq.sh down     stop what `up` started and delete the message store
#   scripts/rocketmq.sh restart-broker  restart the proxy+broker gracefully, same store (the soak)
#   scripts/rocketmq.sh status   exit 0 if the name server and the proxy are running, else 1
#   scripts/rocketmq.sh topics T...  create more topics on the running server (4 queues)
#   scripts/rocketmq.sh groups G...  create more consumer groups (1 s retry backoff, see below)
#   scripts/rocketmq.sh both "T1 T2" "G1 G2"  topics and groups in one go
#   scripts/rocketmq.sh admin ARGS...  mqadmin against the running server (e.g. topicStatus -t T)
#
# Endpoints once up (the ports: defaults, see the environment below):
#   name server (classic remoting clients)   127.0.0.1:9876
#   proxy gRPC  (5.x gRPC clients)           127.0.0.1:8081
#   proxy remoting 8080, broker 10911 (+10909 fast remoting, 10912 HA: the broker port -2, +1)
# The clients of the tests, the bench, the soak and the samples find them through
# ROCKETMQ_NAMESRV and ROCKETMQ_PROXY (`scripts/services.sh env` prints both from the ports).
#
# Needs Java 17+ (with javac) and, once per version for the jar fetch, Maven: installed from
# Debian packages (openjdk-17-jdk-headless, maven) when missing. The configuration files and the
# setup helper live in scripts/rocketmq/ (see its README.md); `up` renders the configurations
# into the state directory $STATE_ROOT/rocketmq (scripts/lib.sh: $ROCKETMQ_DEDUP_STATE_ROOT,
# default /tmp/rocketmq-dedup), next to the pid files and logs/.
#
# Environment:
#   ROCKETMQ_DEDUP_STATE_ROOT  state root of all the project's scripts (default /tmp/rocketmq-dedup)
#   ROCKETMQ_DEDUP_VERSION     RocketMQ version from Maven Central (default 5.3.3)
#   ROCKETMQ_DEDUP_CACHE       jar cache (default ~/.cache/rocketmq-dedup); jars in rocketmq-<ver>/lib
#   ROCKETMQ_DEDUP_MAVEN_REPO  Maven local repository used for the fetch (default $CACHE/m2)
#   ROCKETMQ_DEDUP_STORE       message store dir (default /dev/shm/rocketmq-dedup-store-$UID if
#                              /dev/shm has >= 1 GiB free, else $STATE_ROOT/rocketmq/store); wiped
#                              by up and down
#   ROCKETMQ_DEDUP_TOPICS      extra topics to create (space separated)
#   ROCKETMQ_DEDUP_GROUPS      consumer groups to create (default: $DEFAULT_GROUPS below, the tests',
#                              the demo's, the bench's, the samples' and the README's):
#                              groupRetryPolicy CUSTOMIZED next=[1 s x18]
#                              (5.x gRPC consumers nack with a 1 s backoff on every attempt) and a
#                              pre-created %RETRY%<group> topic (classic consumers see retries in ~1 s).
#                              Auto-created groups get the defaults: gRPC backoff 1 s, 5 s, 10 s, 30 s...
#                              and a classic first retry after ~10 s.
#   ROCKETMQ_DEDUP_RETRY_MAX   retryMaxTimes of those groups (default 16)
#   ROCKETMQ_DEDUP_UP_TIMEOUT  seconds `up` waits for readiness (default 120)
#   ROCKETMQ_DEDUP_STOP_GRACE  seconds `down` waits after SIGTERM before SIGKILL (default 12: both
#                              are stopped at once; a clean shutdown took 9.9-10.2 s for the
#                              proxy+broker, 3.9-4.9 s for the name server on the 2-core machine;
#                              a KILL is logged as a problem, the store is deleted anyway)
#   ROCKETMQ_DEDUP_NAMESRV_PORT   name server port (default 9876)
#   ROCKETMQ_DEDUP_GRPC_PORT      proxy gRPC port (default 8081)
#   ROCKETMQ_DEDUP_REMOTING_PORT  proxy remoting port (default 8080)
#   ROCKETMQ_DEDUP_BROKER_PORT    broker port (default 10911; the broker also listens on this
#                              port - 2 and + 1). With a private ROCKETMQ_DEDUP_STATE_ROOT and
#                              ROCKETMQ_DEDUP_STORE, a second server runs beside the first, e.g.
#                              19876/18081/18080/20911.
#   JAVA                       the java binary (default: java on PATH if 17+, javac beside it)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

FILES="$REPO_ROOT/scripts/rocketmq"   # configuration templates, pom.xml, the setup helper
STATE="$STATE_ROOT/rocketmq"
VERSION="${ROCKETMQ_DEDUP_VERSION:-5.3.3}"
CACHE="${ROCKETMQ_DEDUP_CACHE:-$HOME/.cache/rocketmq-dedup}"
VDIR="$CACHE/rocketmq-$VERSION"
LIB="$VDIR/lib"
MAVEN_REPO="${ROCKETMQ_DEDUP_MAVEN_REPO:-$CACHE/m2}"
UP_TIMEOUT="${ROCKETMQ_DEDUP_UP_TIMEOUT:-120}"
STOP_GRACE="${ROCKETMQ_DEDUP_STOP_GRACE:-12}"
RETRY_MAX="${ROCKETMQ_DEDUP_RETRY_MAX:-16}"
# the topics and groups that the tests, the demo, the bench, the samples (samples/) and the
# README's quick starts use, created at `up` so that a first consumer does not wait for
# auto-creation
BASE_TOPICS="TEST-TOPIC ORDER-TOPIC SHIP-TOPIC DEDUP-E2E-CLASSIC DEDUP-E2E-GRPC DEDUP-DEMO DEDUP-BENCH"
DEFAULT_GROUPS="dedup-e2e-classic dedup-e2e-grpc dedup-demo dedup-bench dedup-sample"
DEFAULT_GROUPS+=" order-consumer-group order-group"
TOPICS="$BASE_TOPICS ${ROCKETMQ_DEDUP_TOPICS:-}"
GROUPS_="${ROCKETMQ_DEDUP_GROUPS:-$DEFAULT_GROUPS}"
PROBE_TOPIC="DEDUP-PROBE"   # used only by the readiness probe, never by tests

NAMESRV_PORT=$ROCKETMQ_NAMESRV_PORT   # scripts/lib.sh: the ROCKETMQ_DEDUP_*_PORT variables
NAMESRV_ADDR="127.0.0.1:$NAMESRV_PORT"
GRPC_PORT=$ROCKETMQ_GRPC_PORT
REMOTING_PORT=$ROCKETMQ_REMOTING_PORT
BROKER_PORT=$ROCKETMQ_BROKER_PORT

JAVA="${JAVA:-java}"
JAVA_OPENS=(
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-exports=java.base/sun.nio.ch=ALL-UNNAMED
)

now_ms() { date +%s%3N; }
since() { printf '%d.%ds' $((($(now_ms) - $1) / 1000)) $(((($(now_ms) - $1) % 1000) / 100)); }

port_open() { # port
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

store_dir() {
  if [[ -n "${ROCKETMQ_DEDUP_STORE:-}" ]]; then
    printf '%s\n' "$ROCKETMQ_DEDUP_STORE"
    return
  fi
  local avail_kb
  avail_kb="$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')" || avail_kb=0
  if [[ -d /dev/shm && -w /dev/shm && "${avail_kb:-0}" -ge 1048576 ]]; then
    printf '%s\n' "/dev/shm/rocketmq-dedup-store-$(id -u)"
  else
    printf '%s\n' "$STATE/store"
  fi
}

# ---------------------------------------------------------------------------------------------
# Java, Maven, jars, the setup helper
# ---------------------------------------------------------------------------------------------
java_major() { "$1" -version 2>&1 | sed -n '1s/[^"]*"\([0-9]*\).*/\1/p'; }

# Java 17+ with javac beside it (the setup helper is compiled) and, while the jars are not cached,
# Maven: installed from Debian packages when missing. Sets JAVA and JAVAC to absolute paths.
need_tools() {
  local bin="" missing=()
  bin=$(command -v "$JAVA" 2>/dev/null) && bin=$(readlink -f "$bin")
  if [[ -z $bin || ! -x ${bin%/java}/javac || $(java_major "$bin") -lt 17 ]]; then
    missing+=(openjdk-17-jdk-headless)
  fi
  if [[ ! -f $VDIR/.complete ]] && ! command -v mvn >/dev/null; then missing+=(maven); fi
  if ((${#missing[@]})); then
    with_progress 15 "installing ${missing[*]}" apt_install "${missing[@]}" \
      || die "could not install ${missing[*]}"
  fi
  if [[ " ${missing[*]} " == *" openjdk-17-jdk-headless "* ]]; then
    bin=$(readlink -f /usr/lib/jvm/java-17-openjdk-*/bin/java | head -n 1)
    [[ -x $bin ]] || die "openjdk-17-jdk-headless installed, but no java under /usr/lib/jvm"
  fi
  JAVA=$bin JAVAC=${bin%/java}/javac
}

maven_fetch() {
  mvn -B -q -Dstyle.color=never -f "$VDIR/pom.xml" -Dmaven.repo.local="$MAVEN_REPO" \
    -Drocketmq.version="$VERSION" \
    org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
    -DoutputDirectory="$LIB.tmp" -DincludeScope=runtime >"$VDIR/mvn.log" 2>&1
}

fetch_jars() {
  [[ -f $VDIR/.complete ]] && return
  mkdir -p "$VDIR"
  cp "$FILES/pom.xml" "$VDIR/pom.xml"
  rm -rf "$LIB.tmp"
  log "fetching RocketMQ $VERSION jars from Maven Central into $LIB (once per version)"
  with_progress 10 "fetching jars" maven_fetch \
    || { cat "$VDIR/mvn.log" >&2; die "maven could not fetch RocketMQ $VERSION jars"; }
  rm -rf "$LIB"
  mv "$LIB.tmp" "$LIB"
  touch "$VDIR/.complete"
  log "fetched $(find "$LIB" -name '*.jar' | wc -l) jars ($(du -sh "$LIB" | cut -f1))"
}

# the setup helper, compiled once per content into the jar cache; sets SETUP_CLASSES
compile_setup_helper() {
  local sum
  sum="$(sha256sum "$FILES/RmqSetup.java" | cut -c1-16)"
  SETUP_CLASSES="$VDIR/setup-$sum"
  [[ -f $SETUP_CLASSES/RmqSetup.class ]] && return
  log "compiling the setup helper (scripts/rocketmq/RmqSetup.java)"
  rm -rf "$VDIR"/setup-*
  mkdir -p "$SETUP_CLASSES.tmp"
  "$JAVAC" -nowarn -cp "$LIB/*" -d "$SETUP_CLASSES.tmp" "$FILES/RmqSetup.java" >&2 \
    || die "could not compile the setup helper"
  mv "$SETUP_CLASSES.tmp" "$SETUP_CLASSES"
}

# render NAME STORE: scripts/rocketmq/NAME -> $STATE/NAME, each @VAR@ replaced by $VAR
render() {
  # shellcheck disable=SC2034  # STORE is read through ${!var}
  local name=$1 STORE=$2 var args=()
  for var in STATE STORE NAMESRV_ADDR NAMESRV_PORT BROKER_PORT GRPC_PORT REMOTING_PORT; do
    args+=(-e "s|@$var@|${!var}|g")
  done
  sed "${args[@]}" "$FILES/$name" >"$STATE/$name"
  if grep -n '@[A-Z_]*@' "$STATE/$name" >&2; then die "unknown placeholder in $FILES/$name"; fi
}

# a short-lived client JVM (setup helper, mqadmin): client logs in $STATE/logs
java_tool() {
  ROCKETMQ_HOME="$STATE/home" "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    "${JAVA_OPENS[@]}" -Duser.home="$STATE" -Drocketmq.client.logRoot="$STATE/logs" \
    -Drocketmq.client.logLevel=WARN "$@" </dev/null
}

# setup DEADLINE_MS TOPICS GROUPS: the setup helper (waits for the broker, creates, probes)
setup() {
  java_tool -cp "$SETUP_CLASSES:$LIB/*" RmqSetup "$NAMESRV_ADDR" "$1" "$PROBE_TOPIC" \
    "$RETRY_MAX" "$2" "$3"
}

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
start_java() { # name xms xmx mainclass logback args...
  local name="$1" xms="$2" xmx="$3" main="$4" logback="$5"
  shift 5
  ROCKETMQ_HOME="$STATE/home" nohup "$JAVA" -server "-Xms$xms" "-Xmx$xmx" -Xss512k \
    -XX:+UseSerialGC -XX:MaxDirectMemorySize=1g \
    -XX:-OmitStackTraceInFastThrow "${JAVA_OPENS[@]}" \
    -Djava.net.preferIPv4Stack=true \
    -Duser.home="$STATE" -Drocketmq.home.dir="$STATE/home" -Drmq.proxy.home="$STATE/home" \
    -Drmq.logback.configurationFile="$logback" \
    -Drocketmq.client.logRoot="$STATE/logs" \
    -Dcom.rocketmq.sendMessageWithVIPChannel=false \
    -cp "$LIB/*" "$main" "$@" \
    >"$STATE/logs/$name.out" 2>&1 </dev/null &
  echo $! >"$STATE/$name.pid"
}

# up_failed MESSAGE: show the relevant logs, stop what was started, exit 1
up_failed() {
  [[ -z ${setup_pid:-} ]] || kill "$setup_pid" 2>/dev/null || true
  tail -n 20 "$STATE"/logs/*.out >&2 2>/dev/null || true
  cmd_down >/dev/null 2>&1 || true
  die "$1 (logs in $STATE/logs)"
}

cmd_up() {
  local t0 deadline store p
  t0="$(now_ms)"
  if pid_alive "$STATE/namesrv.pid" && pid_alive "$STATE/proxy.pid"; then
    log "already up (namesrv pid $(cat "$STATE/namesrv.pid"), proxy pid $(cat "$STATE/proxy.pid"))"
    return 0
  fi
  if pid_alive "$STATE/namesrv.pid" || pid_alive "$STATE/proxy.pid"; then
    log "half up: stopping leftovers first"
    cmd_down
  fi
  for p in $NAMESRV_PORT $GRPC_PORT $REMOTING_PORT $BROKER_PORT $((BROKER_PORT - 2)) $((BROKER_PORT + 1)); do
    if port_open "$p"; then die "port $p on 127.0.0.1 is already in use by another process"; fi
  done

  need_tools
  fetch_jars
  compile_setup_helper

  store="$(store_dir)"
  rm -rf "$store" "${STATE:?}/logs" "${STATE:?}/home" "$STATE"/*.pid
  mkdir -p "$store" "$STATE/logs" "$STATE/home"
  printf '%s\n' "$store" >"$STATE/store.path"
  render namesrv.conf "$store"
  render broker.conf "$store"
  render rmq-proxy.json "$store"

  deadline=$(( $(now_ms) + UP_TIMEOUT * 1000 ))
  start_java namesrv 64m 256m org.apache.rocketmq.namesrv.NamesrvStartup rmq.namesrv.logback.xml \
    -c "$STATE/namesrv.conf"
  log "starting the name server (pid $(cat "$STATE/namesrv.pid")); store $store"
  # the broker registers with the name server once at start, then only every 10-30 s: start the
  # proxy (with its embedded broker) once the name server listens
  local next_note=$((SECONDS + 10))
  until port_open $NAMESRV_PORT; do
    pid_alive "$STATE/namesrv.pid" || up_failed "name server exited during startup"
    (( $(now_ms) < deadline )) || up_failed "timed out waiting for the name server"
    if ((SECONDS >= next_note)); then
      log "still waiting for the name server to listen after $(since "$t0") (up to ${UP_TIMEOUT}s)"
      next_note=$((SECONDS + 10))
    fi
    sleep 0.1
  done
  start_java proxy 256m 512m org.apache.rocketmq.proxy.ProxyStartup rmq.proxy.logback.xml \
    -pm local -bc "$STATE/broker.conf" -pc "$STATE/rmq-proxy.json" -n "$NAMESRV_ADDR"
  log "name server listening after $(since "$t0"); starting the proxy+broker (pid $(cat "$STATE/proxy.pid"))"

  # the setup helper runs meanwhile: it polls the name server until the broker has registered
  # (deadline shared with us), creates topics and groups, then proves a send works. Its output
  # lines are relayed as progress; a line every 10 s says what is still awaited.
  setup "$deadline" "$TOPICS" "$GROUPS_" >"$STATE/logs/setup.out" 2>&1 &
  setup_pid=$!
  local ports_ok=0 registered=0 setup_rc="" waiting
  next_note=$((SECONDS + 10))
  while :; do
    if ((!ports_ok)) && port_open $BROKER_PORT && port_open $GRPC_PORT; then
      ports_ok=1
      log "broker and gRPC ports $BROKER_PORT/$GRPC_PORT open after $(since "$t0")"
    fi
    if ((!registered)) && grep -q '^broker ' "$STATE/logs/setup.out"; then
      registered=1
      log "broker registered with the name server after $(since "$t0"); creating topics and groups"
    fi
    if [[ -z $setup_rc ]] && ! kill -0 "$setup_pid" 2>/dev/null; then
      setup_rc=0
      wait "$setup_pid" || setup_rc=$?
      [[ $setup_rc == 0 ]] || { cat "$STATE/logs/setup.out" >&2; up_failed "topic/group setup or probe send failed"; }
    fi
    ((ports_ok)) && [[ $setup_rc == 0 ]] && break
    if ! pid_alive "$STATE/namesrv.pid" || ! pid_alive "$STATE/proxy.pid"; then
      up_failed "a RocketMQ process exited during startup"
    fi
    (( $(now_ms) <= deadline + 5000 )) || up_failed "timed out after ${UP_TIMEOUT}s waiting for RocketMQ"
    if ((SECONDS >= next_note)); then
      waiting="the broker's ports"
      ((!ports_ok)) || waiting="the broker's registration"
      ((!registered)) || waiting="topics, groups and a probe send"
      log "still waiting for $waiting after $(since "$t0") (up to ${UP_TIMEOUT}s)"
      next_note=$((SECONDS + 10))
    fi
    sleep 0.2
  done
  setup_pid=""
  log "topics: $(grep '^topic ' "$STATE/logs/setup.out" | cut -d' ' -f2 | tr '\n' ' ')"
  log "groups (1 s retry backoff, retryMaxTimes=$RETRY_MAX): $(grep '^group ' "$STATE/logs/setup.out" | cut -d' ' -f2 | tr '\n' ' ')"
  log "up in $(since "$t0"): namesrv $NAMESRV_ADDR, gRPC proxy 127.0.0.1:$GRPC_PORT (state $STATE)"
}

cmd_down() {
  local t0 store name pids=() stoppers=()
  t0="$(now_ms)"
  for name in proxy namesrv; do
    pid_alive "$STATE/$name.pid" && pids+=("$(cat "$STATE/$name.pid")")
  done
  if ((${#pids[@]})); then
    log "stopping the proxy+broker and the name server (a clean shutdown takes ~10 s)"
  fi
  # in parallel; the proxy+broker takes the longest. A KILL after STOP_GRACE is worth a warning.
  stop_pid "$STATE/proxy.pid" "proxy+broker" "$STOP_GRACE" & stoppers+=($!)
  stop_pid "$STATE/namesrv.pid" "name server" "$STOP_GRACE" & stoppers+=($!)
  wait "${stoppers[@]}"
  # a KILLed JVM may still be unmapping the store: wait until the processes are gone
  for name in "${pids[@]}"; do
    while kill -0 "$name" 2>/dev/null; do sleep 0.1; done
  done
  if [[ -f "$STATE/store.path" ]]; then
    store="$(cat "$STATE/store.path")"
    rm -rf "$store"
    rm -f "$STATE/store.path"
  fi
  log "down in $(since "$t0") (logs kept in $STATE/logs)"
}

# create extra topics/groups on a running server: scripts/rocketmq.sh topics T1 T2 / groups G1 G2
cmd_create() { # kind names...
  local kind="$1" topics="" groups=""
  shift
  [[ $# -gt 0 ]] || die "usage: $0 $kind NAME..."
  pid_alive "$STATE/proxy.pid" || die "not up (run: $0 up)"
  case "$kind" in
    topics) topics="$*" ;;
    groups) groups="$*" ;;
    both) topics="$1"; groups="${2:-}" ;;  # both "T1 T2" "G1 G2"
  esac
  need_tools
  compile_setup_helper
  setup "$(( $(now_ms) + 30000 ))" "$topics" "$groups" >"$STATE/logs/create.out" 2>&1 \
    || { cat "$STATE/logs/create.out" >&2; die "creating $kind failed"; }
  log "created $kind: $*"
}

# mqadmin on the running server: scripts/rocketmq.sh admin topicStatus -t TOPIC
cmd_admin() {
  pid_alive "$STATE/proxy.pid" || die "not up (run: $0 up)"
  need_tools
  java_tool -cp "$LIB/*" org.apache.rocketmq.tools.command.MQAdminStartup "$@" -n "$NAMESRV_ADDR"
}

# restart-broker: a graceful restart of the proxy+broker on the same store (topics, groups,
# offsets and messages kept; the name server keeps running), as an operator restarts a broker.
cmd_restart_broker() {
  local t0
  t0="$(now_ms)"
  pid_alive "$STATE/proxy.pid" || die "the proxy+broker is not running"
  # a clean shutdown persists the pop consumers' checkpoints; it takes 15-25 s here
  stop_pid "$STATE/proxy.pid" "proxy+broker" "${ROCKETMQ_DEDUP_RESTART_GRACE:-90}"
  start_java proxy 256m 512m org.apache.rocketmq.proxy.ProxyStartup rmq.proxy.logback.xml \
    -pm local -bc "$STATE/broker.conf" -pc "$STATE/rmq-proxy.json" -n "$NAMESRV_ADDR"
  wait_until "$UP_TIMEOUT" "the broker's ports" port_open "$BROKER_PORT"
  wait_until "$UP_TIMEOUT" "the gRPC port" port_open "$GRPC_PORT"
  log "proxy+broker restarted in $(since "$t0") (pid $(cat "$STATE/proxy.pid"))"
}

cmd_status() {
  local ok=0 name p
  for name in namesrv proxy; do
    if pid_alive "$STATE/$name.pid"; then
      echo "$name: running (pid $(cat "$STATE/$name.pid"))"
    else
      echo "$name: stopped"
      ok=1
    fi
  done
  for p in $NAMESRV_PORT $GRPC_PORT; do
    if port_open "$p"; then echo "port $p: open"; else echo "port $p: closed"; ok=1; fi
  done
  return $ok
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  restart-broker) cmd_restart_broker ;;
  status) cmd_status ;;
  topics | groups | both) cmd_create "$@" ;;
  admin) shift; cmd_admin "$@" ;;
  *) echo "usage: $0 up|down|restart-broker|status|topics NAME...|groups NAME...|both 'T...' 'G...'|admin ARGS..." >&2; exit 2 ;;
esac
