#!/bin/sh
# Make a private CA and a TLS certificate for Redis, signed by it:
#
#   scripts/make-redis-certs.sh [DIR] [NAME...]
#
# DIR (default var/redis-tls) receives ca.crt (give it to every fleet process and GPU host
# as FLEET_REDIS_CA_FILE), ca.key (keep it there, or offline: it signs new certificates),
# redis.crt and redis.key (for redis-server only). The certificate names `redis` (the
# compose service), `localhost`, 127.0.0.1 and every NAME given: add the host name or
# address the GPU hosts use to reach Redis. Existing files are kept; delete them to renew.
set -eu

dir="${1:-var/redis-tls}"
[ $# -gt 0 ] && shift
days="${FLEET_REDIS_CERT_DAYS:-825}"
command -v openssl >/dev/null || { echo "openssl is needed (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"

if [ ! -f ca.key ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
        -days 3650 -subj "/CN=fleet Redis CA" -keyout ca.key -out ca.crt 2>/dev/null
    chmod 600 ca.key
    chmod 644 ca.crt
fi

if [ ! -f redis.key ]; then
    san="DNS:redis,DNS:localhost,IP:127.0.0.1"
    for name in "$@"; do
        case "$name" in
            *[!0-9.]*) san="$san,DNS:$name" ;;
            *) san="$san,IP:$name" ;;
        esac
    done
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
        -subj "/CN=redis" -keyout redis.key -out redis.csr 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' \
        "$san" >redis.ext
    openssl x509 -req -in redis.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 \
        -days "$days" -extfile redis.ext -out redis.crt 2>/dev/null
    rm -f redis.csr redis.ext ca.srl
    # The redis container's own user must read the key; the folder stays 0700 on the host.
    chmod 644 redis.key redis.crt
fi

echo "Redis TLS files in $dir: ca.crt (for fleet and the GPU hosts), redis.crt, redis.key"
