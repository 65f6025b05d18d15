#!/usr/bin/env bash
# Run a throwaway single-node RocketMQ 5.3.x on loopback for tests, demos and benchmarks.
#
#   scripts/rocketmq.sh up       fetch jars (once, cached outside the repo), start, create topics/groups
#   scripts/rocketmq.sh down     stop what `up` started and delete the message store
#   scripts/rocketmq.sh status   exit 0 if the name server and the proxy are running, else 1
#   scripts/rocketmq.sh topics T...  create more topics on the running server (4 queues)
#   scripts/rocketmq.sh groups G...  create more consumer groups (1 s retry backoff, see below)
#   scripts/rocketmq.sh both "T1 T2" "G1 G2"  topics and groups in one go
#   scripts/rocketmq.sh admin ARGS...  mqadmin against the running server (e.g. topicStatus -t T)
#
# Endpoints once up:
#   name server (classic remoting clients)   127.0.0.1:9876
#   proxy gRPC  (5.x gRPC clients)           127.0.0.1:8081
#   proxy remoting 8080, broker 10911 (+10909 fast remoting, 10912 HA)
#
# Environment:
#   ROCKETMQ_DEDUP_VERSION     RocketMQ version from Maven Central (default 5.3.3)
#   ROCKETMQ_DEDUP_CACHE       jar cache (default ~/.cache/rocketmq-dedup); jars in rocketmq-<ver>/lib
#   ROCKETMQ_DEDUP_MAVEN_REPO  Maven local repository used for the fetch (default $CACHE/m2)
#   ROCKETMQ_DEDUP_STATE       pid files, configs, logs (default /tmp/rocketmq-dedup/rocketmq)
#   ROCKETMQ_DEDUP_STORE       message store dir (default /dev/shm/rocketmq-dedup-store-$UID if
#                              /dev/shm has >= 1 GiB free, else $STATE/store); wiped by up and down
#   ROCKETMQ_DEDUP_TOPICS      extra topics to create (space separated)
#   ROCKETMQ_DEDUP_GROUPS      consumer groups to create (default "dedup-e2e-classic dedup-e2e-grpc
#                              dedup-demo dedup-bench"): groupRetryPolicy CUSTOMIZED next=[1 s x18]
#                              (5.x gRPC consumers nack with a 1 s backoff on every attempt) and a
#                              pre-created %RETRY%<group> topic (classic consumers see retries in ~1 s).
#                              Auto-created groups get the defaults: gRPC backoff 1 s, 5 s, 10 s, 30 s...
#                              and a classic first retry after ~10 s.
#   ROCKETMQ_DEDUP_RETRY_MAX   retryMaxTimes of those groups (default 16)
#   ROCKETMQ_DEDUP_UP_TIMEOUT  seconds `up` waits for readiness (default 120)
#   ROCKETMQ_DEDUP_STOP_GRACE  seconds `down` waits after SIGTERM before SIGKILL (default 5; the
#                              store is deleted anyway, a clean broker shutdown takes ~6-10 s)
set -euo pipefail

VERSION="${ROCKETMQ_DEDUP_VERSION:-5.3.3}"
CACHE="${ROCKETMQ_DEDUP_CACHE:-$HOME/.cache/rocketmq-dedup}"
VDIR="$CACHE/rocketmq-$VERSION"
LIB="$VDIR/lib"
MAVEN_REPO="${ROCKETMQ_DEDUP_MAVEN_REPO:-$CACHE/m2}"
STATE="${ROCKETMQ_DEDUP_STATE:-/tmp/rocketmq-dedup/rocketmq}"
UP_TIMEOUT="${ROCKETMQ_DEDUP_UP_TIMEOUT:-120}"
STOP_GRACE="${ROCKETMQ_DEDUP_STOP_GRACE:-5}"
RETRY_MAX="${ROCKETMQ_DEDUP_RETRY_MAX:-16}"
BASE_TOPICS="TEST-TOPIC DEDUP-E2E-CLASSIC DEDUP-E2E-GRPC DEDUP-DEMO DEDUP-BENCH"
TOPICS="$BASE_TOPICS ${ROCKETMQ_DEDUP_TOPICS:-}"
GROUPS_="${ROCKETMQ_DEDUP_GROUPS:-dedup-e2e-classic dedup-e2e-grpc dedup-demo dedup-bench}"
PROBE_TOPIC="DEDUP-PROBE"   # used only by the readiness probe, never by tests

