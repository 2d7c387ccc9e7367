# Sourced by the shell tests (tests/apps/cli_test.sh, tests/dist/*.sh): a temporary folder
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
