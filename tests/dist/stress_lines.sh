#!/usr/bin/env bash
# Not part of the suite (it takes minutes): the mpirun tests N times each beside two busy
# loops, the load under which mpirun's banner once cut belay's error lines in two (before
# every line went out in one write(): engine/whole_lines.h). Every run must pass.
#   usage: tests/dist/stress_lines.sh BUILD_DIR [N]     (N: 20 by default)
set -u
build=$(cd "$1" && pwd)
n=${2:-20}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
busy() { while :; do :; done; }
busy & b1=$!
busy & b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
failed=0
for test in sweep_ranks dist; do
  ok=0
  for i in $(seq "$n"); do
    if [ $test = dist ]; then
      bash "$here/dist_test.sh" "$build/belay" "$build/tests/compare_checkpoints" ON >"/tmp/stress_$test.log" 2>&1
    else
      bash "$here/sweep_ranks_test.sh" "$build/belay" ON >"/tmp/stress_$test.log" 2>&1
    fi
    if [ $? -eq 0 ]; then
      ok=$((ok + 1))
    else
      failed=$((failed + 1))
      cp "/tmp/stress_$test.log" "/tmp/stress_${test}_failed_$i.log"
      grep '^FAIL' "/tmp/stress_$test.log" | sed "s/^/run $i: /"
    fi
  done
  echo "$test: $ok of $n passed beside two busy loops"
done
exit $((failed > 0))
