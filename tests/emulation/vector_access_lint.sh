#!/usr/bin/env bash
# The emulator's misaligned-access check (docs/emulator.md) sees a vector access only when it
# goes through device_access.cuh's load_vector / store_vector: the load/store hooks cannot
# tell a float4 from four floats. So no kernel source names a pointer or reference to a CUDA
# vector type (float4*, const uint4&, ...) except on a line that calls one of the two.
#   usage: tests/emulation/vector_access_lint.sh REPO_ROOT
set -euo pipefail
root=${1:?usage: vector_access_lint.sh REPO_ROOT}
vec='(float|double|u?int|u?short|u?char|u?long|u?longlong)[1-4]|__half2|__nv_bfloat162'
found=$(grep -nE "(^|[^A-Za-z0-9_])($vec)[[:space:]]*[*&]" \
          "$root"/kernels/cuda/*.cu "$root"/kernels/cuda/*.cuh "$root"/kernels/cuda/*.h |
        grep -vE 'load_vector|store_vector' | grep -v '/device_access\.cuh:' || true)
if [[ -n $found ]]; then
  echo "$found"
  echo "vector_access_lint: a vector access outside load_vector/store_vector (kernels/cuda/device_access.cuh);"
  echo "  the emulator would not check its alignment. Load or store the vector through them."
  exit 1
fi
echo "vector_access_lint: every vector access of kernels/cuda goes through load_vector/store_vector"
