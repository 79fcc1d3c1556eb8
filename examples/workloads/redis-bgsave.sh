#!/usr/bin/env bash
# A redis-server snapshotting itself: N keys (default 300,000) made by
# DEBUG POPULATE, then three rounds of N/10 more keys and a BGSAVE (a fork
# whose child writes every key to an RDB file), each RDB checked by
# redis-check-rdb; then the last RDB is loaded by a second server, whose
# digest must be the first one's. Everything runs on a Unix socket in a
# temporary directory (no TCP port). Prints the key counts, the digests
# and each round's status: the same every run, natively or not.
#
# usage: redis-bgsave.sh [N]      (needs redis-server, redis-cli, redis-check-rdb)
# e.g.:  ztier run --budget 16M -- examples/workloads/redis-bgsave.sh
set -u
n=${1:-300000}
d=$(mktemp -d "${TMPDIR:-/tmp}/redis-bgsave.XXXXXX")
sock=$d/sock
trap 'rm -rf "$d"' EXIT
c() { redis-cli -s "$sock" "$@"; }
serve() {
    redis-server --port 0 --unixsocket "$sock" --dir "$d" --dbfilename dump.rdb --save '' \
        --appendonly no --enable-debug-command yes --daemonize no --loglevel warning > "$d/$1.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [ -S "$sock" ] && [ "$(c INFO persistence 2>/dev/null | grep -c '^loading:0')" = 1 ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "redis-server did not start: $(cat "$d/$1.log")" >&2
    exit 1
}
serve first
c DEBUG POPULATE "$n" key 64 > /dev/null
echo "keys $(c DBSIZE) digest $(c DEBUG DIGEST)"
for round in 1 2 3; do
    c DEBUG POPULATE $((n / 10)) "round$round:" 32 > /dev/null
    c BGSAVE > /dev/null
    while c INFO persistence | grep -q '^rdb_bgsave_in_progress:1'; do sleep 0.05; done
    status=$(c INFO persistence | grep '^rdb_last_bgsave_status' | tr -d '\r')
    check=$(redis-check-rdb "$d/dump.rdb" | grep -c 'RDB looks OK')
    echo "round $round: $status, redis-check-rdb ok $check"
done
want=$(c DEBUG DIGEST)
echo "keys $(c DBSIZE) digest $want"
c SHUTDOWN NOSAVE > /dev/null 2>&1
wait "$pid"
serve second
got=$(c DEBUG DIGEST)
echo "reloaded: keys $(c DBSIZE), digest $([ "$got" = "$want" ] && echo same || echo "differs: $got")"
kill "$pid"
wait "$pid"
