#!/usr/bin/env python3
"""PyTorch on the CPU as belay_bench's peer: the same work, the same sizes, the same threads.

    torch_cpu.py [--quick] [--threads N] [--cpu-time] --json FILE

Runs in the venv that bench/peers/setup_torch_venv.sh makes; bench/run_all.sh calls it
after belay_bench and passes belay's OpenMP thread count. Writes one JSON document
{"torch": {...}} that belay_bench_report merges beside belay's sections and compares row
by row (bench/report.cpp, "PyTorch peer"). Five sections, each mirroring one of
belay_bench's (the first four run by default):

  gemm   (bench/gemm.cpp)       the products of a Linear(n -> n) layer at batch 256:
                                forward Y = X W^T + b (F.linear), dX = dY W, dW = dY^T X,
                                n = 256, 1024, 4096 (quick: 256, 1024), fp32, bf16, fp16
                                operands; GFLOP/s = 2*256*n*n / median time.
  train  (bench/train_step.cpp) whole training steps of Linear(4096) and the MLP
                                1024-2048-2048-1024 (GELU) at batch 256 (quick:
                                Linear(1024), MLP 256-512-512-256) in fp32/bf16/fp16,
                                with belay's belts in PyTorch's recipe: autocast, GradScaler
                                for fp16, clip_grad_norm_(1.0), AdamW.
  amp    (bench/amp_step.cpp)   the optimizer half of the AMP step at 1M/16M/64M params
                                (quick: 1M, 4M) in 8 FP32 tensors, loss scale 2^16:
                                scaler.unscale_ + clip_grad_norm_ + scaler.step(AdamW) +
                                scaler.update.
  rows   (bench/rows.cpp)       LayerNorm and softmax forward and backward on [8192, 768]
                                (quick: 1024 rows) in fp32 and bf16.
  isa    (bench/isa.cpp)        GELU forward then backward on 1M FP32 values, uniform(-5, 5)
                                and N(0, 1) (the gelu_1m rows; belay's per ISA path).

Timing follows bench/harness.h: warm-up runs, timed repetitions, median, min, max and the
relative interquartile range, the same repetition counts as belay. Results are checked
after timing like belay's (sampled GEMM outputs against FP64, finite and decreasing
losses, no overflow in the AMP step), so a wrong number is never written.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

BATCH = 256
SCALE = 65536.0  # loss scale of the AMP step (belay's kScale; GradScaler's default too)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRODUCTS = ("forward", "dX", "dW")


# --- the harness (bench/harness.h in Python) -----------------------------------------

def summarize(ms):
    ms = sorted(ms)

    def quantile(q):
        pos = q * (len(ms) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ms) - 1)
        return ms[lo] + (pos - lo) * (ms[hi] - ms[lo])

    median = quantile(0.5)
    return {"median_ms": median, "min_ms": ms[0], "max_ms": ms[-1],
            "iqr_rel": (quantile(0.75) - quantile(0.25)) / median if median > 0 else 0.0, "reps": len(ms)}


# Wall time, or with --cpu-time this thread's CPU time (as belay_bench --cpu-time; one thread).
CLOCK = [time.perf_counter]


def time_it(warmup, reps, body, before=None):
    """Runs body warmup times untimed, then reps times timed; before() runs untimed ahead
    of each run (resetting state)."""
    for _ in range(warmup):
        if before:
            before()
        body()
    ms = []
    for _ in range(reps):
        if before:
            before()
        t0 = CLOCK[0]()
        body()
        ms.append((CLOCK[0]() - t0) * 1e3)
    return summarize(ms)


class CheckFailure(Exception):
    pass


def require(ok, what):
    if not ok:
        raise CheckFailure("check failed: " + what)


# --- optimizer choice -----------------------------------------------------------------

def make_adamw(params, lr, weight_decay):
    """AdamW(fused=True) where this PyTorch has the fused CPU kernel, else foreach (one
    kernel per op over all tensors): the fastest PyTorch offers, which is the peer to beat.
    Returns the optimizer and which implementation it is."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True), "foreach"


# --- gemm -----------------------------------------------------------------------------

