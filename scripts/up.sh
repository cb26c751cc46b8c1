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
# Its warnings go to a log; a failure says why instead of ending the script without a word.
if ! token=$($BIN/python manage.py add_user admin --team demo --team-admin --staff \
    --password "$password" 2>"$VAR/log/add_user.log" | tail -n 1); then
  echo "could not create the demo admin; manage.py add_user said:" >&2
  cat "$VAR/log/add_user.log" >&2
  exit 1
fi

pids=()
agents=()
STOP_GRACE_S="${FLEET_UP_STOP_GRACE:-10}"

# Jobs run in sessions of their own (each under a shim, outside the agent), so neither
# Ctrl-C nor stopping an agent reaches them: an agent that restarts adopts its jobs. When
# `make up` stops, nothing it started may keep running, so every attempt the agents under
# $VAR still run is stopped here: SIGTERM to the job's process group and to all the shim
# holds (the shim is a child subreaper, so it holds what the job left behind, even in
# sessions of its own), SIGKILL after the grace, then the shim itself. A record is trusted
# only while its shim is the very process that was started (same start time).
stop_jobs() {
  $BIN/python - "$VAR" "$STOP_GRACE_S" <<'PY' || true
import json, os, signal, sys
from pathlib import Path

import psutil

var, grace = Path(sys.argv[1]), float(sys.argv[2])
shims, jobs = [], []
for record in sorted(var.glob("agents/*/**/record.json")):
    if (record.parent / "status.json").exists():
        continue
    try:
        r = json.loads(record.read_text())
        shim = psutil.Process(int(r["shim_pid"]))
        born = r.get("shim_create_time")
        if born is not None and abs(shim.create_time() - float(born)) > 1.0:
            continue  # the pid belongs to another process now
        held = shim.children(recursive=True)
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        continue
    shims.append(shim)
    jobs += held
    if int(r.get("pid") or 0) > 0:
        try:
            os.killpg(int(r["pid"]), signal.SIGTERM)
        except OSError:
            pass
if not shims:
    sys.exit(0)
print(f"stopping {len(shims)} job(s) the agents were running")
for proc in jobs:
    try:
        proc.send_signal(signal.SIGTERM)
    except psutil.Error:
        pass
_, alive = psutil.wait_procs(jobs, timeout=grace)
for proc in alive:
    try:
        proc.kill()
    except psutil.Error:
        pass
psutil.wait_procs(alive, timeout=5)
# The shim writes how its job ended and exits once the job's group is gone.
_, alive = psutil.wait_procs(shims, timeout=10)
for proc in alive:
    try:
        proc.kill()
    except psutil.Error:
        pass
PY
}

cleanup() {
  trap - INT TERM EXIT
  echo; echo "stopping fleet"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # Each supervisor stops its process and exits; one that is still there after the grace
  # is killed with what it runs.
  local deadline=$((SECONDS + STOP_GRACE_S + 10))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      pkill -KILL -P "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  wait 2>/dev/null || true
  stop_jobs
  # What they ran is gone: requeue it now (as for a lost node), so no job shows as running
  # while nothing runs it; the agents' later reports of those attempts change nothing.
  if [ "${#agents[@]}" -gt 0 ]; then
    $BIN/python manage.py requeue_node_jobs --reason "make up was stopped" "${agents[@]}" \
      2>>"$VAR/log/stop.log" || echo "could not requeue their jobs (see $VAR/log/stop.log)"
  fi
}
trap cleanup INT TERM EXIT

start() {  # name, command... (restarted whenever it exits, until Ctrl-C)
  local name=$1; shift
  scripts/supervise.sh "$@" >"$VAR/log/$name.log" 2>&1 &
  pids+=("$!")
  case "$name" in agent-*) agents+=("${name#agent-}") ;; esac
  echo "  $name (pid $!, log $VAR/log/$name.log)"
}

# Up means ready: /readyz answers 200 (database, Redis, a control worker, beat) and every
# agent started here has registered its GPUs and sent a heartbeat. Gives up after
# FLEET_UP_TIMEOUT seconds and says what is missing.
wait_ready() {
  $BIN/python - "http://$BIND:$FLEET_PORT" "$token" "${FLEET_UP_TIMEOUT:-120}" "${agents[@]}" <<'PY'
import json, sys, time, urllib.error, urllib.request

base, token, timeout, agents = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]


def get(path, auth=False):
    req = urllib.request.Request(base + path)
    if auth:
        req.add_header("Authorization", f"Token {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, {}
    except (OSError, ValueError) as e:
        return 0, {"web": str(e)}


deadline, missing = time.monotonic() + timeout, ["web"]
try:
    while time.monotonic() < deadline:
        status, ready = get("/readyz")
        missing = [] if status == 200 else [f"{k}: {v}" for k, v in ready.items() if k != "status"]
        if status == 200 and agents:
            _, nodes = get("/api/v1/nodes/", auth=True)
            seen = {n["name"]: n for n in nodes} if isinstance(nodes, list) else {}
            missing = [f"agent {a} has not registered" for a in agents
                       if not (seen.get(a, {}).get("last_heartbeat") and seen[a].get("gpus"))]
        if not missing:
            sys.exit(0)
        time.sleep(1)
except KeyboardInterrupt:
    sys.exit(130)
print("fleet is not ready after %d s:" % timeout, *missing, sep="\n  ", file=sys.stderr)
sys.exit(1)
PY
}

echo "starting fleet:"
# gunicorn serves the web and REST API with several workers (threads for the pages' live
# polls); WhiteNoise serves the static files from var/staticfiles.
$BIN/python manage.py collectstatic --noinput -v0
start web $BIN/gunicorn fleet.wsgi --bind "$BIND:$FLEET_PORT" \
  --workers "${FLEET_WEB_WORKERS:-3}" --threads "${FLEET_WEB_THREADS:-4}" \
  --graceful-timeout 5 --timeout 60 --access-logfile "$VAR/log/web-access.log"
start control $BIN/celery -A fleet worker -Q control -n "control@%h" --concurrency 2 --loglevel INFO
start beat $BIN/celery -A fleet beat --loglevel INFO -s "$VAR/celerybeat-schedule"
if [ -f scripts/agents.sh ]; then
  # shellcheck source=/dev/null
  source scripts/agents.sh
fi

echo "waiting for fleet to be ready (at most ${FLEET_UP_TIMEOUT:-120} s)"
if wait_ready; then
  status="fleet is up"
else
  status="fleet started but is not ready yet (see the logs above)"
fi

cat <<MSG

$status: http://$BIND:$FLEET_PORT/
  log in as:  admin / $password
  API docs:   http://$BIND:$FLEET_PORT/api/v1/docs/
  API token:  $token
  $jobs_as
  try:        curl -H "Authorization: Token $token" http://$BIND:$FLEET_PORT/api/v1/nodes/
Ctrl-C stops everything.
MSG
wait "${pids[@]}" || true
