#!/usr/bin/env bash
# Run the whole fleet stack on one machine: web, control worker, beat and three simulated GPU
# agents, on SQLite (or DATABASE_URL) and a local Redis. Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export FLEET_PORT="${FLEET_PORT:-8000}"
BIND="${FLEET_BIND:-127.0.0.1}"
VAR="${FLEET_VAR_DIR:-var}"
export FLEET_VAR_DIR="$VAR"
# Development mode (plain-http cookies, a secret key generated under var/, technical error
# pages for staff only) unless the caller says DEBUG=0; production is the default elsewhere.
export DEBUG="${DEBUG:-1}"
mkdir -p "$VAR/log"

# Jobs run as an unprivileged account and cannot read what fleet keeps under $VAR (the
# database, keys, logs). Only root can switch accounts; otherwise jobs run as this user.
if [ "$(id -u)" = 0 ]; then
  export FLEET_JOB_USER="${FLEET_JOB_USER:-fleet-job}"
  if ! id "$FLEET_JOB_USER" >/dev/null 2>&1; then
    useradd --system --user-group --home-dir "/var/lib/$FLEET_JOB_USER" --create-home \
      --shell /usr/sbin/nologin "$FLEET_JOB_USER"
  fi
  # $VAR is private, so jobs without a workdir get theirs outside it.
  export FLEET_JOB_SCRATCH_DIR="${FLEET_JOB_SCRATCH_DIR:-/var/tmp/fleet-scratch}"
  chmod 700 "$VAR"
  umask 077
  jobs_as="jobs run as: $FLEET_JOB_USER"
else
  jobs_as="jobs run as: $(id -un), not isolated from fleet (run make up as root to isolate them)"
fi

scripts/ensure-redis.sh
$BIN/python manage.py migrate --noinput -v0

# A demo admin whose password is kept under var/ so every run prints the same one.
if [ ! -s "$VAR/demo-admin-password" ]; then
  $BIN/python -c 'import secrets; print(secrets.token_urlsafe(12))' > "$VAR/demo-admin-password"
  chmod 600 "$VAR/demo-admin-password"
fi
password=$(cat "$VAR/demo-admin-password")
token=$($BIN/python manage.py add_user admin --team demo --team-admin --staff --password "$password" 2>/dev/null | tail -n 1)

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo; echo "stopping fleet"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

start() {  # name, command... (restarted whenever it exits, until Ctrl-C)
  local name=$1; shift
  scripts/supervise.sh "$@" >"$VAR/log/$name.log" 2>&1 &
  pids+=("$!")
  echo "  $name (pid $!, log $VAR/log/$name.log)"
}

echo "starting fleet:"
start web $BIN/python manage.py runserver "$BIND:$FLEET_PORT" --noreload
start control $BIN/celery -A fleet worker -Q control -n "control@%h" --concurrency 2 --loglevel INFO
start beat $BIN/celery -A fleet beat --loglevel INFO -s "$VAR/celerybeat-schedule"
if [ -f scripts/agents.sh ]; then
  # shellcheck source=/dev/null
  source scripts/agents.sh
fi

cat <<MSG

fleet is up: http://$BIND:$FLEET_PORT/
  log in as:  admin / $password
  API docs:   http://$BIND:$FLEET_PORT/api/v1/docs/
  API token:  $token
  $jobs_as
  try:        curl -H "Authorization: Token $token" http://$BIND:$FLEET_PORT/api/v1/nodes/
Ctrl-C stops everything.
MSG
wait "${pids[@]}" || true
