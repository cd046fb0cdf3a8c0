#!/usr/bin/env bash
# Runs every test: unit, integration, doc and loom.
#
# With redis-server installed it starts throwaway servers for the Redis
# tests (one standalone Redis and a 3-master/3-replica Redis Cluster, see
# scripts/redis_cluster.sh) on free loopback ports, and stops them on any
# exit. A server the caller names already (KEYRATE_REDIS_URL,
# KEYRATE_REDIS_CLUSTER_URLS) is used instead of starting one. Without
# redis-server the Redis tests are left out and the end of the run says so;
# with CI set that is a failure instead. Likewise without promtool the
# server tests' /metrics scrapes are not linted, and the end says so.
#
# Every test binary runs (--no-fail-fast); the exit status is non-zero if
# anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- throwaway servers, stopped on any exit --------------------------------

SERVER_DIRS=()

stop_servers() {
  local dir
  for dir in ${SERVER_DIRS[@]+"${SERVER_DIRS[@]}"}; do
    bash scripts/redis_cluster.sh stop "$dir" || true
    rm -rf "$dir"
  done
  SERVER_DIRS=()
}
trap stop_servers EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# Ports for the servers: below the kernel's ephemeral range, so that no
# outgoing connection takes one between the check and the server's bind.
# A cluster node's bus port is its port + 10000, so both must fit below.
EPHEMERAL_LOW="$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
if [ "$((EPHEMERAL_LOW - 10006))" -ge 20000 ]; then
  CLUSTER_LO=20000 CLUSTER_HI=$((EPHEMERAL_LOW - 10006))
  STANDALONE_LO=10000 STANDALONE_HI=$((EPHEMERAL_LOW - 1))
else
  # No room below the ephemeral range; the retries have to do.
  CLUSTER_LO=20000 CLUSTER_HI=45000
  STANDALONE_LO=10000 STANDALONE_HI=55000
fi

random_in() { # LO HI
  echo $(($1 + (RANDOM * 32768 + RANDOM) % ($2 - $1 + 1)))
}