def check_product(a, b, c, what):
    """C = A B: 16 sampled entries against an FP64 dot product of the operands as stored,
    within belay's bound (2k * 2^-24 * sum|ab| plus the output's rounding)."""
    a64, b64 = a.double(), b.double()
    out_eps = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[c.dtype]
    k = a.shape[1]
    g = torch.Generator().manual_seed(7)
    for _ in range(16):
        i = int(torch.randint(c.shape[0], (1,), generator=g))
        j = int(torch.randint(c.shape[1], (1,), generator=g))
        terms = a64[i, :] * b64[:, j]
        ref = float(terms.sum())
        bound = 2.0 * k * 2.0 ** -24 * float(terms.abs().sum()) + out_eps * abs(ref) + 1e-30
        got = float(c[i, j])
        require(abs(got - ref) <= bound, f"{what}: C[{i},{j}] = {got}, fp64 reference {ref}")


def bench_gemm(quick):
    rows = []
    for n in ((256, 1024) if quick else (256, 1024, 4096)):
        reps = 5 if n >= 4096 else 10 if n >= 1024 else 50
        warm = 1 if n >= 4096 else 3
        flops = 2.0 * BATCH * n * n
        g = torch.Generator().manual_seed(n)
        bound = 1.0 / math.sqrt(n)  # same value ranges as belay's random_matrix calls
        x = torch.rand(BATCH, n, generator=g) * 2 - 1
        w = (torch.rand(n, n, generator=g) * 2 - 1) * bound
        dy = (torch.rand(BATCH, n, generator=g) * 2 - 1) * 1e-2
        bias = (torch.rand(n, generator=g) * 2 - 1) * 0.1
        entry = {"n": n, "batch": BATCH, "flops": flops}
        for name, dt in DTYPES.items():
            xd, wd, dyd, bd = x.to(dt), w.to(dt), dy.to(dt), bias.to(dt)
            # dX and dW write into buffers made once, as belay's gemm does. The outputs are
            # in the operands' dtype: that is what PyTorch's autograd computes under
            # autocast (dW in bf16/fp16, then accumulated into the FP32 .grad), whereas
            # belay writes dW in FP32 directly.
            dx = torch.empty(BATCH, n, dtype=dt)
            dw = torch.empty(n, n, dtype=dt)
            wt, dyt = wd.t(), dyd.t()  # views: no copy, as belay passes transpose flags
            ops = {"forward": lambda: F.linear(xd, wd, bd),
                   "dX": lambda: torch.mm(dyd, wd, out=dx),
                   "dW": lambda: torch.mm(dyt, xd, out=dw)}
            e = {}
            for op in PRODUCTS:
                t = time_it(warm, reps, ops[op])
                e[op] = {"time": t, "gflops": flops / (t["median_ms"] * 1e6)}
            y = F.linear(xd, wd)  # the product part, checked without the bias
            check_product(xd, wt, y, f"torch forward {name}")
            check_product(dyd, wd, dx, f"torch dX {name}")
            check_product(dyt, xd, dw, f"torch dW {name}")
            entry[name] = e
        rows.append(entry)
    return {"sizes": rows, "gpt2_small": bench_gpt2_shapes(quick)}


# GPT-2 small's linear layers (name, in, out), as bench/gemm.cpp's gpt2_small rows: the three
# products of each at 1024 and 4096 tokens (--quick: 1024, no head), and the 4096 squares, fp32, no bias.
GPT2_SMALL = (("attn.qkv", 768, 2304), ("attn.proj", 768, 768), ("mlp.fc", 768, 3072),
              ("mlp.proj", 3072, 768), ("head", 768, 50304), ("square 4096", 4096, 4096))


def bench_gpt2_shapes(quick):
    rows = []
    for m in ((1024,) if quick else (1024, 4096)):
        for name, fin, fout in GPT2_SMALL:
            if quick and fout > 4096:
                continue
            if fin == 4096 and m != 4096:  # the 4096 x 4096 x 4096 squares only
                continue
            flops = 2.0 * m * fin * fout
            reps = 3 if flops > 1e11 else 5 if flops > 1e10 else 9
            g = torch.Generator().manual_seed(m * 131 + fout)
            x = torch.rand(m, fin, generator=g) * 2 - 1
            w = (torch.rand(fout, fin, generator=g) * 2 - 1) / math.sqrt(fin)
            dy = (torch.rand(m, fout, generator=g) * 2 - 1) * 1e-2
            y = torch.empty(m, fout)
            dx = torch.empty(m, fin)
            dw = torch.empty(fout, fin)
            wt, dyt = w.t(), dy.t()
            ops = {"forward": lambda: torch.mm(x, wt, out=y),
                   "dX": lambda: torch.mm(dy, w, out=dx),
                   "dW": lambda: torch.mm(dyt, x, out=dw)}
            shapes = {"forward": (m, fout, fin), "dX": (m, fin, fout), "dW": (fout, fin, m)}
            entry = {"layer": name, "tokens": m, "in": fin, "out": fout, "flops": flops}
            for op in PRODUCTS:
                t = time_it(1, reps, ops[op])
                mm, nn, kk = shapes[op]
                entry[op] = {"m": mm, "n": nn, "k": kk, "time": t, "gflops": flops / (t["median_ms"] * 1e6)}
            check_product(x, wt, y, f"torch gpt2 forward {name}")
            check_product(dy, w, dx, f"torch gpt2 dX {name}")
            check_product(dyt, x, dw, f"torch gpt2 dW {name}")
            rows.append(entry)
    return {"rows": rows}


