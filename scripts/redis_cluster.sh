#!/usr/bin/env bash
# Starts a Redis Cluster on loopback: 3 masters and 3 replicas, daemonized,
# without persistence, in a fresh directory.
#
#   scripts/redis_cluster.sh start [BASE_PORT] [DIR]   # nodes on BASE_PORT..BASE_PORT+5
#   scripts/redis_cluster.sh stop DIR
#
# `start` waits until every node reports cluster_state:ok, every slot is
# served and every replica's link to its master is up, then prints the nodes
# as a comma-separated list of URLs, the form KEYRATE_REDIS_CLUSTER_URLS
# takes. Each node's bus port is its port + 10000. If `start` fails it stops
# the nodes it started; it exits 75 when a node could not bind its port or
# the nodes did not meet within 60 s (the caller may retry with another
# BASE_PORT), 1 on any other failure.
set -euo pipefail

# Stops the redis-server whose pidfile is $1 and waits (up to 5 s, then
# SIGKILL) until it is gone.
stop_pidfile() {
  local pidfile="$1" pid
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile" 2>/dev/null)" || return 0
  [ -n "$pid" ] || return 0
  # Only a redis-server: the pid may have been reused since.
  if [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != redis-server ]; then
    return 0
  fi
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

start() {
  local base="${1:-7100}" dir="${2:-$(mktemp -d)}"
  mkdir -p "$dir"
  local ports=() urls=()
  for i in 0 1 2 3 4 5; do
    ports+=("$((base + i))")
    urls+=("redis://127.0.0.1:$((base + i))")
  done

  # On any failure: say why (with the node's log), stop what was started.
  fail() {
    local code="$1" port="$2" msg="$3"
    echo "redis_cluster.sh: node $port: $msg" >&2
    if [ -f "$dir/$port/redis.log" ]; then
      echo "--- $dir/$port/redis.log (last 30 lines)" >&2
      tail -n 30 "$dir/$port/redis.log" >&2
    fi
    stop "$dir"
    exit "$code"
  }

  for port in "${ports[@]}"; do
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 2000 \
      --enable-debug-command local \
      --save '' --appendonly no --dir "$dir/$port" --daemonize yes \
      --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
  done
  # Each node up, and the process answering on its port is ours (its pidfile
  # names it), not a stranger that took the port first.
  local ok pid
  for port in "${ports[@]}"; do
    ok=""
    for _ in $(seq 100); do
      if grep -q 'Address already in use' "$dir/$port/redis.log" 2>/dev/null; then
        fail 75 "$port" "cannot bind port $port or its bus port $((port + 10000))"
      fi
      if [ -s "$dir/$port/redis.pid" ]; then
        pid="$(cat "$dir/$port/redis.pid")"
        if redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid"; then
          ok=1
          break
        fi
      fi
      sleep 0.1
    done
    [ -n "$ok" ] || fail 1 "$port" "did not start within 10 s"
  done

  local hosts=()
  for port in "${ports[@]}"; do hosts+=("127.0.0.1:$port"); done
  # `--cluster create` waits, with no deadline of its own, for the nodes to
  # meet. On a loaded machine (two suites and a CI run at once, twelve
  # nodes starting) a node's handshake can outlast the node timeout and
  # is dropped, not retried, and the wait never ends: give it 60 s, then
  # report 75 so that the caller starts a new cluster on other ports.
  local rc=0
  timeout 60 redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$dir/create.log" >&2
    [ "$rc" -eq 124 ] && fail 75 "$base" "the nodes did not meet within 60 s"
    fail 1 "$base" "redis-cli --cluster create failed"
  fi

  # One deadline (~30 s) for the cluster to settle: every node sees
  # cluster_state:ok, and every replica's link to its master is up (else a
  # coordinated CLUSTER FAILOVER in the tests could quietly not happen).
  local deadline=$((SECONDS + 30)) info replicas
  for port in "${ports[@]}"; do
    until redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
      [ "$SECONDS" -lt "$deadline" ] || fail 1 "$port" "never reached cluster_state:ok within 30 s"
      sleep 0.1
    done
  done
  replicas=0
  for port in "${ports[@]}"; do
    while :; do
      info="$(redis-cli -p "$port" info replication 2>/dev/null | tr -d '\r')"
      grep -qx 'role:master' <<<"$info" && break
      if grep -qx 'role:slave' <<<"$info" && grep -qx 'master_link_status:up' <<<"$info"; then
        replicas=$((replicas + 1))
        break
      fi
      [ "$SECONDS" -lt "$deadline" ] ||
        fail 1 "$port" "replica's master_link_status never came up within 30 s: $(grep '^master_link_status:' <<<"$info" || echo 'no INFO replication')"
      sleep 0.1
    done
  done
  [ "$replicas" -eq 3 ] || fail 1 "$base" "expected 3 replicas with their link up, found $replicas"
  redis-cli --cluster check "127.0.0.1:$base" >"$dir/check.log" 2>&1 || {
    cat "$dir/check.log" >&2
    fail 1 "$base" "redis-cli --cluster check failed"
  }
  local IFS=,
  echo "${urls[*]}"
}

stop() {
  local dir="$1"
  for pidfile in "$dir"/*/redis.pid; do
    stop_pidfile "$pidfile"
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start [BASE_PORT] [DIR] | stop DIR" >&2; exit 2 ;;
esac