port_free() { # PORT: no socket of any state on it
  if command -v ss >/dev/null 2>&1; then
    [ -z "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
  else
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

# Starts one standalone Redis on PORT in DIR/PORT (the layout of
# scripts/redis_cluster.sh, whose `stop DIR` stops it); 0 when it answers as
# ours, 75 when it could not bind the port, 1 otherwise.
start_standalone() { # PORT DIR
  local port="$1" dir="$2/$1" pid
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 100); do
    grep -q 'Address already in use' "$dir/redis.log" 2>/dev/null && return 75
    if [ -s "$dir/redis.pid" ]; then
      pid="$(cat "$dir/redis.pid")"
      redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid" && return 0
    fi
    sleep 0.1
  done
  echo "redis-server on port $port did not start within 10 s:" >&2
  tail -n 30 "$dir/redis.log" >&2 || true
  return 1
}

new_dir() {
  NEW_DIR="$(mktemp -d "${TMPDIR:-/tmp}/keyrate-redis.XXXXXX")"
  SERVER_DIRS+=("$NEW_DIR")
}

REDIS_NOTE=()  # what the Redis tests ran against, for the summary

start_redis_servers() {
  local attempt port base rc urls="" i free started=""
  command -v redis-cli >/dev/null 2>&1 || {
    echo "redis-server is installed but redis-cli is not (apt-get install redis-tools)" >&2
    exit 1
  }
  export KEYRATE_REDIS_SERVER_BIN="${KEYRATE_REDIS_SERVER_BIN:-$(command -v redis-server)}"

  if [ -n "${KEYRATE_REDIS_URL:-}" ]; then
    REDIS_NOTE+=("Redis: $KEYRATE_REDIS_URL (from KEYRATE_REDIS_URL)")
  else
    for attempt in $(seq 10); do
      port="$(random_in "$STANDALONE_LO" "$STANDALONE_HI")"
      port_free "$port" || continue
      new_dir
      rc=0
      start_standalone "$port" "$NEW_DIR" || rc=$?
      [ "$rc" -eq 0 ] && { started=1; break; }
      stop_servers_in "$NEW_DIR"
      [ "$rc" -eq 75 ] || exit 1
      echo "== port $port was taken; retrying with another (attempt $attempt)"
    done
    [ -n "$started" ] || { echo "could not start a standalone redis-server on a free port" >&2; exit 1; }
    export KEYRATE_REDIS_URL="redis://127.0.0.1:$port"
    echo "== Redis on $KEYRATE_REDIS_URL"
    REDIS_NOTE+=("Redis: $KEYRATE_REDIS_URL (started by this script)")
  fi

  if [ -n "${KEYRATE_REDIS_CLUSTER_URLS:-}" ]; then
    REDIS_NOTE+=("Redis Cluster: $KEYRATE_REDIS_CLUSTER_URLS (from KEYRATE_REDIS_CLUSTER_URLS)")
  else
    for attempt in $(seq 10); do
      base="$(random_in "$CLUSTER_LO" "$CLUSTER_HI")"
      free=1
      for i in 0 1 2 3 4 5; do
        port_free "$((base + i))" && port_free "$((base + i + 10000))" || { free=""; break; }
      done
      [ -n "$free" ] || continue
      new_dir
      echo "== Redis Cluster on ports $base..$((base + 5)) (bus $((base + 10000))..$((base + 10005)))"
      rc=0
      urls="$(bash scripts/redis_cluster.sh start "$base" "$NEW_DIR")" || rc=$?
      [ "$rc" -eq 0 ] && break
      urls=""
      stop_servers_in "$NEW_DIR"
      [ "$rc" -eq 75 ] || exit 1
      echo "== the cluster did not start (a port taken, or its nodes did not meet); retrying with another base (attempt $attempt)"
    done
    [ -n "$urls" ] || { echo "could not start a Redis Cluster on free ports" >&2; exit 1; }
    export KEYRATE_REDIS_CLUSTER_URLS="$urls"
    REDIS_NOTE+=("Redis Cluster: $KEYRATE_REDIS_CLUSTER_URLS (started by this script)")
  fi
}

# Stops the servers in one of SERVER_DIRS and forgets it.
stop_servers_in() { # DIR
  local keep=() dir
  for dir in "${SERVER_DIRS[@]}"; do
    if [ "$dir" = "$1" ]; then
      bash scripts/redis_cluster.sh stop "$dir" || true
      rm -rf "$dir"
    else
      keep+=("$dir")
    fi
  done
  SERVER_DIRS=(${keep[@]+"${keep[@]}"})
}

# ---- the tests --------------------------------------------------------------

FAILED=()

if command -v redis-server >/dev/null 2>&1; then
  HAVE_REDIS=1
  FEATURES=(--all-features)
  start_redis_servers
else
  HAVE_REDIS=""
  if [ -n "${CI:-}" ]; then
    echo "CI is set but redis-server is not installed: the Redis tests cannot be skipped in CI" >&2
    echo "(apt-get install redis-server, or run .ci/run which installs it)" >&2
    exit 1
  fi
  FEATURES=(--features tokio,tower,prometheus)
  echo "== redis-server is not installed: the Redis tests are left out (see the end of the run)"
fi

echo "== cargo test ${FEATURES[*]}"
cargo test --no-fail-fast "${FEATURES[@]}" || FAILED+=("cargo test ${FEATURES[*]}")

if [ -f loom_tests/main.rs ]; then
  echo "== loom model checks"
  # Beside the caller's target dir when there is one, else target/loom.
  if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    LOOM_TARGET_DIR="${CARGO_TARGET_DIR%/}-loom"
  else
    LOOM_TARGET_DIR=target/loom
  fi
  RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    CARGO_TARGET_DIR="$LOOM_TARGET_DIR" \
    cargo test --release --test loom || FAILED+=("loom model checks")
fi

# ---- summary ------------------------------------------------------------------

echo
echo "== summary"
if [ -n "$HAVE_REDIS" ]; then
  for note in "${REDIS_NOTE[@]}"; do echo "$note"; done
else
  # Count what was left out: the test binaries that need the redis
  # features (from Cargo.toml), and the unit tests and doctests that only
  # the redis features build. Listing builds them; it needs no server.
  REDIS_BINS="$(python3 - <<'PY'
import tomllib
with open("Cargo.toml", "rb") as f:
    manifest = tomllib.load(f)
print(" ".join(t["name"] for t in manifest.get("test", [])
               if any(f.startswith("redis") for f in t.get("required-features", []))))
PY
)"
  listed() { cargo test -q "$@" -- --list 2>/dev/null | grep -c ': test$' || true; }
  SKIPPED_TESTS=0
  for bin in $REDIS_BINS; do
    SKIPPED_TESTS=$((SKIPPED_TESTS + $(listed --all-features --test "$bin")))
  done
  SKIPPED_UNIT=$(( $(listed --all-features --lib) - $(listed "${FEATURES[@]}" --lib) ))
  SKIPPED_DOC=$(( $(listed --all-features --doc) - $(listed "${FEATURES[@]}" --doc) ))
  echo "!!! SKIPPED: $((SKIPPED_TESTS + SKIPPED_UNIT + SKIPPED_DOC)) Redis tests, because redis-server is not installed:"
  echo "!!! $SKIPPED_TESTS in the test binaries $REDIS_BINS,"
  echo "!!! $SKIPPED_UNIT unit tests and $SKIPPED_DOC doctests that only the redis features build."
  echo "!!! To run them: apt-get install redis-server  (then run this script again;"
  echo "!!! it starts and stops throwaway servers itself)."
  if [ -n "${KEYRATE_REDIS_URL:-}${KEYRATE_REDIS_CLUSTER_URLS:-}" ]; then
    echo "!!! (KEYRATE_REDIS_URL/KEYRATE_REDIS_CLUSTER_URLS are set, but the restart test needs redis-server too.)"
  fi
fi
# The server tests lint each /metrics scrape with promtool when it is on
# PATH (tests/server_support: with CI set they fail without it). Without
# it they pass unlinted, saying so only on stderr, which libtest hides.
if ! command -v promtool >/dev/null 2>&1; then
  echo "!!! SKIPPED: the promtool lint of the server tests' /metrics scrapes,"
  echo "!!! because promtool is not installed (apt-get install prometheus;"
  echo "!!! with CI set the server tests fail without it)."
fi
if [ "${#FAILED[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "all passed"
