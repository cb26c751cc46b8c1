#!/usr/bin/env bash
# Keep one fleet process running: `scripts/supervise.sh COMMAND...` runs it and, whenever it
# exits (beat or the control worker giving up during a database or Redis outage, an agent
# killed), starts it again after a pause that doubles up to 30 s (back to 1 s once it has
# run for a minute). SIGTERM or SIGINT stops the process and the supervisor with it.
set -u
child=0
stopping=0
stop() {
  stopping=1
  [ "$child" -gt 0 ] && kill -TERM "$child" 2>/dev/null
}
trap stop INT TERM

delay=1
while :; do
  started=$SECONDS
  "$@" &
  child=$!
  # `wait` returns early when a trapped signal arrives; wait until the child is really gone.
  while kill -0 "$child" 2>/dev/null; do wait "$child"; done
  wait "$child" 2>/dev/null
  rc=$?
  [ "$stopping" = 1 ] && exit 0
  [ $((SECONDS - started)) -ge 60 ] && delay=1
  echo "supervise: '$*' exited with status $rc; starting it again in ${delay} s" >&2
  sleep "$delay" &
  wait $! 2>/dev/null
  [ "$stopping" = 1 ] && exit 0
  delay=$((delay < 30 ? delay * 2 : 30))
done
