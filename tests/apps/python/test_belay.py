"""The Python module as a user meets it: NumPy without copies, errors as exceptions with
belay's message, the step from a Python loss function (GIL released, exceptions leave no
trace), the log, checkpoints and belay.train. Run by tests/run.sh with pytest."""
import math
import sys
import threading
import time
import traceback

import numpy as np
import pytest

import belay


def regression(n=64, d_in=16, d_out=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in), dtype=np.float32)
    teacher = rng.standard_normal((d_out, d_in), dtype=np.float32) * 0.5
    return x, (x @ teacher.T).astype(np.float32)


def make_run(dtype="fp16", seed=0, lr=5e-2, max_norm=1.0, **scaler_options):
    model = belay.Linear(16, 4, seed=seed)
    model.set_working_dtype(dtype)
    opt = belay.AdamW(model, lr=lr, weight_decay=0.01)
    scaler = belay.GradScaler(enabled=dtype == "fp16", **scaler_options)
    step = belay.SafeStep(opt, scaler, max_norm=max_norm)
    return model, opt, scaler, step


def loss_of(model, x, y, dtype="fp16"):
    def loss_fn(k):
        with belay.autocast(dtype, enabled=dtype != "fp32"):
            return belay.mse_loss(model(x), y)
    return loss_fn


def run_state(model, opt, scaler, step):
    """Everything a step could change, as plain values."""
    return ({k: v.copy() for k, v in model.state_dict().items()},
            {k: t.numpy().copy() for k, t in opt.state_tensors().items()},
            opt.step_count, scaler.scale, step.next_step)


def assert_same_state(a, b):
    for da, db in ((a[0], b[0]), (a[1], b[1])):
        assert da.keys() == db.keys()
        for k in da:
            np.testing.assert_array_equal(da[k], db[k], err_msg=k)
    assert a[2:] == b[2:]


# ---- tensors and NumPy

def test_from_numpy_shares_memory_both_ways():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = belay.from_numpy(x)
    assert t.shape == (3, 4) and t.dtype == belay.float32 and t.device == "cpu"
    back = t.numpy()
    assert np.shares_memory(back, x)
    assert np.shares_memory(np.asarray(t), x)  # the buffer protocol too
    x[1, 2] = 100.0
    assert t.tolist()[6] == 100.0
    del t, x  # the array from numpy() keeps the memory alive through the tensor
    assert back[1, 2] == 100.0 and back.sum() == sum(range(12)) - 6 + 100


def test_fp16_is_numpy_float16_without_copy():
    x = np.array([[1.0, 0.1, 65504.0]], dtype=np.float16)
    t = belay.from_numpy(x)
    assert t.dtype == belay.float16
    assert t.numpy().dtype == np.float16 and np.shares_memory(t.numpy(), x)
    # the conversion from float32 rounds as NumPy does (nearest even; 1e5 overflows to inf)
    f = np.array([0.1, 1.0 / 3.0, 1e5, 2.0 ** -24 * 0.75], dtype=np.float32)
    with np.errstate(over="ignore"):
        expected = f.astype(np.float16)
    np.testing.assert_array_equal(belay.tensor(f, dtype="fp16").numpy(), expected)