# --- train ----------------------------------------------------------------------------

def build(spec):
    """belay's Linear (with bias) or Mlp (Linear, GELU, ..., Linear). PyTorch's default
    init draws from U(-1/sqrt(in), 1/sqrt(in)), the same range as belay's."""
    if spec["layers"] == 1:
        return torch.nn.Linear(spec["in"], spec["out"])
    mods = []
    for i in range(spec["layers"]):
        fan_in = spec["in"] if i == 0 else spec["hidden"]
        fan_out = spec["out"] if i == spec["layers"] - 1 else spec["hidden"]
        mods.append(torch.nn.Linear(fan_in, fan_out))
        if i + 1 < spec["layers"]:
            mods.append(torch.nn.GELU())  # exact (erf), as belay's
    return torch.nn.Sequential(*mods)


def train_row(spec, dtype_name, warmup, reps):
    """One configuration stepped warmup + reps times; the step is belay's 'belts' row:
    zero_grad, forward under autocast, (scaled) backward, unscale_, clip_grad_norm_(1.0),
    AdamW step, scaler update."""
    torch.manual_seed(42)
    dt = DTYPES[dtype_name]
    model = build(spec)
    opt, impl = make_adamw(model.parameters(), lr=1e-4, weight_decay=0.01)
    # GradScaler only for fp16, as belay's default_scaler_enabled: disabled, its calls
    # are pass-throughs.
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, enabled=dtype_name == "fp16")
    x = torch.randn(BATCH, spec["in"])
    y = 0.5 * torch.randn(BATCH, spec["out"])
    params = list(model.parameters())
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dt, enabled=dtype_name != "fp32"):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())  # belay reads each step's loss too (its log row)

    t = time_it(warmup, reps, step)
    require(all(math.isfinite(v) for v in losses), f"{spec['name']} {dtype_name}: a non-finite loss")
    require(losses[-1] < losses[0], f"{spec['name']} {dtype_name}: the loss did not go down")
    return {"model": spec["name"], "params": sum(p.numel() for p in params), "dtype": dtype_name,
            "optimizer": impl, "time": t, "samples_per_s": BATCH / (t["median_ms"] * 1e-3),
            "first_loss": losses[0], "last_loss": losses[-1]}


def bench_train(quick):
    # Same names as belay's rows: the report matches on (model, dtype).
    models = ([{"name": "linear1024", "in": 1024, "hidden": 0, "out": 1024, "layers": 1},
               {"name": "mlp256-512-512-256", "in": 256, "hidden": 512, "out": 256, "layers": 3}] if quick else
              [{"name": "linear4096", "in": 4096, "hidden": 0, "out": 4096, "layers": 1},
               {"name": "mlp1024-2048-2048-1024", "in": 1024, "hidden": 2048, "out": 1024, "layers": 3}])
    rows = [train_row(m, d, 2, 3 if quick else 11) for m in models for d in DTYPES]
    return {"batch": BATCH, "steps": rows}


# --- amp ------------------------------------------------------------------------------

