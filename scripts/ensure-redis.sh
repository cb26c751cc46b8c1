#!/usr/bin/env bash
# Make sure a Redis answers at REDIS_URL (default redis://127.0.0.1:6379/0). When none does,
# start a local redis-server; where it is not installed, install it (apt-get, as root) or say
# exactly how to.
set -euo pipefail
url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
# redis://[user:pass@]host[:port][/db]
hostport=${url#*://}; hostport=${hostport#*@}; hostport=${hostport%%/*}
host=${hostport%%:*}; port=${hostport##*:}
[ "$port" = "$hostport" ] && port=6379
[ -n "$host" ] || host=127.0.0.1

ping() {  # no client needed: speak RESP over bash's /dev/tcp
  local reply
  { exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  read -r -t 2 reply <&3 || true
  exec 3<&- 3>&-
  # A password-protected Redis answers NOAUTH: it is up.
  case "$reply" in +PONG*|-NOAUTH*) return 0 ;; *) return 1 ;; esac
}

if [ "${url%%://*}" = rediss ]; then
  # TLS (and a password): an operator's Redis, never started here. Something must listen.
  if { exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null; then exec 3<&- 3>&-; exit 0; fi
  echo "No Redis listens at $host:$port (REDIS_URL is rediss://: start that Redis yourself," >&2
  echo "see the README's broker credentials, or use a redis:// URL for a local one)." >&2
  exit 1
fi
ping && exit 0
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing; installing it with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }
  else
    echo "No Redis answers at $url and redis-server is not installed." >&2
    echo "Install it: sudo apt-get install redis-server   (Debian/Ubuntu)" >&2
    echo "        or: brew install redis                   (macOS)" >&2
    echo "or point REDIS_URL at a running Redis." >&2
    exit 1
  fi
fi
mkdir -p var
echo "starting redis-server on port $port" >&2
redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
  --dir "$PWD/var" --logfile "$PWD/var/redis.log"
for _ in $(seq 1 50); do ping && exit 0; sleep 0.1; done
echo "redis-server did not answer on port $port; see var/redis.log" >&2
exit 1
