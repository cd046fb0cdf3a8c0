#!/usr/bin/env bash
# Starts a Redis Cluster on loopback: 3 masters and 3 replicas, daemonized,
# without persistence, in a fresh directory.
#
#   scripts/redis_cluster.sh start [BASE_PORT] [DIR]   # nodes on BASE_PORT..BASE_PORT+5
#   scripts/redis_cluster.sh stop DIR
#
# `start` waits until every node reports cluster_state:ok and every slot is
# served, then prints the nodes as a comma-separated list of URLs, the form
# KEYRATE_REDIS_CLUSTER_URLS takes. Each node's bus port is its port + 10000.
set -euo pipefail

start() {
  local base="${1:-7100}" dir="${2:-$(mktemp -d)}"
  mkdir -p "$dir"
  local ports=() urls=()
  for i in 0 1 2 3 4 5; do
    local port=$((base + i))
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 2000 \
      --enable-debug-command local \
      --save '' --appendonly no --dir "$dir/$port" --daemonize yes \
      --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
    ports+=("$port")
    urls+=("redis://127.0.0.1:$port")
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 100); do
      redis-cli -p "$port" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    redis-cli -p "$port" ping >/dev/null
  done
  local hosts=()
  for port in "${ports[@]}"; do hosts+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
    cat "$dir/create.log" >&2
    exit 1
  }
  for port in "${ports[@]}"; do
    for _ in $(seq 300); do
      if redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then break; fi
      sleep 0.1
    done
    redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok' || {
      echo "node $port never reached cluster_state:ok" >&2
      exit 1
    }
  done
  redis-cli --cluster check "127.0.0.1:$base" >"$dir/check.log" 2>&1 || {
    cat "$dir/check.log" >&2
    exit 1
  }
  local IFS=,
  echo "${urls[*]}"
}

stop() {
  local dir="$1"
  for pidfile in "$dir"/*/redis.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start [BASE_PORT] [DIR] | stop DIR" >&2; exit 2 ;;
esac