def bench_amp(quick):
    """PyTorch's optimizer half of the AMP step. Passes over memory: unscale_ (r+w g: 8
    B/param), clip_grad_norm_'s norm (r g: 4) and its in-place multiply by the clip
    coefficient (r+w g: 8; done even when the coefficient is 1), fused AdamW (r g p m v,
    w p m v: 28): about 48 bytes/param against belay's fused 34. No FP16 working copy:
    PyTorch re-casts the weights in the next forward instead."""
    rows = []
    tensors = 8  # a model's parameters come in several tensors, as in belay's bench
    for n in ((1 << 20, 1 << 22) if quick else (1 << 20, 16 << 20, 64 << 20)):
        reps = 40 if n <= (1 << 20) else 10 if n <= (16 << 20) else 6
        g = torch.Generator().manual_seed(1)
        per = n // tensors
        params = []
        for t in range(tensors):
            length = n - per * (tensors - 1) if t == tensors - 1 else per
            p = torch.nn.Parameter((torch.rand(length, generator=g) * 2 - 1) * 0.05)
            p.grad = SCALE * (torch.rand(length, generator=g) * 2 - 1) * 1e-2  # a scaled gradient
            params.append(p)
        grads = [p.grad for p in params]
        opt, impl = make_adamw(params, lr=1e-3, weight_decay=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
        scaler.scale(torch.ones(()))  # makes the scale tensor, as a training step's scale(loss) would

        def rescale():
            # unscale_ divides the gradients in place: restore the scaled values, untimed,
            # so every repetition does the same work on the same magnitudes.
            torch._foreach_mul_(grads, SCALE)

        def body():
            scaler.unscale_(opt)
            # max_norm inf as belay's bench: clip coefficient 1, every pass still runs.
            torch.nn.utils.clip_grad_norm_(params, float("inf"))
            scaler.step(opt)
            scaler.update()

        # The first warm-up run finds the gradients scaled already; rescale before every
        # later run.
        first = [True]

        def before():
            if not first[0]:
                rescale()
            first[0] = False

        t = time_it(2, reps, body, before)
        require(scaler.get_scale() == SCALE, "amp: the scaler saw an overflow (scale changed)")
        require(all(bool(torch.isfinite(p).all()) for p in params), "amp: non-finite parameters")
        rows.append({"params": n, "tensors": tensors, "optimizer": impl, "time": t, "bytes_per_param_approx": 48})
    return {"sizes": rows}


# --- rows -----------------------------------------------------------------------------

def check_rows(x, g, w, b, y, dx, layer_norm, what):
    """4 sampled rows of y and dx against FP64 from the inputs as stored, within 64 eps of
    the output dtype times the row's largest reference value (as bench/rows.cpp)."""
    eps = 2.0 ** -24 if y.dtype == torch.float32 else 2.0 ** -8
    n = x.shape[0]
    for r in (0, n // 3, n // 2 + 1, n - 1):
        xr, gr = x[r].double(), g[r].double()
        if layer_norm:
            mu = xr.mean()
            rs = 1.0 / torch.sqrt(((xr - mu) ** 2).mean() + 1e-5)
            xh = (xr - mu) * rs
            yref = xh * w.double() + b.double()
            gw = gr * w.double()
            dref = rs * (gw - gw.mean() - xh * (gw * xh).mean())
        else:
            yref = torch.softmax(xr, -1)
            yr = y[r].double()
            dref = yr * (gr - (gr * yr).sum())
        for got, ref, part in ((y[r], yref, "forward"), (dx[r], dref, "backward")):
            err = float((got.double() - ref).abs().max())
            require(err <= 64 * eps * float(ref.abs().max()), f"{what} row {r} {part}: max error {err}")


def bench_rows(quick):
    """LayerNorm and softmax forward and backward on [8192, 768] (quick: 1024 rows), fp32 and
    bf16 (bf16 in and out; LayerNorm's weight and bias FP32, PyTorch's mixed-type CPU path),
    as bench/rows.cpp. The backward is the ATen kernel autograd calls
    (native_layer_norm_backward, _softmax_backward_data), timed alone as belay's is."""
    rows_n, cols = (1024 if quick else 8192), 768
    reps, warm = (5 if quick else 20), 3
    g = torch.Generator().manual_seed(2025)
    x32 = torch.rand(rows_n, cols, generator=g) * 8 - 4
    g32 = torch.rand(rows_n, cols, generator=g) * 2 - 1
    w = torch.rand(cols, generator=g) + 0.5
    b = torch.rand(cols, generator=g) - 0.5
    out = []
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, dy = x32.to(dt), g32.to(dt)
        res = {}

        def ln_fwd():
            res["ln"] = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)

        t_lf = time_it(warm, reps, ln_fwd)
        y, mean, rstd = res["ln"]

        def ln_bwd():
            res["lnb"] = torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])

        t_lb = time_it(warm, reps, ln_bwd)
        check_rows(x, dy, w, b, y, res["lnb"][0], True, f"torch layer_norm {name}")

        def sm_fwd():
            res["sm"] = torch._softmax(x, -1, False)

        t_sf = time_it(warm, reps, sm_fwd)
        ys = res["sm"]

        def sm_bwd():
            res["smb"] = torch._softmax_backward_data(dy, ys, -1, dt)

        t_sb = time_it(warm, reps, sm_bwd)
        check_rows(x, dy, w, b, ys, res["smb"], False, f"torch softmax {name}")
        for op, pas, t in (("layer_norm", "forward", t_lf), ("layer_norm", "backward", t_lb),
                           ("softmax", "forward", t_sf), ("softmax", "backward", t_sb)):
            out.append({"op": op, "pass": pas, "dtype": name, "time": t})
    return {"rows": rows_n, "cols": cols, "ops": out}


