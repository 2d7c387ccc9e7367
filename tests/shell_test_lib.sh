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

# For the tests of tests/dist. skip_without_mpirun HAVE_MPI (ON|OFF): exit 77 (CTest: skipped)
# with what to install when belay was built without MPI or mpirun is absent. use_mpirun: `mpi N
# ARGS...` runs mpirun as root in CI containers, with more ranks than cores on a small machine,
# under mpi_one_machine_env (below); OpenMPI keeps allocations from MPI_Init until exit, so under
# the sanitizer build that is not belay's leak (the single-process runs keep leak detection on).
# mpi_cmd is what expect_mpirun_error runs.
skip_without_mpirun() {
  if [ "$1" != "ON" ]; then
    echo "skipped: belay was built without MPI (install openmpi-bin libopenmpi-dev: third_party/install_deps.sh)"
    exit 77
  fi
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "skipped: mpirun not found (install openmpi-bin: third_party/install_deps.sh)"
    exit 77
  fi
}
# mpi_one_machine_env: OpenMPI's settings for ranks that all run on this machine. Shared memory
# (vader) and self as the only transports, through ob1: MPI_Init then probes no InfiniBand, OFI,
# UCX or TCP device at every start (a 2-rank `belay train --dist mpi --steps 1` took 0.40 s,
# now 0.17 s, on 2 Zen 3 cores; the dist tests start ranks dozens of times). No single copy by
# ptrace (containers often forbid it; shared memory copies work everywhere). When a job ends
# early, the ranks left are killed at once after mpirun's SIGTERM, not a second later (its
# default grace): each usage-error case took 1.1-2.1 s, now 0.12 s. No test needs the grace: a
# rank's error line is out before it exits, and checkpoints are written whole or not at all.
mpi_one_machine_env() {
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
  export OMPI_MCA_odls_base_sigkill_timeout=0
}
use_mpirun() {
  mpi_one_machine_env
  mpi_cmd=(mpi)
}
mpi() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
  mpirun --allow-run-as-root --oversubscribe -np "$@"; }
