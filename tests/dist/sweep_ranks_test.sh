#!/usr/bin/env bash
# `belay sweep --ranks N`: every point trained on N processes under mpirun (--dist mpi),
# rank 0 alone reporting; its usage errors one line each, exit 2.
#   usage: sweep_ranks_test.sh path/to/belay HAVE_MPI(ON|OFF)
# Exit 77 (CTest: skipped) with a message when belay was built without MPI or mpirun is absent.
set -u
belay=$1
have_mpi=$2
. "$(dirname "${BASH_SOURCE[0]}")/../shell_test_lib.sh"

# expect_error NAME PATTERN ARGS...: exit 2, one line on stderr matching PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  expect_one_line_error "$name" 2 "$pattern" "$@"
}
expect_error "--ranks 0" "--ranks must be at least 1" sweep --ranks 0 --steps 1
expect_error "--ranks with --dist" "drop --dist" sweep --ranks 2 --dist mpi --steps 1

if [ "$have_mpi" != "ON" ]; then
  expect_error "--ranks 2 without MPI built in" "built without MPI" sweep --ranks 2 --steps 1
  [ $fails -eq 0 ] || exit 1
  echo "skipped: belay was built without MPI (install openmpi-bin libopenmpi-dev: third_party/install_deps.sh)"
  exit 77
fi
expect_error "--ranks 2 with no launcher" "'no-such-mpirun' not found on PATH" sweep --ranks 2 --steps 1 --mpirun no-such-mpirun
# mpirun absent from PATH (a PATH with nothing on it): said on one line, nothing started.
PATH=/nonexistent "$belay" sweep --ranks 2 --steps 1 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "'mpirun' not found on PATH (install openmpi-bin" "$tmp/err"; then
  pass "mpirun absent: $(cat "$tmp/err")"
else
  fail "mpirun absent: exit $rc, $(cat "$tmp/err")"
fi
if ! command -v mpirun >/dev/null 2>&1; then
  [ $fails -eq 0 ] || exit 1
  echo "skipped: mpirun not found (install openmpi-bin: third_party/install_deps.sh)"
  exit 77
fi

mpi_one_machine_env
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # OpenMPI's allocations, not belay's
launcher="mpirun --allow-run-as-root --oversubscribe"

# 2 ranks, accum 1 and 2 of micro-batch 4: batches 8 and 16, 5 all-reduces per point (one
# per effective step, counted per point), one table (rank 0's) and one JSON.
if "$belay" sweep --ranks 2 --mpirun "$launcher" --micro-batch 4 --accum 1,2 --steps 5 --json "$tmp/two.json" \
    >"$tmp/two.out" 2>"$tmp/two.err"; then
  pass "sweep --ranks 2 ran"
  sed 's/^/     /' "$tmp/two.out"
else
  fail "sweep --ranks 2: $(cat "$tmp/two.out" "$tmp/two.err")"
fi
[ "$(grep -c '^sweep: ' "$tmp/two.out")" -eq 1 ] && grep -q '2 ranks' "$tmp/two.out" &&
  pass "one table, from rank 0, saying 2 ranks" || fail "the table: $(cat "$tmp/two.out")"
python3 - "$tmp/two.json" <<'PY' && pass "JSON: ranks 2, batch = micro x accum x 2, 5 all-reduces and their bytes per point" || fail "JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 2, d
assert [p["batch"] for p in d["points"]] == [8, 16], d["points"]
assert all(p["ranks"] == 2 and p["sync_calls"] == 5 and p["steps"] == 5 for p in d["points"]), d["points"]
# a Linear 64 -> 8 (520 FP32 parameters): 2080 bytes per all-reduce
assert all(p["gradient_bytes"] == 5 * 2080 for p in d["points"]), d["points"]
PY

# The same effective batches in one process (accum 2 and 4 of 4): the same training, so the
# same mean loss (FP32; the two runs differ only in how the batch mean is summed: within
# 1e-5 relative, the bound of tests/dist/dist_test.sh).
"$belay" sweep --micro-batch 4 --accum 2,4 --steps 5 --json "$tmp/one.json" >/dev/null 2>"$tmp/one.err" ||
  fail "sweep in one process: $(cat "$tmp/one.err")"
python3 - "$tmp/one.json" "$tmp/two.json" <<'PY' && pass "2 ranks train as one process with the whole batch (mean loss within 1e-5)" || fail "losses differ"
import json, sys
one, two = (json.load(open(p))["points"] for p in sys.argv[1:3])
for a, b in zip(one, two):
    assert a["batch"] == b["batch"], (a, b)
    assert abs(a["avg_loss"] - b["avg_loss"]) <= 1e-5 * abs(a["avg_loss"]), (a["avg_loss"], b["avg_loss"])
PY

# An unwritable --json stops every rank before any work, said once, exit 2.
# (sweep itself starts mpirun here: mpi_cmd is empty, the command line is belay's.)
mpi_cmd=()
expect_mpirun_error "unwritable --json on 2 ranks" 2 "cannot write '$tmp/no/dir/s.json'" \
  "$belay" sweep --ranks 2 --mpirun "$launcher" --steps 1 --json "$tmp/no/dir/s.json"
# Under mpirun already, --ranks would start mpirun in every rank: refused, once, whole.
mpi_cmd=(mpi)  # shell_test_lib.sh's launcher (ASAN_OPTIONS above already has detect_leaks=0)
expect_mpirun_error "--ranks under mpirun" 2 'sweep --ranks 2 starts mpirun itself; under mpirun give --dist mpi instead$' \
  2 "$belay" sweep --ranks 2 --steps 1

[ $fails -eq 0 ] && echo "sweep --ranks: all passed" || echo "sweep --ranks: $fails failed"
exit $((fails > 0))