def test_bf16_as_uint16_bits_and_as_ml_dtypes():
    f = np.array([1.0, 1.00390625, 3.0e38, -0.1], dtype=np.float32)  # 1 + 2^-8: a tie, to even (1.0)
    u = f.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even, by hand
    assert bits[1] == 0x3F80 and bits[3] == 0xBDCD
    t = belay.from_numpy(bits, dtype="bf16")
    assert t.dtype == belay.bfloat16
    np.testing.assert_array_equal(np.asarray(t), bits)  # the buffer protocol: the bits, shared
    assert np.shares_memory(np.asarray(t), bits)
    np.testing.assert_array_equal(np.array(t.tolist(), dtype=np.float32), (bits.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(np.asarray(belay.tensor(f, dtype="bf16")), bits)
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (a dependency of belay) not installed")
    arr = belay.tensor(f, dtype="bf16").numpy()
    assert arr.dtype == ml.bfloat16
    np.testing.assert_array_equal(arr.view(np.uint16), bits)
    assert belay.from_numpy(arr).dtype == belay.bfloat16


def test_dtype_and_layout_errors_carry_belays_message():
    with pytest.raises(belay.UsageError, match="float64 array of shape \\(2, 3\\) has no belay dtype"):
        belay.from_numpy(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="not C-contiguous"):  # UsageError is a ValueError
        belay.from_numpy(np.zeros((4, 4), dtype=np.float32)[:, ::2])
    with pytest.raises(belay.UsageError, match="no belay dtype for numpy int32"):
        belay.dtype(np.int32)
    with pytest.raises(belay.UsageError, match="unknown dtype"):
        belay.dtype("fp8")
    # belay.tensor copies and converts what from_numpy refuses
    t = belay.tensor(np.arange(6.0).reshape(2, 3)[:, ::2])
    assert t.dtype == belay.float32 and t.tolist() == [0.0, 2.0, 3.0, 5.0]


def test_shape_errors_are_belay_errors():
    model = belay.Linear(16, 4)
    x, y = regression()
    with pytest.raises(belay.Error, match=r"\[64, 3\]") as info:
        belay.mse_loss(model(x), y[:, :3].copy())
    assert isinstance(info.value, RuntimeError) and not isinstance(info.value, ValueError)
    with pytest.raises(belay.Error, match="dtypes differ"):
        model.set_working_dtype("fp16")
        model(x)  # an FP16 weight and FP32 data outside autocast


# ---- autograd, autocast, modules

def test_autocast_is_a_context_manager_that_nests():
    model = belay.Linear(16, 4)
    model.set_working_dtype("bf16")
    x, _ = regression()
    assert belay.autocast_dtype() is None
    with belay.autocast("bf16"):
        assert belay.autocast_dtype() == belay.bfloat16
        assert model(x).dtype == belay.bfloat16
        with belay.autocast("fp32"):  # FP32 switches it off
            assert belay.autocast_dtype() is None
        assert belay.autocast_dtype() == belay.bfloat16
    assert belay.autocast_dtype() is None


def test_backward_gives_numpy_gradients():
    w = belay.Var(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32), requires_grad=True)
    x = np.array([[1.0, -1.0]], dtype=np.float32)
    loss = belay.sum(belay.matmul(x, w))  # x @ w summed: d/dw = x^T @ ones
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[1.0, 1.0], [-1.0, -1.0]])
    assert loss.item() == -4.0
    with belay.no_grad():
        assert not belay.sum(belay.matmul(x, w)).requires_grad


def test_a_model_written_in_python_trains_with_parameters():
    x, y = regression()
    w = belay.parameter(np.zeros((16, 4), np.float32), "w")
    assert w.is_parameter and w.requires_grad and w.master.dtype == belay.float32
    opt = belay.AdamW([w], lr=5e-2, weight_decay=0.0)
    step = belay.SafeStep(opt, belay.GradScaler(enabled=False))
    rows = [step.run(lambda k: belay.mse_loss(belay.matmul(x, w), y)) for _ in range(100)]
    assert rows[-1].loss < 0.05 * rows[0].loss


def test_state_dict_round_trip_and_errors():
    a, b = belay.Linear(16, 4, seed=1), belay.Linear(16, 4, seed=2)
    b.set_working_dtype("fp16")
    b.load_state_dict(a.state_dict())
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v)
    np.testing.assert_array_equal(b.weight.value.numpy(), a.state_dict()["weight"].astype(np.float16))
    with pytest.raises(belay.UsageError, match="'weight' has shape \\[4, 15\\], the model needs \\[4, 16\\]"):
        b.load_state_dict({"weight": np.zeros((4, 15), np.float32), "bias": np.zeros(4, np.float32)})
    assert [n for n, _ in belay.Mlp(8, 32, 3, layers=3).named_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "layers.2.weight", "layers.2.bias"]


# ---- the step

def test_safestep_fp16_trains_and_returns_step_rows():
    x, y = regression()
    model, opt, scaler, step = make_run()
    rows = [step.run(loss_of(model, x, y)) for _ in range(60)]
    assert isinstance(rows[0], belay.StepRow) and isinstance(rows[0], tuple)
    assert rows[0]._fields == tuple(belay.STEP_LOG_HEADER.split(","))
    assert [r.step for r in rows] == list(range(60))
    assert not any(r.skipped for r in rows) and rows[-1].scaler_scale == 65536.0
    assert rows[0].grad_l2_pre_clip > 1.0 and rows[0].grad_l2_post_clip == pytest.approx(1.0, rel=1e-5)
    assert rows[-1].loss < 0.02 * rows[0].loss