NAMESRV_ADDR="127.0.0.1:9876"
NAMESRV_PORT=9876
GRPC_PORT=8081
REMOTING_PORT=8080
BROKER_PORT=10911

JAVA="${JAVA:-java}"
JAVA_OPENS=(
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-exports=java.base/sun.nio.ch=ALL-UNNAMED
)

log() { printf '[rocketmq.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

now_ms() { date +%s%3N; }

pid_alive() { # pidfile
  local pid
  [[ -f "$1" ]] || return 1
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

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
# jars
# ---------------------------------------------------------------------------------------------
fetch_jars() {
  if [[ -f "$VDIR/.complete" ]]; then
    return
  fi
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch RocketMQ $VERSION jars)"
  mkdir -p "$VDIR"
  log "fetching RocketMQ $VERSION jars from Maven Central into $LIB (one-off)"
  cat >"$VDIR/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.rocketmq-dedup</groupId>
  <artifactId>rocketmq-server-jars</artifactId>
  <version>$VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-namesrv</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-broker</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-proxy</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-tools</artifactId><version>$VERSION</version></dependency>
  </dependencies>
</project>
EOF
  rm -rf "$LIB.tmp"
  mvn -B -q -Dstyle.color=never -f "$VDIR/pom.xml" -Dmaven.repo.local="$MAVEN_REPO" \
    org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
    -DoutputDirectory="$LIB.tmp" -DincludeScope=runtime >"$VDIR/mvn.log" 2>&1 \
    || { cat "$VDIR/mvn.log" >&2; die "maven could not fetch RocketMQ $VERSION jars"; }
  rm -rf "$LIB"
  mv "$LIB.tmp" "$LIB"
  touch "$VDIR/.complete"
  log "fetched $(ls "$LIB" | wc -l) jars ($(du -sh "$LIB" | cut -f1))"
}

# ---------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------
write_configs() { # store
  local store="$1" levels
  levels="$(printf '1s %.0s' $(seq 18))"
  mkdir -p "$STATE/home" "$STATE/logs"
  cat >"$STATE/namesrv.conf" <<EOF
listenPort=$NAMESRV_PORT
bindAddress=127.0.0.1
rocketmqHome=$STATE/home
kvConfigPath=$STATE/home/namesrv/kvConfig.json
EOF
  cat >"$STATE/broker.conf" <<EOF
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
brokerRole=ASYNC_MASTER
flushDiskType=ASYNC_FLUSH
brokerIP1=127.0.0.1
brokerIP2=127.0.0.1
bindAddress=127.0.0.1
listenPort=$BROKER_PORT
namesrvAddr=$NAMESRV_ADDR
rocketmqHome=$STATE/home
storePathRootDir=$store
storePathCommitLog=$store/commitlog
autoCreateTopicEnable=true
autoCreateSubscriptionGroup=true
defaultTopicQueueNums=4
mappedFileSizeCommitLog=67108864
mappedFileSizeConsumeQueue=600000
mappedFileSizeTimerLog=8388608
timerRollWindowSlot=7200
messageDelayLevel=${levels% }
diskMaxUsedSpaceRatio=95
waitTimeMillsInSendQueue=2000
brokerFastFailureEnable=true
enableDetailStat=false
traceTopicEnable=false
registerNameServerPeriod=10000
# pop (5.x gRPC consumers): revived/nacked messages go to %RETRY%<group>+<topic>, which wakes the
# consumer's long poll on <topic>; with the v1 naming a retry waits for the 20 s long poll to expire
enableRetryTopicV2=true
# else half of the pops look only at the (unused) v1 retry topic and miss the wake-up
retrieveMessageFromPopRetryTopicV1=false
EOF
  # A gRPC client that dies (SIGKILL) keeps the messages it popped invisible, with the proxy
  # renewing them, until its channel expires (default 120 s). Clients heartbeat every 10 s, so
  # 30 s expiries bring a dead consumer's messages back within about half a minute.
  cat >"$STATE/rmq-proxy.json" <<EOF
{
  "rocketMQClusterName": "DefaultCluster",
  "proxyMode": "local",
  "namesrvAddr": "$NAMESRV_ADDR",
  "grpcServerPort": $GRPC_PORT,
  "remotingListenPort": $REMOTING_PORT,
  "localServeAddr": "127.0.0.1",
  "minInvisibleTimeMillsForRecv": 1000,
  "grpcClientConsumerMinLongPollingTimeoutMillis": 1000,
  "grpcClientConsumerMaxLongPollingTimeoutMillis": 3000,
  "channelExpiredTimeout": 30000,
  "grpcClientIdleTimeMills": 30000,
  "channelExpiredInSeconds": 30,
  "enablePrintJstack": false
}
EOF
}

# Admin helper: runs in one JVM (Java 17 single-file source launch). Waits until the broker is
# registered, creates topics and groups, then proves a send works.
write_admin_helper() {
  cat >"$STATE/RmqSetup.java" <<'EOF'
import java.util.*;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.subscription.CustomizedRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicyType;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public class RmqSetup {
    // args: namesrv deadlineEpochMs probeTopic retryMax "topics..." "groups..."
    public static void main(String[] a) throws Exception {
        String ns = a[0];
        long deadline = Long.parseLong(a[1]);
        String probeTopic = a[2];
        int retryMax = Integer.parseInt(a[3]);
        String[] topics = a[4].trim().isEmpty() ? new String[0] : a[4].trim().split("\\s+");
        String[] groups = a[5].trim().isEmpty() ? new String[0] : a[5].trim().split("\\s+");
        int rc = 1;
        final long t0 = System.currentTimeMillis();
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(ns);
        admin.setInstanceName("rmq-setup-" + System.nanoTime());
        DefaultMQProducer producer = new DefaultMQProducer("rocketmq-dedup-probe");
        producer.setNamesrvAddr(ns);
        producer.setInstanceName("rmq-setup-probe-" + System.nanoTime());
        producer.setSendMsgTimeout(3000);
        producer.setRetryTimesWhenSendFailed(0);
        try {
            admin.start();
            String brokerAddr = null;
            Exception last = null;
            while (System.currentTimeMillis() < deadline) {
                try {
                    ClusterInfo ci = admin.examineBrokerClusterInfo();
                    for (BrokerData bd : ci.getBrokerAddrTable().values()) {
                        String addr = bd.getBrokerAddrs().get(0L);
                        if (addr != null) brokerAddr = addr;
                    }
                    if (brokerAddr != null) {
                        System.out.println("broker " + brokerAddr + " +" + (System.currentTimeMillis() - t0) + "ms");
                        break;
                    }
                } catch (Exception e) {
                    last = e;
                }
                Thread.sleep(200);
            }
            if (brokerAddr == null) {
                System.err.println("broker did not register with the name server in time: " + last);
                System.exit(1);
            }
            List<String> all = new ArrayList<>(Arrays.asList(topics));
            all.add(probeTopic);
            for (String t : all) {
                TopicConfig tc = new TopicConfig(t, 4, 4);
                admin.createAndUpdateTopicConfig(brokerAddr, tc);
                System.out.println("topic " + t + " +" + (System.currentTimeMillis() - t0) + "ms");
            }
            for (String g : groups) {
                SubscriptionGroupConfig sg = new SubscriptionGroupConfig();
                sg.setGroupName(g);
                sg.setRetryMaxTimes(retryMax);
                GroupRetryPolicy p = new GroupRetryPolicy();
                p.setType(GroupRetryPolicyType.CUSTOMIZED);
                long[] next = new long[18];
                Arrays.fill(next, 1000L);
                p.setCustomizedRetryPolicy(new CustomizedRetryPolicy(next));
                sg.setGroupRetryPolicy(p);
                admin.createAndUpdateSubscriptionGroupConfig(brokerAddr, sg);
                // pre-create the classic retry topic: a classic push consumer only learns the route
                // of %RETRY%<group> at start or on its periodic refresh, so a retry topic that
                // appears later delays the first redelivery by ~10 s instead of ~1 s
                admin.createAndUpdateTopicConfig(brokerAddr,
                    new TopicConfig("%RETRY%" + g, 1, 1, PermName.PERM_READ | PermName.PERM_WRITE));
                System.out.println("group " + g + " +" + (System.currentTimeMillis() - t0) + "ms");
            }
            producer.start();
            while (true) {
                try {
                    SendResult r = producer.send(new Message(probeTopic, "probe", "probe".getBytes()));
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        System.out.println("probe send ok " + r.getMsgId() + " +" + (System.currentTimeMillis() - t0) + "ms");
                        rc = 0;
                        break;
                    }
                    last = new RuntimeException(String.valueOf(r.getSendStatus()));
                } catch (Exception e) {
                    last = e;
                }
                if (System.currentTimeMillis() >= deadline) {
                    System.err.println("probe send never succeeded: " + last);
                    break;
                }
                Thread.sleep(200);
            }
        } finally {
            try { producer.shutdown(); } catch (Exception ignored) { }
            try { admin.shutdown(); } catch (Exception ignored) { }
        }
        System.exit(rc);
    }
}
EOF
}

