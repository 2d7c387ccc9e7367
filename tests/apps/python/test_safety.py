"""Crashes and silent errors: each case as a PyTorch user would meet it, and what
it does now. Anything that could crash or hang the interpreter runs in a subprocess, so that
a segfault or a hang fails the test instead of killing pytest."""
import importlib.metadata
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import belay


def run_python(code, *args, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout)


def raises_in_subprocess(statement, exception, pattern, timeout=120):
    """Runs `statement` in a fresh interpreter: it must raise `exception` (a name, e.g.
    ValueError or belay.Error) with a message that matches `pattern`."""
    code = f"""
import re, sys
import belay
try:
    {statement}
except {exception} as e:
    print(type(e).__name__ + ": " + str(e))
    sys.exit(0 if re.search({pattern!r}, str(e)) else 4)
print("no exception")
sys.exit(3)
"""
    r = run_python(code, timeout=timeout)
    assert r.returncode == 0, f"{statement}: exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr[-3000:]}"
    return r.stdout


def regression(n=64, d_in=16, d_out=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in), dtype=np.float32)
    teacher = rng.standard_normal((d_out, d_in), dtype=np.float32) * 0.5
    return x, (x @ teacher.T).astype(np.float32)


def loss_of(model, x, y, dtype="fp16"):
    def loss_fn(k):
        with belay.autocast(dtype, enabled=dtype != "fp32"):
            return belay.mse_loss(model(x), y)
    return loss_fn


# ---- crashes: sizes that overflow, or that no memory holds

def test_a_shape_whose_size_overflows_is_a_value_error_not_a_segfault():
    # Each of these segfaulted, or made a tensor whose numel or nbytes had wrapped.
    for shape in ("[1 << 62]", "[1 << 31, 1 << 31]", "[(1 << 63) - 1]", "[1 << 61]"):
        raises_in_subprocess(f"belay.zeros({shape})", "ValueError", r"needs more than 2\^63 bytes")
    for shape in ("[1 << 32, 1 << 32]", "[3, 1 << 62]", "[1 << 62, 1 << 62, 0]"):
        raises_in_subprocess(f"belay.zeros({shape})", "belay.UsageError", r"more elements than fit in 64 bits")
    # Counts that fit, in more bytes than any address space: an out-of-memory belay.Error.
    raises_in_subprocess("belay.zeros([1 << 60])", "belay.Error",
                         r"^out of memory allocating 4611686018427387904 bytes for a tensor")
    t = belay.zeros([0, 1 << 60])  # no elements; every stride (up to 2^62 bytes) still fits
    assert t.numel == 0 and t.nbytes == 0 and t.shape == (0, 1 << 60)
    assert belay.zeros([3, 5], dtype="fp16").nbytes == 30


def test_set_element_and_memoryview_stay_inside_the_tensor():
    # zeros([(1 << 63) - 1]) is refused above; on a tensor that exists, indexes are checked.
    raises_in_subprocess("belay.zeros([1000]).set_element(10**9, 1.0)", "belay.Error",
                         r"set_element: index 1000000000 out of range for fp32\[1000\]")
    raises_in_subprocess("memoryview(belay.zeros([1000]))[10**9]", "IndexError", "")
    raises_in_subprocess("belay.zeros([1000]).set_element(-1, 1.0)", "belay.Error", "out of range")


def test_a_linear_too_large_is_refused_before_any_work():
    # 1 << 32 squared wraps to 0 elements: this ran on with memory growing past 3.8 GB.
    raises_in_subprocess("belay.Linear(1 << 32, 1 << 32)", "ValueError",
                         r"shape \[4294967296, 4294967296\] has more elements than fit", timeout=60)
    # 2^62 fp32 elements: "cannot create std::vector larger than max_size()" before.
    raises_in_subprocess("belay.Linear(2**31, 2**31)", "ValueError",
                         r"shape \[2147483648, 2147483648\] of 4-byte elements needs more than 2\^63 bytes",
                         timeout=60)
    # A size that can be counted but not allocated (1 PiB): the bytes, and what they were for.
    raises_in_subprocess("belay.Linear(1 << 24, 1 << 24)", "belay.Error",
                         r"^out of memory allocating 1125899906842624 bytes for the parameters of "
                         r"Linear\(16777216, 16777216\)", timeout=60)
    raises_in_subprocess("belay.Mlp(1 << 24, 1 << 24, 4)", "belay.Error",
                         r"out of memory allocating \d+ bytes for the parameters of Mlp\(16777216, 16777216, 4\)",
                         timeout=60)