def test_sgd_and_schedules():
    x, y = regression()
    model = belay.Linear(16, 4)
    opt = belay.SGD(model, lr=0.05, momentum=0.9)
    sched = belay.LrSchedule.warmup_cosine(0.05, 5, 40)
    step = belay.SafeStep(opt, belay.GradScaler(enabled=False), schedule=sched)
    step.set_after_backward(lambda s, o: o.grads()[0].set_element(0, math.inf) if s == 3 else None)
    rows = [step.run(loss_of(model, x, y, "fp32")) for _ in range(40)]
    assert rows[3].skipped and rows[3].skip_reason == "nonfinite_grad" and rows[3].scaler_scale == 1.0
    applied = 0
    for r in rows:  # the LR follows the applied steps: the skip does not move the schedule
        assert r.lr == pytest.approx(sched.lr_at(applied), rel=1e-6)
        applied += not r.skipped
    assert opt.step_count == 39
    assert rows[-1].loss < 0.05 * rows[0].loss


def test_value_clipping_and_its_errors():
    x, y = regression()
    model = belay.Linear(16, 4)
    step = belay.SafeStep(belay.AdamW(model, lr=5e-2), belay.GradScaler(enabled=False), max_norm=0.01,
                          clip_mode="value")
    row = step.run(loss_of(model, x, y, "fp32"))
    # every element clamped to +-0.01: the applied norm is at most 0.01 * sqrt(#elements)
    assert row.grad_l2_post_clip <= 0.01 * math.sqrt(16 * 4 + 4) * (1 + 1e-6) < row.grad_l2_pre_clip
    with pytest.raises(belay.UsageError, match="unknown clip_mode 'l1'"):
        belay.SafeStep(belay.AdamW(model), belay.GradScaler(), clip_mode="l1")
    with pytest.raises(belay.UsageError):
        belay.autocast("fp16", fp32_ops="no_such_op")


def test_a_skipped_step_changes_nothing_but_the_scale():
    x, y = regression()
    model, opt, scaler, step = make_run(init_scale=1024.0)
    loss_fn = loss_of(model, x, y)
    step.run(loss_fn)
    before = run_state(model, opt, scaler, step)
    step.set_after_backward(lambda s, o: o.grads()[1].set_element(0, math.nan))
    row = step.run(loss_fn)
    assert row.skipped and row.skip_reason == "nonfinite_grad" and math.isnan(row.grad_l2_pre_clip)
    assert row.grad_l2_post_clip == 0.0 and row.scaler_scale == 512.0
    after = run_state(model, opt, scaler, step)
    assert after[4] == before[4] + 1 and after[3] == 512.0
    assert_same_state(before[:3] + (0, 0), after[:3] + (0, 0))


def failing_loss_function(k):
    raise KeyError("no batch %d in this loader" % k)


def test_a_python_exception_in_the_loss_propagates_and_leaves_the_run_untouched():
    x, y = regression()
    model, opt, scaler, step = make_run()
    twin = make_run()  # the same run without the failure
    for run in ((model, opt, scaler, step), twin):
        for _ in range(3):
            run[3].run(loss_of(run[0], x, y))
    before = run_state(model, opt, scaler, step)
    with pytest.raises(KeyError, match="no batch 0 in this loader") as info:
        step.run(failing_loss_function)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == "failing_loss_function"  # the traceback reaches into the loss function
    assert_same_state(before, run_state(model, opt, scaler, step))
    for p in model.parameters():
        assert p.grad is None
    # a loss function that returns something else is a clear error too
    with pytest.raises(belay.UsageError, match="returned a <class 'float'>, not a belay.Var"):
        step.run(lambda k: 1.0)
    assert_same_state(before, run_state(model, opt, scaler, step))
    # and the run goes on exactly as if nothing had happened
    row, twin_row = step.run(loss_of(model, x, y)), twin[3].run(loss_of(twin[0], x, y))
    assert row == twin_row
    assert_same_state(run_state(model, opt, scaler, step), run_state(*twin))