def bench_isa(quick):
    """GELU (the exact erf form) forward then backward on 1M FP32 values, as bench/isa.cpp's
    gelu_1m ("wide": uniform(-5, 5)) and gelu_1m_normal (N(0, 1)) rows: ATen's gelu and
    gelu_backward kernels into buffers allocated once (as belay's are), the same repetitions.
    Check: a few values against FP64, within 1e-6 of |x| (forward) or of 1 + |x| pdf."""
    n, reps, warm = 1 << 20, (5 if quick else 11), 1
    g = torch.Generator().manual_seed(1 << 20)
    rows = {}
    for name, x in (("gelu_1m", torch.rand(n, generator=g) * 10 - 5),
                    ("gelu_1m_normal", torch.randn(n, generator=g))):
        dy = torch.rand(n, generator=g) * 2 - 1
        y, dx = torch.empty(n), torch.empty(n)

        def body():
            torch.ops.aten.gelu.out(x, out=y)
            torch.ops.aten.gelu_backward.grad_input(dy, x, grad_input=dx)

        t = time_it(warm, reps, body)
        for i in range(0, n, 4099):
            v = float(x[i])
            cdf = 0.5 * math.erfc(-v / math.sqrt(2.0))
            pdf = math.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)
            require(abs(float(y[i]) - v * cdf) <= 1e-6 * (abs(v) + 1e-30) and
                    abs(float(dx[i]) - float(dy[i]) * (cdf + v * pdf)) <= 1e-6 * (1.0 + abs(v) * pdf),
                    f"torch {name}: GELU off at x = {v}")
        rows[name] = {"time": t, "ns_per_element": t["median_ms"] * 1e6 / n}
    return rows


# --- main -----------------------------------------------------------------------------

def default_threads():
    """What OpenMP gives belay when nothing is set: OMP_NUM_THREADS, else the CPUs this
    process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.split(",")[0].isdigit():
        return int(env.split(",")[0])
    return len(os.sched_getaffinity(0))


def main():
    ap = argparse.ArgumentParser(description="PyTorch CPU peer of belay_bench")
    ap.add_argument("--quick", action="store_true", help="small sizes, as belay_bench --quick")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (default: as OpenMP's default)")
    ap.add_argument("--only", default="gemm,train,amp,rows", help="sections, comma separated (also: isa, GELU as belay_bench --only isa)")
    ap.add_argument("--json", required=True, help="output file")
    ap.add_argument("--cpu-time", action="store_true", help="time this thread's CPU time (one thread only)")
    args = ap.parse_args()

    threads = args.threads or default_threads()
    if args.cpu_time:
        if threads != 1:
            print("torch_cpu: error: --cpu-time counts one thread's CPU time; use --threads 1", file=sys.stderr)
            return 2
        CLOCK[0] = time.thread_time
    torch.set_num_threads(threads)
    doc = {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "quick": args.quick,
           "clock": "thread_cpu" if args.cpu_time else "wall"}
    sections = {"gemm": bench_gemm, "train": bench_train, "amp": bench_amp, "rows": bench_rows, "isa": bench_isa}
    try:
        for name in args.only.split(","):
            print(f"torch_cpu: {name}...", end="", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            doc[name] = sections[name](args.quick)
            print(f" {int(time.perf_counter() - t0)} s", file=sys.stderr)
    except CheckFailure as e:
        print(f"\ntorch_cpu: {e}", file=sys.stderr)
        return 1
    with open(args.json, "w") as f:
        json.dump({"torch": doc}, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