# ---- silently wrong: byte order and read-only arrays

def test_big_endian_arrays_are_read_as_their_numbers():
    values = [1.0, 2.0, -3.5, 0.1]
    big = np.array(values, ">f4")
    assert belay.tensor(big).tolist() == belay.tensor(np.array(values, "<f4")).tolist()
    assert belay.tensor(big).tolist()[:3] == [1.0, 2.0, -3.5]
    assert belay.tensor(np.array(values, ">f2")).tolist() == belay.tensor(np.array(values, "<f2")).tolist()
    assert belay.tensor(np.array(values, ">f8")).tolist() == belay.tensor(np.array(values, "<f4")).tolist()
    assert belay.tensor(big, dtype="fp16").tolist() == belay.tensor(np.array(values, "<f4"), dtype="fp16").tolist()
    bits = np.array([0x3F80, 0xC000], np.uint16)
    assert belay.tensor(bits.astype(">u2"), dtype="bf16").tolist() == [1.0, -2.0]
    assert belay.Var(big).value.tolist() == belay.tensor(big).tolist()
    assert belay.parameter(big, "p").master.tolist() == belay.tensor(big).tolist()
    # from_numpy shares memory, which it cannot do in the other byte order: refused, saying how.
    with pytest.raises(belay.UsageError, match=r"big-endian byte order.*\.astype\('<f4'\).*belay\.tensor\(\) copies"):
        belay.from_numpy(big)
    with pytest.raises(belay.UsageError, match=r"\.astype\('<f2'\)"):
        belay.from_numpy(np.array(values, ">f2"))
    with pytest.raises(belay.UsageError, match="byte order"):
        belay.from_numpy(bits.astype(">u2"), dtype="bf16")

    # A model's input, a loss target, a state dict.
    x, y = regression(n=8, d_in=4, d_out=3)
    model = belay.Linear(4, 3, seed=0)
    np.testing.assert_array_equal(model(x.astype(">f4")).numpy(), model(x).numpy())
    assert belay.mse_loss(model(x), y.astype(">f4")).item() == belay.mse_loss(model(x), y).item()
    state = model.state_dict()
    other = belay.Linear(4, 3, seed=1)
    other.load_state_dict({k: v.astype(">f4") for k, v in state.items()})
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    labels = np.array([0, 2, 1, 1, 0, 2, 2, 1], ">f4")
    assert (belay.cross_entropy(model(x), labels).item() ==
            belay.cross_entropy(model(x), labels.astype("<f4")).item())


def test_from_numpy_refuses_a_read_only_array_and_copies_never_write_it():
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    with pytest.raises(belay.UsageError, match=r"read-only \(flags\.writeable is False\).*belay\.tensor\(\) copies"):
        belay.from_numpy(a)
    t = belay.tensor(a)
    t.fill(7.0)
    v = belay.Var(a)
    v.numpy()[0] = 9.0
    p = belay.parameter(a, "p")
    p.master.fill(5.0)
    b = np.broadcast_to(np.float32(2.0), (3, 4))  # read-only and not contiguous
    assert belay.tensor(b).tolist() == [2.0] * 12
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    # a writable array is still shared without a copy
    w = np.zeros(3, np.float32)
    belay.from_numpy(w).fill(1.0)
    assert w.tolist() == [1.0, 1.0, 1.0]


# ---- silently wrong: optimizer settings

