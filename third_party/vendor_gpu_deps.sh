#!/usr/bin/env bash
# Gathers the Debian packages the GPU check's build needs (Eigen, CLI11, nlohmann-json,
# Catch2, PCRE2) into ONE git-ignored folder, third_party/vendored/, for a machine that has nvcc,
# CMake and ninja but none of them and no network (the lent GPU machine: bench/README.md
# says how a run carries the folder). Configure with -DBELAY_DEPS_PREFIX=<that>/usr.
#   usage: vendor_gpu_deps.sh [--download] [DIR]     (default DIR: <repo>/third_party/vendored)
# Each package is copied from this machine's installed files (dpkg -L; offline), or, when
# it is not installed (or with --download), fetched with `apt-get download` and unpacked
# with `dpkg -x`. Docs
# and man pages are left out (~13 MB in all). Idempotent: a folder whose MANIFEST names the
# same package versions is left as it is.
# Not gathered: OpenMPI (a runtime with a dozen shared libraries, not headers alone), so a
# machine without it builds without MPI and NCCL, and gpu-check.sh skips its --dist nccl run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
download=0
[ "${1:-}" = "--download" ] && { download=1; shift; }
DEST="${1:-$ROOT/third_party/vendored}"
# catch2 is Debian 12's Catch2 2.13: header-only but for libCatch2WithMain.a (the main()).
# libpcre2-dev and its libpcre2-8-0: the BPE pre-tokenizer (apps/text/) links libpcre2-8.
packages=(libeigen3-dev libcli11-dev nlohmann-json3-dev catch2 libpcre2-dev libpcre2-8-0)

# `|| true`: dpkg-query fails on a package it never saw, and under pipefail that would end the
# script silently instead of reaching the one-line message below.
installed_version() { { dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null || true; } | sed -n 's/^install ok installed //p'; }
candidate_version() { { apt-cache policy "$1" 2>/dev/null || true; } | sed -n 's/^ *Candidate: //p'; }

manifest=""
declare -A version from_dpkg
for p in "${packages[@]}"; do
  v="$(installed_version "$p")"
  from_dpkg[$p]=$(( download == 0 && ${#v} > 0 ))
  [ -n "$v" ] || v="$(candidate_version "$p")"
  [ -n "$v" ] && [ "$v" != "(none)" ] || {
    echo "belay: $p is neither installed nor known to apt (run apt-get update, or third_party/install_deps.sh)" >&2; exit 1; }
  version[$p]="$v"
  manifest+="$p $v"$'\n'
done
if [ -f "$DEST/MANIFEST" ] && [ "$(cat "$DEST/MANIFEST")" = "${manifest%$'\n'}" ]; then
  echo "belay: $DEST is up to date ($(du -sh "$DEST" | cut -f1))"
  exit 0
fi

mkdir -p "$(dirname "$DEST")"
tmp="$(mktemp -d "${DEST%/}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
for p in "${packages[@]}"; do
  if [ "${from_dpkg[$p]}" = 1 ]; then
    # The package's own paths (tar: directories without their other contents), no docs.
    dpkg -L "$p" | grep -vE '^/usr/share/(doc|man)(/|$)' | sed -e 's|^/||' -e '/^\.$/d' |
      tar -C / --no-recursion -cf - --verbatim-files-from -T - | tar -C "$tmp" -xf -
  else
    (cd "$tmp" && apt-get download -q "$p=${version[$p]}" >/dev/null)
    dpkg -x "$tmp/$p"_*.deb "$tmp"
    rm -f "$tmp/$p"_*.deb
    rm -rf "$tmp/usr/share/doc" "$tmp/usr/share/man"
  fi
done
printf '%s' "${manifest%$'\n'}" > "$tmp/MANIFEST"
rm -rf "$DEST"
mv "$tmp" "$DEST"
trap - EXIT
echo "belay: gathered ${packages[*]} into $DEST ($(du -sh "$DEST" | cut -f1))"
