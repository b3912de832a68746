#!/usr/bin/env bash
# Measures the edit–test loop of DEVELOPING.md: change one string in
# src/providers/kinds/bfl.rs, then run that adapter's 7 tests; in this tree (the `adapters`
# binary of package tally-base) and in a worktree of an older commit (default e995129, before
# issue 42's split, where those tests were in `tests/it`), alternating, ROUNDS times each after
# one untimed warm-up. Prints each pair of wall times and the medians. Take the figures on a
# quiet machine; the old commit's build goes to its own target directory (about 10 minutes the
# first time, 3 GB). The edited file is restored on exit.
#   usage: scripts/measure-loop.sh [ROUNDS] [BEFORE_COMMIT]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-6}"
before="${2:-e995129}"
here="$PWD"
wt="$here/target/loop-before"
edited="src/providers/kinds/bfl.rs"
sentence="is Ready without result.sample"
[ -d "$wt" ] || git worktree add --detach "$wt" "$before" >/dev/null
restore() { git -C "$here" checkout -q -- "$edited"; git -C "$wt" checkout -q -- "$edited"; }
trap restore EXIT

# One loop in tree $1 with command $2…: toggle the sentence, run, print the seconds.
one() {
    local tree="$1"; shift
    local f="$tree/$edited"
    grep -q "$sentence" "$f" || { echo "the sentence to edit is gone from $f" >&2; exit 1; }
    if grep -q "$sentence!" "$f"; then sed -i "s/$sentence!/$sentence/" "$f"; else sed -i "s/$sentence/$sentence!/" "$f"; fi
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(cd "$tree" && "$@" 2>&1) || { echo "$out" | tail -20 >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$out" | grep -q "test result: ok. 7 passed" || { echo "$out" | tail -20 >&2; exit 1; }
    python3 -c "print(f'{$t1 - $t0:.1f}')"
}
old() { CARGO_TARGET_DIR="$here/target/loop-before-target" one "$wt" cargo test --features failpoints --test it providers_bfl::; }
new() { one "$here" cargo test -p tally-base --features failpoints --test adapters providers_bfl::; }

old >/dev/null
new >/dev/null
b=(); a=()
for _ in $(seq "$rounds"); do
    b+=("$(old)"); a+=("$(new)")
    echo "before ${b[-1]} s   after ${a[-1]} s"
done
python3 - "${b[*]}" "${a[*]}" <<'PY'
import statistics, sys
b = [float(x) for x in sys.argv[1].split()]
a = [float(x) for x in sys.argv[2].split()]
mb, ma = statistics.median(b), statistics.median(a)
print(f"median before {mb:.1f} s, after {ma:.1f} s: {ma / mb:.2f} of the time")
PY