def test_an_lr_that_is_nan_negative_or_infinite_is_refused_everywhere():
    model = belay.Linear(4, 2, seed=0)
    opt = belay.SGD(model, lr=0.1, momentum=0.0)
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(belay.UsageError, match="lr must be a finite number >= 0"):
            opt.set_lr(bad)
        with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
            opt.set_schedule(belay.LrSchedule.constant(bad))
        with pytest.raises(belay.UsageError, match="lr must be a finite number >= 0"):
            belay.LrSchedule.warmup_cosine(bad, 2, 10)
        with pytest.raises(belay.UsageError, match="lr must be a finite number >= 0"):
            belay.LrSchedule.warmup_cosine(0.1, 2, 10, min_lr=bad)
        with pytest.raises(belay.UsageError, match="lr must be a finite number >= 0"):
            belay.SGD(model, lr=bad)
        with pytest.raises(belay.UsageError, match="lr must be a finite number >= 0"):
            belay.AdamW(model, lr=bad)
    # The optimizer kept its LR: a step descends, and no weight became NaN.
    assert opt.schedule.peak_lr == np.float32(0.1)
    x, y = regression(d_in=4, d_out=2)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = belay.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    assert losses[2] < losses[1] < losses[0]
    assert all(np.isfinite(v).all() for v in model.state_dict().values())


def test_a_parameter_listed_twice_is_refused_naming_it():
    model = belay.Linear(4, 2, seed=0)
    with pytest.raises(belay.UsageError, match=r"parameter 'weight' is listed twice \(at 0 and 2\)"):
        belay.SGD(model.parameters() + [model.weight])
    with pytest.raises(belay.UsageError, match="'bias' is listed twice"):
        belay.AdamW([model.bias, model.weight, model.bias])


# ---- silently wrong: BF16 as NumPy

def test_ml_dtypes_is_a_dependency_and_bf16_numpy_is_numbers():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # installed with belay: a dependency now
    assert any(re.match(r"ml[-_]dtypes", r) for r in importlib.metadata.requires("belay"))
    t = belay.tensor(np.array([1.0, -2.0, 3.0], np.float32), dtype="bf16")
    arr = t.numpy()
    assert arr.dtype == ml_dtypes.bfloat16 and int(np.argmax(arr)) == 2
    bits = t.numpy_bits()
    assert bits.dtype == np.uint16 and bits.tolist() == [0x3F80, 0xC000, 0x4040]
    assert np.shares_memory(bits, arr)
    assert int(np.argmax(bits)) == 1  # why bits must never pass for numbers
    assert belay.tensor([1.0], dtype="fp16").numpy_bits().tolist() == [0x3C00]
    assert belay.tensor([1.0]).numpy_bits().dtype == np.uint32


