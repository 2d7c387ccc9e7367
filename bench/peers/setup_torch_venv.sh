#!/usr/bin/env bash
# Makes the PyTorch venv that bench/peers/torch_cpu.py runs in (the bench's peer): PyTorch
# from PyPI plus numpy, in a plain venv. By hand only: never used by CI or the test
# command (it is ~5.5 GB on disk).
#   bench/peers/setup_torch_venv.sh
# Environment:
#   BELAY_TORCH_VENV  where the venv goes. Default: venv-torch BESIDE the repository
#                     (<repo>/../venv-torch, i.e. /work/venv-torch for /work/main), so git
#                     never sees it and every worktree of the checkout finds the same one;
#                     bench/run_all.sh reads the same variable with the same default.
#   PYTHON            the interpreter that makes the venv (default python3).
#
# Why a normal install and not `pip install --no-deps torch`: tried (torch 2.15.0, the
# PyPI Linux wheel is the CUDA build, +cu132); `import torch` then fails with
# "libcufile.so.0: cannot open shared object file", because libtorch.so itself links
# libtorch_cuda.so and through it cuFile, cuSPARSELt and NVSHMEM. So the nvidia-* wheels
# (~4 GB) come along even though the bench only runs CPU ops. --no-cache-dir keeps pip from
# holding a second copy of them in ~/.cache.
# The check at the end runs a CPU matmul under bf16 autocast and a fused AdamW step, the
# features the bench relies on, so a broken install fails here and not in the bench.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${BELAY_TORCH_VENV:-$root/../venv-torch}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --no-cache-dir torch numpy

"$venv/bin/python" - <<'PY'
import numpy
import torch
a = torch.randn(64, 64)
with torch.autocast("cpu", dtype=torch.bfloat16):
    b = a @ a
assert b.dtype == torch.bfloat16
p = torch.nn.Parameter(torch.randn(16))
p.grad = torch.randn(16)
torch.optim.AdamW([p], fused=True).step()
print(f"torch {torch.__version__} (cpu capability {torch.backends.cpu.get_cpu_capability()}), "
      f"numpy {numpy.__version__}")
PY
echo "venv: $(cd "$venv" && pwd) ($(du -sh "$venv" | cut -f1))"
