# Sourced by the shell tests (tests/apps/cli/cli_test.sh, tests/dist/*.sh): a temporary folder
# of their own, removed when the script exits, the pass/fail lines they print, and the check
# of a usage error; each script ends by exiting non-zero when $fails is not 0.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# expect_one_line_error NAME EXIT_CODE PATTERN ARGS...: "$belay ARGS" exits EXIT_CODE with
# exactly one line on stderr, "belay: error: ..." matching PATTERN (empty: any message).
expect_one_line_error() {
  local name=$1 code=$2 pattern=$3
  shift 3
  "$belay" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq "$code" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "^belay: error: .*$pattern" "$tmp/err"; then
    pass "$name (exit $rc: $(cat "$tmp/err"))"
  else
    fail "$name: exit $rc (want $code), stderr: $(cat "$tmp/err")"
  fi
}

# belay_lines FILE: the lines of FILE outside mpirun's own banners (the blocks it frames in
# lines of dashes). A belay line that a banner cut in two breaks that frame, so what is left
# is not a whole "belay: error: ..." line and the check below fails: never a cut accepted.
belay_lines() { awk '/^-+$/ { inside = !inside; next } !inside' "$1"; }

# expect_mpirun_error NAME EXIT_CODE PATTERN ARGS...: `mpirun ARGS` (as mpi_cmd runs it)
# exits EXIT_CODE (empty: any non-zero) and, mpirun's banners aside, its stderr is exactly one
# whole line, "belay: error: ..." matching PATTERN: said once (rank 0), never cut.
expect_mpirun_error() {
  local name=$1 code=$2 pattern=$3
  shift 3
  "${mpi_cmd[@]}" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  belay_lines "$tmp/err" >"$tmp/err.belay"
  if { [ -z "$code" ] && [ "$rc" -ne 0 ] || [ "$rc" = "$code" ]; } && [ "$(wc -l <"$tmp/err.belay")" -eq 1 ] &&
    grep -q "^belay: error: .*$pattern" "$tmp/err.belay"; then
    pass "$name (exit $rc: $(cat "$tmp/err.belay"))"
  else
    fail "$name: exit $rc (want ${code:-non-zero}), stderr: $(cat "$tmp/err")"
  fi
}
