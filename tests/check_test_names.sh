#!/usr/bin/env bash
# Every Catch2 test case must run under ctest. catch_discover_tests registers each name as a
# ctest test whose command passes the name back as a filter; a ';' in a name is CMake's list
# separator, so such a name becomes two ctest entries whose filters match no test case, and
# Catch2 exits 0 when nothing ran: two tests that pass without running anything (18 did, until
# 2026-12-03). This fails on any such name.
#   usage: check_test_names.sh CATCH_BINARY...
set -u
bad=0
for binary in "$@"; do
  # (Catch2 2.x exits with the number of names listed, so the output is what is checked.)
  names=$("$binary" --list-test-names-only)
  [ -n "$names" ] || { echo "$binary: lists no test" >&2; exit 1; }
  while IFS= read -r name; do
    case "$name" in
      *";"*) echo "$(basename "$binary"): a ';' in '$name' splits it under ctest (use ',')"; bad=1 ;;
    esac
  done <<<"$names"
  echo "$(basename "$binary"): $(grep -c . <<<"$names") test names"
done
exit $bad
