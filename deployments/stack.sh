#!/usr/bin/env bash
# The production stack on one machine, for trying it (docs/prefect-server.md, "The stack on
# PostgreSQL"): a PostgreSQL cluster of its own, a Redis for the Prefect server's events,
# `prefect server start` on both, the Whitney server, the work pool, the credentials block, the
# deployments and automations, two workers.
#
#   deployments/stack.sh up       start what is not running (set up the pool, block and
#                                 deployments the first time)
#   deployments/stack.sh status   what runs, by PID, and where
#   deployments/stack.sh down     stop what this script started, by PID (its pid files)
#
# Everything lives in WHITNEY_STACK_DIR (default ~/.local/state/whitney-stack): the cluster,
# the Redis append-only file, the Prefect home, the Whitney data, the logs, the pid files, and
# `secrets` (mode 0600: the database and Redis passwords and the Whitney key; they reach the
# processes in their environment or Redis's 0600 config file, never on a command line).
# Ports: WHITNEY_STACK_PG_PORT (5433), WHITNEY_STACK_REDIS_PORT (6380),
# WHITNEY_STACK_PREFECT_PORT (4200), WHITNEY_STACK_WHITNEY_PORT (8765); WHITNEY_STACK_WORKERS
# (2); WHITNEY_STACK_REDIS=0 leaves Redis out (the server's events then wait in its memory,
# and a SIGKILL of it loses those not yet written). Run it from the
# repository root's virtualenv (prefect, whitney-flows and python on PATH). As root,
# PostgreSQL runs as the `postgres` user, which must be able to reach WHITNEY_STACK_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
state=${WHITNEY_STACK_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/whitney-stack}
pg_port=${WHITNEY_STACK_PG_PORT:-5433}
redis_port=${WHITNEY_STACK_REDIS_PORT:-6380}
with_redis=${WHITNEY_STACK_REDIS:-1}
prefect_port=${WHITNEY_STACK_PREFECT_PORT:-4200}
whitney_port=${WHITNEY_STACK_WHITNEY_PORT:-8765}
workers=${WHITNEY_STACK_WORKERS:-2}
pool=whitney-process
pids=$state/pids
logs=$state/logs
pgdata=$state/postgres
export PREFECT_HOME=$state/prefect-home
export PREFECT_API_URL=http://127.0.0.1:$prefect_port/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_CLI_COLORS=false PYTHONUNBUFFERED=1

say() { echo "stack: $*"; }
die() { echo "stack: $*" >&2; exit 2; }

pg_bin() {  # Debian keeps the server programs out of PATH
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$found" ]; then echo "$found"; return; fi
  command -v initdb >/dev/null 2>&1 || die "PostgreSQL is not installed (no initdb): apt-get install postgresql"
  dirname "$(command -v initdb)"
}

