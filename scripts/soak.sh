#!/bin/bash
# scripts/soak.sh [ROUNDS]: runs the `ztier run` tests over and over, to
# catch the races one CI run may miss (a deadlock of about 1 run in 50 of
# one test program got past two CI runs). Each round runs cli_run_modes
# (every fault path itself) and cli_run four ways, as `make test` does:
# the default (the thread path as root), `--fault-path signal`, the
# user-mode-only userfaultfd (where the default is the signal path), and
# that with the thread path asked for. Not part of
# `make test`; run it as `make soak` (ROUNDS=N) after a change to the
# library, on an otherwise quiet machine. The log of every failing test
# binary run is kept; the exit status is 1 if any failed.
set -u
rounds=${1:-3}
cargo=${CARGO:-cargo}
logs=$(mktemp -d /tmp/ztier-soak.XXXXXX)
cargo build --release --workspace --tests >/dev/null 2>&1 || { echo "soak: the build failed" >&2; exit 2; }
failed=0
tests=0
bad=0
run() { # name, then the command (with its environment first)
    local name=$1 log
    shift
    log="$logs/$name.$round.txt"
    env "$@" >"$log" 2>&1
    local rc=$?
    runs=$((runs + 1))
    tests=$((tests + $(grep -E "^test result" "$log" | awk '{s += $4} END {print s + 0}')))
    bad=$((bad + $(grep -E "^test result" "$log" | awk '{s += $6} END {print s + 0}')))
    if [ "$rc" -eq 0 ]; then
        rm -f "$log"
    else
        failed=$((failed + 1))
        echo "soak: round $round, $name FAILED: $log"
        grep -E "^test .* FAILED|panicked" "$log" | head -5
    fi
}
runs=0
for round in $(seq 1 "$rounds"); do
    run modes "$cargo" test --release -p ztier --test cli_run_modes
    run run "$cargo" test --release -p ztier --test cli_run
    run run-signal ZTIER_FAULT_PATH=signal "$cargo" test --release -p ztier --test cli_run
    run run-umo ZTIER_UFFD_USER_MODE_ONLY=1 "$cargo" test --release -p ztier --test cli_run
    run run-umo-thread ZTIER_UFFD_USER_MODE_ONLY=1 ZTIER_FAULT_PATH=thread "$cargo" test --release -p ztier --test cli_run
    echo "soak: round $round of $rounds done at $(date +%T): $tests tests passed, $bad failed so far"
done
echo "soak: $tests tests passed, $bad failed; $failed of $runs test binary runs failed (their logs in $logs)"
[ "$failed" -eq 0 ]