def test_the_gil_is_released_during_a_step():
    # With a long switch interval the counting thread runs only when the main thread releases
    # the GIL itself. Between the end of the loss function and the return of run() only C++
    # runs (backward, guard, AdamW): the count moves there only if that C++ let go of the GIL.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512), dtype=np.float32)
    y = rng.standard_normal((256, 512), dtype=np.float32)
    model = belay.Linear(512, 512)
    step = belay.SafeStep(belay.AdamW(model), belay.GradScaler(enabled=False))
    counter, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1
            if counter[0] % 100 == 0:
                time.sleep(0)  # releases the GIL: the main thread gets it back when it asks

    moved = []
    at_loss_end = [0]

    def loss_fn(k):
        loss = belay.mse_loss(model(x), y)
        at_loss_end[0] = counter[0]
        return loss

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # far longer than the C++ part of a step
    thread = threading.Thread(target=count)
    thread.start()
    try:
        for _ in range(5):
            step.run(loss_fn)
            moved.append(counter[0] - at_loss_end[0])
    finally:
        stop.set()
        sys.setswitchinterval(old)
        thread.join()
    assert max(moved) > 0, moved


# ---- the log, checkpoints, finfo, train

def test_step_log_writer_writes_the_eight_columns(tmp_path):
    x, y = regression()
    model, opt, scaler, step = make_run()
    rows = [step.run(loss_of(model, x, y)) for _ in range(4)]
    path = tmp_path / "run.csv"
    with belay.StepLogWriter(str(path)) as log:
        for r in rows:
            log.write(r)
    lines = path.read_text().splitlines()
    assert lines[0] == belay.STEP_LOG_HEADER == "step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale"
    assert lines[1:] == [belay.format_step_row(r) for r in rows]
    with pytest.raises(belay.UsageError, match="nope"):
        belay.StepLogWriter(str(tmp_path / "nope" / "run.csv"))


def test_checkpoint_resume_is_bit_exact(tmp_path):
    x, y = regression()
    path = str(tmp_path / "ck.safetensors")
    model, opt, scaler, step = make_run(growth_interval=3)
    step.set_after_backward(lambda s, o: o.grads()[0].set_element(0, math.inf) if s == 2 else None)
    for _ in range(5):
        step.run(loss_of(model, x, y))
    belay.save(path, model, opt, scaler, step, settings={"dtype": "fp16"})
    rest = [step.run(loss_of(model, x, y)) for _ in range(5)]

    model2, opt2, scaler2, step2 = make_run(seed=99, growth_interval=3)  # other init: all comes from the file
    state = belay.resume(path, model2, opt2, scaler2, step2, settings={"dtype": "fp16"})
    assert state.next_step == 5 and state.optimizer_steps == 4
    assert [step2.run(loss_of(model2, x, y)) for _ in range(5)] == rest
    assert_same_state(run_state(model, opt, scaler, step), run_state(model2, opt2, scaler2, step2))
    with pytest.raises(belay.UsageError, match="was written with dtype fp16, this run has dtype bf16.*new_experiment=True"):
        belay.resume(path, model2, opt2, scaler2, step2, settings={"dtype": "bf16"})
    with pytest.raises(belay.UsageError, match="was written with data=a, this run has data=b"):
        belay.save(path, model, opt, scaler, step, settings={"dtype": "fp16", "data": "a"})
        belay.resume(path, model2, opt2, scaler2, step2, settings={"dtype": "fp16", "data": "b"})
    # another precision policy is allowed as a new experiment, and said so
    state = belay.resume(path, model2, opt2, scaler2, step2, settings={"dtype": "bf16", "data": "a"},
                         new_experiment=True)
    assert state.policy_changes == ["dtype fp16 -> bf16"]


def test_inspect_checkpoint_validates_a_file_alone(tmp_path):
    x, y = regression()
    path = str(tmp_path / "ck.safetensors")
    model, opt, scaler, step = make_run()
    for _ in range(3):
        step.run(loss_of(model, x, y))
    belay.save(path, model, opt, scaler, step, settings={"dtype": "fp16"})
    info = belay.inspect_checkpoint(path)
    assert info["state"].next_step == 3 and info["state"].settings["dtype"] == "fp16"
    assert info["cpu_isa"] and all(isinstance(shape, tuple) for shape in info["tensors"].values())
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])  # truncated: a clear error naming the file
    with pytest.raises(belay.UsageError, match="ck.safetensors"):
        belay.inspect_checkpoint(path)


def test_finfo_and_rounding():
    f16, bf16, f32 = belay.finfo("fp16"), belay.finfo(belay.bfloat16), belay.finfo(np.float32)
    assert (f16.bits, f16.max, f16.eps, f16.smallest_normal) == (16, 65504.0, 2.0 ** -10, 2.0 ** -14)
    assert f16.smallest_subnormal == 2.0 ** -24
    assert bf16.eps == 2.0 ** -7 and bf16.max == pytest.approx(3.3895e38, rel=1e-4)
    assert f32.eps == float(np.finfo(np.float32).eps)
    assert belay.round_to("fp16", 65520.0) == math.inf and belay.round_to("fp16", 65519.0) == 65504.0