def test_bf16_numpy_without_ml_dtypes_is_refused_saying_what_to_do():
    r = run_python("""
        import sys
        sys.modules["ml_dtypes"] = None  # as if it were not installed
        import numpy as np
        import belay
        t = belay.tensor(np.array([1.0, -2.0, 3.0], np.float32), dtype="bf16")
        for numpy_of in (t.numpy, belay.Var(t).numpy):
            try:
                numpy_of()
                sys.exit("numpy() returned something")
            except belay.UsageError as e:
                assert "pip install ml_dtypes" in str(e) and ".numpy_bits()" in str(e), str(e)
        assert t.numpy_bits().dtype == np.uint16 and t.numpy_bits().tolist() == [0x3F80, 0xC000, 0x4040]
        assert t.to("fp32").numpy().tolist() == [1.0, -2.0, 3.0]
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


# ---- silently wrong: the FP16 working copy and writes to the master

def test_a_write_to_the_fp32_master_is_seen_by_the_next_forward():
    model = belay.Linear(4, 2, seed=0, bias=False)
    model.set_working_dtype("fp16")
    x = np.ones((1, 4), np.float32)
    w = model.weight.master.numpy()  # the FP32 master, shared
    w[...] = 0.5
    with belay.autocast("fp16"):
        np.testing.assert_array_equal(model(x).numpy(), [[2.0, 2.0]])
        model.weight.master.fill(0.25)
        np.testing.assert_array_equal(model(x).numpy(), [[1.0, 1.0]])
        np.testing.assert_array_equal(belay.linear(x, model.weight).numpy(), [[1.0, 1.0]])
        w[0, 0] = 1.0 / 3.0  # rounds in the working copy as the optimizer's refresh does
        assert model.weight.numpy()[0, 0] == np.float16(0.25)  # not read until a forward
        model(x)
        assert model.weight.numpy()[0, 0] == np.float16(w[0, 0])
    # Training goes on from the written weights: the step's refresh agrees with the master.
    opt = belay.SGD(model, lr=0.1, momentum=0.0)
    step = belay.SafeStep(opt, belay.GradScaler(enabled=False))
    step.run(loss_of(model, x, np.zeros((1, 2), np.float32)))
    np.testing.assert_array_equal(model.weight.numpy(), w.astype(np.float16))


# ---- silently wrong: SafeStep

def one_step(fused, max_norm, unscale_grads=True, dtype="fp16"):
    x, y = regression()
    model = belay.Linear(16, 4, seed=0)
    model.set_working_dtype(dtype)
    opt = belay.AdamW(model, lr=1e-2, weight_decay=0.0)
    scaler = belay.GradScaler(enabled=dtype == "fp16", init_scale=1024.0)
    step = belay.SafeStep(opt, scaler, max_norm=max_norm, fused=fused, unscale_grads=unscale_grads)
    row = step.run(loss_of(model, x, y, dtype))
    return row, [p.grad.numpy().copy() for p in model.parameters()], model.state_dict()


FP16_EPS = 2.0 ** -10


def reference_grads(dtype="fp16"):
    """The gradient of the same loss, by a plain backward: no scale, no clip."""
    x, y = regression()
    model = belay.Linear(16, 4, seed=0)
    model.set_working_dtype(dtype)
    loss = loss_of(model, x, y, dtype)(0)
    loss.backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def test_after_a_fused_step_grad_is_the_true_gradient_as_after_an_unfused_one():
    ref = reference_grads()
    for max_norm in (math.inf, 0.5):
        row_f, fused, state_f = one_step(True, max_norm)
        row_u, unfused, state_u = one_step(False, max_norm)
        assert row_f.scaler_scale == row_u.scaler_scale == 1024.0 and not row_f.skipped
        for a, b in zip(fused, unfused):
            np.testing.assert_array_equal(a, b)
        # Against a plain backward (seed 1, no scale): the true gradient, not 1024 times it. The
        # two backwards round differently on the way through FP16 activations, so they agree to
        # FP16's epsilon (2^-10 relative), not bit for bit. Clipped: times the coefficient the
        # step applied (post / pre from the row; its rounding is far below that bound).
        coef = 1.0
        if not math.isinf(max_norm):
            assert row_f.grad_l2_pre_clip > max_norm  # the clip acts
            coef = row_f.grad_l2_post_clip / row_f.grad_l2_pre_clip
        for a, r in zip(fused, ref):
            np.testing.assert_allclose(a, r * np.float32(coef), rtol=FP16_EPS, atol=0)
    # unscale_grads=False: a fused step leaves them scaled (two passes saved), as before.
    _, scaled, _ = one_step(True, math.inf, unscale_grads=False)
    for a, r in zip(scaled, ref):
        np.testing.assert_allclose(a, r * np.float32(1024.0), rtol=FP16_EPS, atol=0)
    # BF16 (no loss scaling), clipped: the two paths agree too.
    _, fused, _ = one_step(True, 0.5, dtype="bf16")
    _, unfused, _ = one_step(False, 0.5, dtype="bf16")
    for a, b in zip(fused, unfused):
        np.testing.assert_array_equal(a, b)


def test_step_run_inside_the_loss_function_is_refused():
    x, y = regression()
    model = belay.Linear(16, 4, seed=0)
    model.set_working_dtype("fp16")
    opt = belay.AdamW(model, lr=1e-2)
    scaler = belay.GradScaler()
    step = belay.SafeStep(opt, scaler, max_norm=1.0)
    step.run(loss_of(model, x, y))
    before = ({k: v.copy() for k, v in model.state_dict().items()}, opt.step_count, scaler.scale, step.next_step)

    def nested(k):
        step.run(loss_of(model, x, y))  # a second step from inside the first
        return loss_of(model, x, y)(k)

    with pytest.raises(belay.UsageError, match=r"run\(\) called again while a step of the same SafeStep is running"):
        step.run(nested)
    after = ({k: v.copy() for k, v in model.state_dict().items()}, opt.step_count, scaler.scale, step.next_step)
    assert before[1:] == after[1:]
    for k in before[0]:
        np.testing.assert_array_equal(before[0][k], after[0][k])
    # The SafeStep is usable again: the next row is step 1, one step on from the first.
    row = step.run(loss_of(model, x, y))
    assert row.step == 1 and opt.step_count == 2


# ---- silently wrong: belay.train that stops early, and Ctrl-C

def test_train_stopped_by_the_skip_rate_raises_with_its_rows():
    with pytest.raises(belay.Error, match=r"^skip rate stayed above 50% for 3 consecutive steps") as info:
        belay.train(steps=30, inject_inf=[0, 1, 2, 3, 4], max_skip_rate=0.5, skip_patience=3, quiet=True,
                    **{"in": 8, "out": 2})
    e = info.value
    assert not isinstance(e, ValueError) and e.exit_code == 1
    assert 0 < len(e.rows) < 30 and all(r.skipped for r in e.rows)
    assert isinstance(e.rows[0], belay.StepRow)


def test_train_stopped_by_a_rollback_raises_with_its_rows(tmp_path):
    with pytest.raises(belay.Error, match=r"^rollback: skip-rate: 6 of the last 10 steps skipped.*stopping") as info:
        belay.train(dtype="fp16", steps=40, rollback_on="skip-rate", rollback_every=5, rollback_skip_window=10,
                    rollback_skip_rate=0.5, inject_inf=list(range(12, 31)), csv=str(tmp_path / "rb.csv"),
                    quiet=True)
    assert info.value.exit_code == 1 and len(info.value.rows) < 40
    assert (tmp_path / "rb.rollback.json").exists()
    # a run that completes still returns its rows
    assert len(belay.train(steps=3, quiet=True, **{"in": 8, "out": 2})) == 3


def test_ctrl_c_during_train_stops_after_the_step_checkpoints_and_raises(tmp_path):
    checkpoint = tmp_path / "run.safetensors"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import signal
        import sys
        import belay
        # Ctrl-C as at a terminal: a child of a background job (`bash .ci/run &`, nohup)
        # inherits SIGINT ignored, and Python then installs no handler for it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            belay.train(steps=1000000, batch=64, checkpoint=sys.argv[1], checkpoint_every=20, quiet=True,
                        **{"in": 256, "out": 256})
        except KeyboardInterrupt as e:
            print("KeyboardInterrupt after", len(e.rows), "steps", flush=True)
            sys.exit(0)
        print("the run was not interrupted", flush=True)
        sys.exit(5)
    """), str(checkpoint)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The first checkpoint (step 20) says the run is under way inside belay.train: Ctrl-C then.
        for _ in range(1200):
            if checkpoint.exists() or child.poll() is not None:
                break
            try:
                child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        assert checkpoint.exists(), "no checkpoint was written"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)  # a run that ignored it would go on for hours
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, out + err
    m = re.match(r"KeyboardInterrupt after (\d+) steps", out.strip())
    assert m, out + err
    steps = int(m.group(1))
    assert 20 <= steps < 1000000
    # The final checkpoint holds every step run: the run can resume from it.
    assert belay.inspect_checkpoint(str(checkpoint))["state"].next_step == steps