# compiled once per helper source into the jar cache
compile_admin_helper() {
  local sum
  sum="$(sha256sum "$STATE/RmqSetup.java" | cut -c1-16)"
  SETUP_CLASSES="$VDIR/setup-$sum"
  if [[ ! -f "$SETUP_CLASSES/RmqSetup.class" ]]; then
    rm -rf "$VDIR"/setup-*
    mkdir -p "$SETUP_CLASSES.tmp"
    javac -nowarn -cp "$LIB/*" -d "$SETUP_CLASSES.tmp" "$STATE/RmqSetup.java" >&2 \
      || die "could not compile the setup helper (needs a JDK with javac)"
    rm -rf "$SETUP_CLASSES"
    mv "$SETUP_CLASSES.tmp" "$SETUP_CLASSES"
  fi
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

cmd_up() {
  local t0 deadline store
  t0="$(now_ms)"
  if pid_alive "$STATE/namesrv.pid" && pid_alive "$STATE/proxy.pid"; then
    log "already up (namesrv pid $(cat "$STATE/namesrv.pid"), proxy pid $(cat "$STATE/proxy.pid"))"
    return 0
  fi
  if pid_alive "$STATE/namesrv.pid" || pid_alive "$STATE/proxy.pid"; then
    log "half up: stopping leftovers first"
    cmd_down
  fi
  for p in $NAMESRV_PORT $GRPC_PORT $REMOTING_PORT $BROKER_PORT; do
    if port_open "$p"; then die "port $p on 127.0.0.1 is already in use by another process"; fi
  done

  fetch_jars

  store="$(store_dir)"
  rm -rf "$store"
  mkdir -p "$store" "$STATE"
  rm -rf "$STATE/logs" "$STATE/home" "$STATE"/*.pid
  printf '%s\n' "$store" >"$STATE/store.path"
  write_configs "$store"
  write_admin_helper
  compile_admin_helper

  deadline=$(( $(now_ms) + UP_TIMEOUT * 1000 ))
  start_java namesrv 64m 256m org.apache.rocketmq.namesrv.NamesrvStartup rmq.namesrv.logback.xml \
    -c "$STATE/namesrv.conf"
  # the broker registers with the name server once at start, then only every 10-30 s: start the
  # proxy (with its embedded broker) once the name server listens
  until port_open $NAMESRV_PORT; do
    pid_alive "$STATE/namesrv.pid" || { tail -n 30 "$STATE/logs/namesrv.out" >&2; cmd_down >/dev/null 2>&1 || true; die "name server exited during startup (logs in $STATE/logs)"; }
    (( $(now_ms) < deadline )) || { cmd_down >/dev/null 2>&1 || true; die "timed out waiting for the name server"; }
    sleep 0.1
  done
  start_java proxy 256m 512m org.apache.rocketmq.proxy.ProxyStartup rmq.proxy.logback.xml \
    -pm local -bc "$STATE/broker.conf" -pc "$STATE/rmq-proxy.json" -n "$NAMESRV_ADDR"
  log "started namesrv (pid $(cat "$STATE/namesrv.pid")) and proxy+broker (pid $(cat "$STATE/proxy.pid")); store $store"

  # setup helper runs concurrently: it polls the name server until the broker has registered
  # (deadline shared with us), creates topics and groups, then proves a send works.
  local setup_pid setup_rc=""
  ROCKETMQ_HOME="$STATE/home" "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    "${JAVA_OPENS[@]}" -Duser.home="$STATE" -Drocketmq.client.logRoot="$STATE/logs" \
    -Drocketmq.client.logLevel=WARN \
    -cp "$SETUP_CLASSES:$LIB/*" RmqSetup "$NAMESRV_ADDR" "$deadline" "$PROBE_TOPIC" "$RETRY_MAX" \
    "$TOPICS" "$GROUPS_" >"$STATE/logs/setup.out" 2>&1 </dev/null &
  setup_pid=$!

  local ports_ok=0
  while :; do
    if (( ! ports_ok )) && port_open $NAMESRV_PORT && port_open $BROKER_PORT && port_open $GRPC_PORT; then
      ports_ok=1
      log "ports $NAMESRV_PORT/$BROKER_PORT/$GRPC_PORT open after $(( $(now_ms) - t0 ))ms"
    fi
    if [[ -z "$setup_rc" ]] && ! kill -0 "$setup_pid" 2>/dev/null; then
      setup_rc=0
      wait "$setup_pid" || setup_rc=$?
      if [[ "$setup_rc" != 0 ]]; then
        cat "$STATE/logs/setup.out" >&2
        cmd_down >/dev/null 2>&1 || true
        die "topic/group setup or probe send failed (logs in $STATE/logs)"
      fi
    fi
    (( ports_ok )) && [[ "$setup_rc" == 0 ]] && break
    if ! pid_alive "$STATE/namesrv.pid" || ! pid_alive "$STATE/proxy.pid"; then
      kill "$setup_pid" 2>/dev/null || true
      tail -n 30 "$STATE/logs/namesrv.out" "$STATE/logs/proxy.out" >&2 || true
      cmd_down >/dev/null 2>&1 || true
      die "a RocketMQ process exited during startup (logs in $STATE/logs)"
    fi
    if (( $(now_ms) > deadline + 5000 )); then
      kill "$setup_pid" 2>/dev/null || true
      cmd_down >/dev/null 2>&1 || true
      die "timed out after ${UP_TIMEOUT}s waiting for RocketMQ (logs in $STATE/logs)"
    fi
    sleep 0.2
  done
  log "topics: $(grep '^topic ' "$STATE/logs/setup.out" | cut -d' ' -f2 | tr '\n' ' ')"
  log "groups (1 s retry backoff, retryMaxTimes=$RETRY_MAX): $(grep '^group ' "$STATE/logs/setup.out" | cut -d' ' -f2 | tr '\n' ' ')"
  log "up in $(( ($(now_ms) - t0) ))ms: namesrv $NAMESRV_ADDR, gRPC proxy 127.0.0.1:$GRPC_PORT (state $STATE)"
}

stop_pid() { # name
  local pf="$STATE/$1.pid" pid end
  [[ -f "$pf" ]] || return 0
  pid="$(cat "$pf")"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    end=$(( $(now_ms) + STOP_GRACE * 1000 ))
    while kill -0 "$pid" 2>/dev/null && (( $(now_ms) < end )); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$1 (pid $pid) still running ${STOP_GRACE}s after TERM: KILL"
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    log "stopped $1 (pid $pid)"
  fi
  rm -f "$pf"
}

cmd_down() {
  local t0 store
  t0="$(now_ms)"
  stop_pid proxy &
  stop_pid namesrv &
  wait
  if [[ -f "$STATE/store.path" ]]; then
    store="$(cat "$STATE/store.path")"
    rm -rf "$store"
    rm -f "$STATE/store.path"
  fi
  log "down in $(( $(now_ms) - t0 ))ms (logs kept in $STATE/logs)"
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
  write_admin_helper
  compile_admin_helper
  ROCKETMQ_HOME="$STATE/home" "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    "${JAVA_OPENS[@]}" -Duser.home="$STATE" -Drocketmq.client.logRoot="$STATE/logs" \
    -Drocketmq.client.logLevel=WARN \
    -cp "$SETUP_CLASSES:$LIB/*" RmqSetup "$NAMESRV_ADDR" "$(( $(now_ms) + 30000 ))" "$PROBE_TOPIC" \
    "$RETRY_MAX" "$topics" "$groups" >"$STATE/logs/create.out" 2>&1 </dev/null \
    || { cat "$STATE/logs/create.out" >&2; die "creating $kind failed"; }
  log "created $kind: $*"
}

# mqadmin on the running server: scripts/rocketmq.sh admin topicStatus -t TOPIC
cmd_admin() {
  pid_alive "$STATE/proxy.pid" || die "not up (run: $0 up)"
  ROCKETMQ_HOME="$STATE/home" "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    "${JAVA_OPENS[@]}" -Duser.home="$STATE" -Drocketmq.client.logRoot="$STATE/logs" \
    -Drocketmq.client.logLevel=WARN -cp "$LIB/*" \
    org.apache.rocketmq.tools.command.MQAdminStartup "$@" -n "$NAMESRV_ADDR" </dev/null
}

cmd_status() {
  local ok=0 name
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
  status) cmd_status ;;
  topics | groups | both) cmd_create "$@" ;;
  admin) shift; cmd_admin "$@" ;;
  *) echo "usage: $0 up|down|status|topics NAME...|groups NAME...|both 'T...' 'G...'|admin ARGS..." >&2; exit 2 ;;
esac
