# Shared by the trace scripts: find ztier, check a tool, name the output.
# ZTIER may point at a built binary; otherwise the workspace's release build is used.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ -z "${ZTIER:-}" ]; then
    (cd "$root" && cargo build --release --quiet)
    ZTIER="$root/target/release/ztier"
fi
OUT=${OUT:-$PWD}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

need() {
    command -v "$1" >/dev/null 2>&1 || {
        echo "$0: needs '$1' (Debian package: $2; as root: apt-get install -y $2)" >&2
        exit 2
    }
}
need valgrind valgrind

record() { # record NAME CMD...
    local name=$1
    shift
    echo "recording $name: $*" >&2
    "$ZTIER" trace record -o "$OUT/$name.trace" -- "$@"
    "$ZTIER" trace info "$OUT/$name.trace" >&2
}