def test_train_returns_the_rows_of_the_cli_run(tmp_path):
    csv = tmp_path / "train.csv"
    rows = belay.train(dtype="fp16", steps=12, inject_inf=[5], csv=str(csv), quiet=True, **{"in": 8, "out": 2})
    assert len(rows) == 12 and isinstance(rows[0], belay.StepRow)
    assert [r.step for r in rows if r.skipped] == [5] and rows[5].skip_reason == "nonfinite_grad"
    assert rows[5].scaler_scale == rows[4].scaler_scale / 2
    assert rows[-1].loss < rows[0].loss
    assert csv.read_text().splitlines()[1:] == [belay.format_step_row(r) for r in rows]
    with pytest.raises(belay.UsageError, match="unknown option 'stepz'"):
        belay.train(stepz=3)
    with pytest.raises(belay.UsageError, match="micro"):
        belay.train(batch=32, micro_batch=5, quiet=True)


def test_safe_step_census_names_every_gradient_and_the_planted_inf():
    x, y = regression()
    model = belay.Linear(16, 4, seed=0)
    model.set_working_dtype("fp16")
    opt = belay.AdamW(model, lr=5e-2)
    step = belay.SafeStep(opt, belay.GradScaler(init_scale=1.0), census=True)
    row, census = step.run(loss_of(model, x, y))
    assert not row.skipped
    assert set(census) == set(model.state_dict())
    for name, c in census.items():
        assert c["numel"] == model.state_dict()[name].size
        assert c["nonfinite"] == 0
        assert c["zeros"] + c["underflow_to_zero"] + c["subnormal"] <= c["numel"]
        assert c["amax"] > 0 and math.isfinite(c["headroom_bits"])
    step.set_after_backward(lambda s, o: o.grads()[0].set_element(0, math.inf))
    row, census = step.run(loss_of(model, x, y))
    assert row.skipped and row.skip_reason == "nonfinite_grad"
    assert sorted(c["nonfinite"] for c in census.values()) == [0, 1]
    plain = belay.SafeStep(belay.AdamW(model, lr=5e-2), belay.GradScaler())
    assert isinstance(plain.run(loss_of(model, x, y)), belay.StepRow)  # the census only when asked (a StepRow alone)
    # census_casts: the weights' fp16 working copies (and any autocast cast) as "cast:" entries.
    casts = belay.SafeStep(belay.AdamW(model, lr=5e-2), belay.GradScaler(init_scale=1.0), census=True,
                           census_casts=True)
    row, census = casts.run(loss_of(model, x, y))
    cast_sites = {k[len("cast:"):]: c for k, c in census.items() if k.startswith("cast:")}
    assert set(census) - {"cast:" + k for k in cast_sites} == set(model.state_dict())
    assert cast_sites["weight"]["numel"] == model.state_dict()["weight"].size  # the working copy
    assert cast_sites["linear.input"]["numel"] == x.size  # x, cast to fp16 for the product
    with pytest.raises(belay.UsageError, match=r"census_casts=True\) needs census"):
        belay.SafeStep(belay.AdamW(model, lr=5e-2), belay.GradScaler(), census_casts=True)


def test_train_census_and_tensorboard_events_read_by_tensorboard(tmp_path):
    census, tb = tmp_path / "census.csv", tmp_path / "tb"
    rows = belay.train(dtype="fp16", steps=6, inject_inf=[2], census=str(census), tensorboard=str(tb), quiet=True,
                       **{"in": 8, "out": 2})
    assert rows[2].skipped
    lines = census.read_text().splitlines()
    assert lines[0].startswith("step,tensor,numel,nonfinite,amax,")
    bad = [l.split(",") for l in lines[1:] if l.split(",")[0] == "2" and l.split(",")[3] != "0"]
    assert len(bad) == 1 and bad[0][3] == "1"
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(tb))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "step/loss" in tags and "step/skipped" in tags
    assert [e.step for e in acc.Scalars("step/skipped") if e.value == 1.0] == [2]
    name = bad[0][1]
    nonfinite = acc.Scalars("census_nonfinite/" + name)
    assert [e.step for e in nonfinite if e.value > 0] == [2]
    assert [e.step for e in acc.Scalars("step/loss")] == list(range(6))