as_pg() {  # PostgreSQL refuses to run as root
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# A part runs when its pid file names a live process whose command line still holds the
# part's marker (a reused PID is not ours).
alive() {
  local file=$pids/$1.pid marker=$2 pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$marker"
}

pid_of() { cat "$pids/$1.pid"; }

# Start a part in a session of its own (its own process group), its output in logs/NAME.log.
launch() {
  local name=$1; shift
  setsid "$@" >> "$logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$pids/$name.pid"
}

wait_until() {  # wait_until WHAT SECONDS COMMAND...
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then die "$what did not come up in ${seconds}s (see $logs)"; fi
    sleep 1
  done
}

secrets() {  # the database and Redis passwords and the Whitney key, made once each
  if [ ! -f "$state/secrets" ]; then
    (umask 077; python -c "import secrets
print('PG_PASSWORD=' + secrets.token_hex(24))
print('WHITNEY_KEY=' + secrets.token_urlsafe(24))" > "$state/secrets")
  fi
  if ! grep -q '^REDIS_PASSWORD=' "$state/secrets"; then  # a state directory made before Redis
    python -c "import secrets; print('REDIS_PASSWORD=' + secrets.token_hex(24))" >> "$state/secrets"
  fi
  # shellcheck disable=SC1091
  . "$state/secrets"
}

pg_marker() { echo "-D $pgdata"; }
redis_marker() { echo "redis-server 127.0.0.1:$redis_port"; }  # Redis's own process title
prefect_marker() { echo "server start --host 127.0.0.1 --port $prefect_port"; }
whitney_marker() { echo "serve --host 127.0.0.1 --port $whitney_port"; }
worker_marker() { echo "worker start --pool $pool --name stack-worker-$1"; }

up_postgres() {
  if alive postgres "$(pg_marker)"; then say "postgres already running (pid $(pid_of postgres))"; return; fi
  local bin; bin=$(pg_bin)
  if [ ! -f "$pgdata/PG_VERSION" ]; then
    mkdir -p "$pgdata"
    local pwfile=$pgdata.pw
    (umask 077; echo "$PG_PASSWORD" > "$pwfile")
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres "$pgdata" "$pwfile"
      runuser -u postgres -- test -x "$state" || die "the postgres user cannot reach $state: set WHITNEY_STACK_DIR to a directory it can (e.g. /srv/whitney-stack)"
    fi
    as_pg "$bin/initdb" -D "$pgdata" -U whitney --pwfile="$pwfile" --auth=scram-sha-256 -E UTF8 \
      >> "$logs/postgres-initdb.log" 2>&1 || { rm -f "$pwfile"; die "initdb failed (see $logs/postgres-initdb.log)"; }
    rm -f "$pwfile"
    local fresh=1
  fi
  local runner=()
  if [ "$(id -u)" -eq 0 ]; then runner=(runuser -u postgres --); fi
  launch postgres-runner "${runner[@]}" "$bin/postgres" -D "$pgdata" -h 127.0.0.1 -p "$pg_port" -k "$pgdata" -c max_connections=200
  export PGPASSWORD=$PG_PASSWORD
  wait_until "postgres" 60 "$bin/pg_isready" -h 127.0.0.1 -p "$pg_port" -U whitney -d postgres
  head -n 1 "$pgdata/postmaster.pid" > "$pids/postgres.pid"  # the postmaster itself
  rm -f "$pids/postgres-runner.pid"
  if [ -n "${fresh:-}" ]; then
    "$bin/createdb" -h 127.0.0.1 -p "$pg_port" -U whitney prefect
  fi
  unset PGPASSWORD
  say "postgres started (pid $(pid_of postgres), 127.0.0.1:$pg_port, database prefect)"
}

redis_answers() {  # the password in the environment, not on the command line
  REDIS_PASSWORD=$REDIS_PASSWORD python -c "import os, redis, sys
sys.exit(not redis.Redis(port=$redis_port, password=os.environ['REDIS_PASSWORD'], socket_timeout=2).ping())"
}

up_redis() {
  if alive redis "$(redis_marker)"; then say "redis already running (pid $(pid_of redis))"; return; fi
  command -v redis-server >/dev/null 2>&1 || die "Redis is not installed (no redis-server): apt-get install redis-server, or WHITNEY_STACK_REDIS=0"
  python -c "import prefect_redis" 2>/dev/null || die "prefect-redis is not installed: pip install -e '.[redis]', or WHITNEY_STACK_REDIS=0"
  mkdir -p "$state/redis"
  (umask 077; printf '%s\n' "bind 127.0.0.1" "port $redis_port" "requirepass $REDIS_PASSWORD" \
    "dir $state/redis" "appendonly yes" "appendfsync everysec" 'save ""' "daemonize no" \
    > "$state/redis/redis.conf")
  launch redis redis-server "$state/redis/redis.conf"
  wait_until "redis" 60 redis_answers
  say "redis started (pid $(pid_of redis), 127.0.0.1:$redis_port)"
}

up_prefect() {
  if alive prefect-server "$(prefect_marker)"; then say "prefect server already running (pid $(pid_of prefect-server))"; return; fi
  # the project's server settings (flows/core/orchestration/prefect_env.py), then the database URL
  eval "$(python -c 'from flows.core.orchestration.prefect_env import SERVER_SETTINGS as s
print("\n".join(f"export {k}={v}" for k, v in s.items()))')"
  if [ "$with_redis" = 1 ]; then  # its events in Redis streams (and the password in its environment)
    eval "$(python -c 'from flows.core.orchestration.prefect_env import REDIS_BROKER_SETTINGS as s
print("\n".join(f"export {k}={v}" for k, v in s.items()))')"
    export PREFECT_REDIS_MESSAGING_HOST=127.0.0.1 PREFECT_REDIS_MESSAGING_PORT=$redis_port
    export PREFECT_REDIS_MESSAGING_PASSWORD=$REDIS_PASSWORD
  fi
  PREFECT_API_DATABASE_CONNECTION_URL="postgresql+asyncpg://whitney:$PG_PASSWORD@127.0.0.1:$pg_port/prefect" \
    launch prefect-server prefect server start --host 127.0.0.1 --port "$prefect_port"
  wait_until "the Prefect server" 180 python -c "import httpx, sys; sys.exit(httpx.get('$PREFECT_API_URL/health', timeout=2).status_code != 200)"
  say "prefect server started (pid $(pid_of prefect-server), UI http://127.0.0.1:$prefect_port)"
}

up_whitney() {
  if alive whitney "$(whitney_marker)"; then say "whitney already running (pid $(pid_of whitney))"; return; fi
  WHITNEY_LOCAL_API_KEYS=$WHITNEY_KEY launch whitney \
    whitney-flows serve --host 127.0.0.1 --port "$whitney_port" --data-dir "$state/whitney-data"
  wait_until "the Whitney server" 90 python -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$whitney_port/v1/training/capabilities', timeout=2).status_code >= 500)"
  say "whitney started (pid $(pid_of whitney), http://127.0.0.1:$whitney_port)"
}

set_up_once() {  # the pool, the block, the deployments and automations: in the database
  if [ -f "$state/set-up" ]; then return; fi
  prefect work-pool inspect "$pool" >/dev/null 2>&1 || prefect work-pool create "$pool" --type process >> "$logs/setup.log"
  prefect block register -m blocks >> "$logs/setup.log"
  WHITNEY_API_KEY=$WHITNEY_KEY python -m blocks save whitney --base-url "http://127.0.0.1:$whitney_port" --overwrite >> "$logs/setup.log"
  python -m blocks check whitney >> "$logs/setup.log"
  prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml >> "$logs/setup.log" 2>&1
  prefect automation create --from-file deployments/automations.yaml >> "$logs/setup.log"
  prefect automation create --from-file deployments/stall-automations.yaml >> "$logs/setup.log"
  touch "$state/set-up"
  say "work pool $pool, block whitney, deployments and automations set up"
}

up_workers() {
  local i
  for i in $(seq 1 "$workers"); do
    if alive "worker-$i" "$(worker_marker "$i")"; then say "worker-$i already running (pid $(pid_of "worker-$i"))"; continue; fi
    # no Whitney URL or key here: the flow runs read the block
    launch "worker-$i" prefect worker start --pool "$pool" --name "stack-worker-$i"
    wait_until "worker-$i" 120 python -c "import httpx, sys
workers = httpx.post('$PREFECT_API_URL/work_pools/$pool/workers/filter', json={}, timeout=5).json()
sys.exit(not any(w['name'] == 'stack-worker-$i' and w['status'] == 'ONLINE' for w in workers))"
    say "worker-$i started (pid $(pid_of "worker-$i"), online)"
  done
}

stop_part() {  # stop_part NAME MARKER SIGNAL: the signal to its group, then SIGKILL after 30 s
  local name=$1 marker=$2 sig=$3 pid
  if ! alive "$name" "$marker"; then rm -f "$pids/$name.pid"; return; fi
  pid=$(pid_of "$name")
  if [ "$name" = postgres ]; then kill "-$sig" "$pid"; else kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid"; fi
  local began=$SECONDS deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pids/$name.pid"
  say "$name stopped (pid $pid, $((SECONDS - began)) s)"
}

show() {  # show NAME MARKER WHERE: one line of `status`
  if alive "$1" "$2"; then echo "$1: running (pid $(pid_of "$1"), $3)"; else echo "$1: not running"; fi
}

status() {
  local i
  show postgres "$(pg_marker)" "127.0.0.1:$pg_port"
  if [ "$with_redis" = 1 ]; then show redis "$(redis_marker)" "127.0.0.1:$redis_port"; fi
  show prefect-server "$(prefect_marker)" "http://127.0.0.1:$prefect_port"
  show whitney "$(whitney_marker)" "http://127.0.0.1:$whitney_port"
  for i in $(seq 1 "$workers"); do show "worker-$i" "$(worker_marker "$i")" "pool $pool"; done
}

case "${1:-}" in
  up)
    mkdir -p "$state" "$pids" "$logs"
    chmod 755 "$state"
    secrets
    up_postgres
    if [ "$with_redis" = 1 ]; then up_redis; fi
    up_prefect
    up_whitney
    set_up_once
    up_workers
    ;;
  down)
    [ -d "$pids" ] || { say "nothing started from $state"; exit 0; }
    for i in $(seq "$workers" -1 1); do stop_part "worker-$i" "$(worker_marker "$i")" INT; done
    stop_part whitney "$(whitney_marker)" TERM
    stop_part prefect-server "$(prefect_marker)" TERM
    stop_part redis "$(redis_marker)" TERM
    stop_part postgres "$(pg_marker)" INT  # fast shutdown
    ;;
  status)
    status
    ;;
  *)
    echo "usage: deployments/stack.sh up|down|status" >&2
    exit 2
    ;;
esac
