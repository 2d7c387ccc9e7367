# Sourced by the shell tests (tests/apps/cli_test.sh, tests/dist/*.sh): a temporary folder
# of their own, removed when the script exits, and the pass/fail lines they print; each
# script ends by exiting non-zero when $fails is not 0.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
