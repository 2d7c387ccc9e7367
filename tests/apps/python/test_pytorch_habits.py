"""What a PyTorch user reaches for: a Module subclassed in Python, parameter
groups, eval()/train() and the inference path, belay.train on NumPy arrays with the CLI's
option names, errors that speak Python, and a `belay train` checkpoint loaded without
passing its settings back. Bit-for-bit comparisons where the same kernels run both ways."""
import pathlib
import re
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import belay


def regression(n=64, d_in=8, d_out=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in), dtype=np.float32)
    teacher = rng.standard_normal((d_out, d_in), dtype=np.float32) * 0.5
    return x, (x @ teacher.T).astype(np.float32)


class TwoLayer(belay.Module):
    def __init__(self, seed=0):
        super().__init__()
        self.fc1 = belay.Linear(8, 16, seed=seed)
        self.mix = belay.parameter(np.eye(16, dtype=np.float32) * 0.5)
        self.heads = [belay.Linear(16, 2, seed=seed + 1)]
        self.note = "not a parameter"

    def forward(self, x):
        return self.heads[0](belay.relu(self.fc1(x)) @ self.mix)


class Outer(belay.Module):
    def __init__(self):
        super().__init__()
        self.body = TwoLayer(seed=3)
        self.tied = self.body.mix  # the same parameter twice: listed once, as in PyTorch


def same_rows(a, b):
    """Rows compared as the log writes them (a NaN norm equals itself there)."""
    return [belay.format_step_row(r) for r in a] == [belay.format_step_row(r) for r in b]


# ---- Module subclassed in Python

def test_a_module_subclass_registers_its_attributes_and_calls_forward():
    x, _ = regression()
    m = TwoLayer()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "mix", "heads.0.weight", "heads.0.bias"]
    assert [p.name for p in m.parameters()] == names  # optimizer state and checkpoints use these
    assert TwoLayer().fc1.weight.name == "fc1.weight"  # named when assigned
    assert Outer().body.fc1.weight.name == "body.fc1.weight"
    assert m.parameter_count == 8 * 16 + 16 + 16 * 16 + 16 * 2 + 2
    assert list(m.state_dict()) == names
    by_hand = m.heads[0](belay.matmul(belay.relu(m.fc1(x)), m.mix))
    np.testing.assert_array_equal(m(x).numpy(), by_hand.numpy())
    assert [n for n, _ in Outer().named_parameters()] == [
        "body.fc1.weight", "body.fc1.bias", "body.mix", "body.heads.0.weight", "body.heads.0.bias"]
    assert [n for n, _ in Outer().named_children()] == ["body"]
    assert "fc1" in repr(m) and "mix" in repr(m)


def test_a_module_subclass_trains_saves_and_loads(tmp_path):
    x, y = regression()
    m = TwoLayer()
    opt = belay.AdamW(m, lr=1e-2, weight_decay=0.0)
    assert "optim.fc1.weight.exp_avg" in opt.state_tensors()
    step = belay.SafeStep(opt, belay.GradScaler(enabled=False))
    rows = [step.run(lambda k: belay.mse_loss(m(x), y)) for _ in range(40)]
    assert rows[-1].loss < 0.2 * rows[0].loss

    other = TwoLayer(seed=7)
    other.load_state_dict(m.state_dict())
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(other.state_dict()[k], v)

    path = str(tmp_path / "sub.safetensors")
    belay.save(path, m, opt, step=step)
    fresh = TwoLayer(seed=9)
    fresh_opt = belay.AdamW(fresh, lr=1e-2, weight_decay=0.0)
    state = belay.resume(path, fresh, fresh_opt)
    assert state.next_step == 40 and fresh_opt.step_count == 40
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v)
    for k, v in opt.state_tensors().items():
        np.testing.assert_array_equal(fresh_opt.state_tensors()[k].numpy(), v.numpy())


def test_a_module_subclass_without_forward_or_super_init_says_what_to_do():
    class NoForward(belay.Module):
        def __init__(self):
            super().__init__()
            self.w = belay.parameter(np.ones((2, 2), np.float32))

    with pytest.raises(NotImplementedError, match="defines no forward"):
        NoForward()(np.ones((1, 2), np.float32))

    class NoInit(belay.Module):
        def __init__(self):
            self.w = belay.parameter(np.ones((2, 2), np.float32))

    with pytest.raises(TypeError, match="__init__"):
        NoInit()


# ---- parameter groups

def grouped_and_alone(optimizer, group_a, group_b, **defaults):
    """Two copies of a model: one stepped by a grouped optimizer, the other by one optimizer
    per group with that group's options. The same kernels run: the masters must agree bit for bit."""
    x, y = regression()
    a, b = belay.Linear(8, 2, seed=1), belay.Linear(8, 2, seed=1)
    opt = optimizer([{"params": [a.weight], **group_a}, {"params": [a.bias], **group_b}], **defaults)
    alone = [optimizer([b.weight], **{**defaults, **group_a}), optimizer([b.bias], **{**defaults, **group_b})]
    for _ in range(5):
        for model, opts in ((a, [opt]), (b, alone)):
            model.zero_grad()
            belay.mse_loss(model(x), y).backward()
            for o in opts:
                o.step()
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v)
    return opt


def test_adamw_parameter_groups_as_in_pytorch():
    opt = grouped_and_alone(belay.AdamW, {"lr": 2e-2, "weight_decay": 0.0},
                            {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.3, "decay_1d": True},
                            lr=5e-3, weight_decay=0.1)
    groups = opt.param_groups
    assert [len(g["params"]) for g in groups] == [1, 1]
    assert groups[0]["lr"] == pytest.approx(2e-2) and groups[0]["weight_decay"] == 0.0
    assert groups[1]["lr"] == pytest.approx(5e-3) and groups[1]["betas"] == pytest.approx((0.8, 0.99))
    assert opt.lr == pytest.approx(5e-3)  # the log's LR: the optimizer's own


def test_sgd_parameter_groups_as_in_pytorch():
    opt = grouped_and_alone(belay.SGD, {"lr": 0.1, "momentum": 0.0}, {"weight_decay": 0.5, "decay_1d": True},
                            lr=0.02, momentum=0.9)
    assert list(opt.state_tensors()) == ["optim.bias.momentum_buffer"]  # no momentum: no buffer


def test_a_schedule_scales_each_groups_lr_under_one_safestep(tmp_path):
    x, y = regression()
    m = TwoLayer()
    opt = belay.AdamW([{"params": [m.fc1.weight, m.fc1.bias, m.mix]},
                       {"params": m.heads[0], "lr": 1e-3, "weight_decay": 0.0}], lr=1e-2)
    sched = belay.LrSchedule.warmup_cosine(2e-2, 3, 20)
    step = belay.SafeStep(opt, belay.GradScaler(enabled=False), schedule=sched, max_norm=1.0)
    for k in range(6):
        row = step.run(lambda _: belay.mse_loss(m(x), y))
        assert row.lr == sched.lr_at(k)
        assert opt.param_groups[1]["lr"] == pytest.approx(sched.lr_at(k) * 0.1, rel=1e-6)
    path = str(tmp_path / "groups.safetensors")
    belay.save(path, m, opt, step=step)
    m2 = TwoLayer(seed=5)
    opt2 = belay.AdamW([{"params": [m2.fc1.weight, m2.fc1.bias, m2.mix]},
                        {"params": m2.heads[0], "lr": 1e-3, "weight_decay": 0.0}], lr=1e-2)
    step2 = belay.SafeStep(opt2, belay.GradScaler(enabled=False), schedule=sched, max_norm=1.0)
    belay.resume(path, m2, opt2, step=step2)
    rest = [step.run(lambda _: belay.mse_loss(m(x), y)) for _ in range(4)]
    assert [step2.run(lambda _: belay.mse_loss(m2(x), y)) for _ in range(4)] == rest
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(m2.state_dict()[k], v)
    m3 = TwoLayer()
    other = belay.AdamW([{"params": [m3.fc1.weight, m3.fc1.bias, m3.mix]},
                         {"params": m3.heads[0], "lr": 1e-3, "weight_decay": 0.5}], lr=1e-2)
    with pytest.raises(ValueError, match="was written with param_groups=.*weight_decay=0.0.*weight_decay=0.5"):
        belay.resume(path, m3, other)


def test_bad_parameter_groups_are_clear_errors():
    m = belay.Linear(8, 2)
    with pytest.raises(ValueError, match="unknown key 'momentum'; AdamW knows params, lr"):
        belay.AdamW([{"params": [m.weight], "momentum": 0.9}])
    with pytest.raises(ValueError, match="parameter group 1 has no 'params'"):
        belay.AdamW([{"params": [m.weight]}, {"lr": 0.1}])
    with pytest.raises(TypeError, match="parameter group 1 is a list"):
        belay.SGD([{"params": [m.weight]}, [m.bias]])
    with pytest.raises(TypeError, match="parameter group 0 'lr' must be a number, got str"):
        belay.AdamW([{"params": [m.weight], "lr": "fast"}])
    with pytest.raises(ValueError, match="give the optimizer an lr > 0"):
        belay.AdamW([{"params": [m.weight], "lr": 0.1}], lr=0.0)
    with pytest.raises(ValueError, match="'weight' is listed twice"):
        belay.AdamW([{"params": [m.weight]}, {"params": m}])


# ---- eval(), train(), the inference path, the GIL

def test_eval_records_no_graph_and_runs_an_fp16_model_without_autocast():
    x, _ = regression()
    m = TwoLayer()
    assert m.training and m.fc1.training
    m.set_working_dtype("fp16")
    with pytest.raises(ValueError, match="dtypes differ.*run under autocast"):
        m(x)  # training mode: the caller decides the precision, as before
    assert m.eval() is m and not m.training and not m.fc1.training and not m.heads[0].training
    out = m(x)
    assert not out.requires_grad and out.dtype == belay.float16
    with belay.no_grad(), belay.autocast("fp16"):
        expected = m.heads[0](belay.matmul(belay.relu(m.fc1(x)), m.mix))
    np.testing.assert_array_equal(out.numpy(), expected.numpy())
    with belay.autocast("bf16"):  # an autocast the caller set is kept
        assert m(x).dtype == belay.bfloat16
    m.train()
    assert m.training and m.fc1.training
    with belay.autocast("fp16"):
        assert m(x).requires_grad


def test_a_forward_from_python_releases_the_gil():
    # As test_belay's step test: with a long switch interval the counting thread runs during
    # model(x) only if the C++ forward let go of the GIL.
    x = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
    model = belay.Linear(512, 512)
    counter, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1
            if counter[0] % 100 == 0:
                time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    thread = threading.Thread(target=count)
    thread.start()
    moved = []
    try:
        for _ in range(20):  # a loaded machine may not run the thread in every forward; 20 stay well under 1 s
            before = counter[0]
            model(x)
            moved.append(counter[0] - before)
            if moved[-1] > 0:
                break
    finally:
        stop.set()
        sys.setswitchinterval(old)
        thread.join()
    assert max(moved) > 0, moved


# ---- belay.train: NumPy data, the CLI's option names

def test_train_on_numpy_arrays():
    x, y = regression(n=128)
    rows = belay.train(data=(x, y), steps=30, batch=32, lr=5e-2, quiet=True)
    assert rows[-1].loss < 0.1 * rows[0].loss
    labels = (x[:, 0] > 0).astype(np.int64)
    rows = belay.train(data=(x, labels), steps=30, batch=32, lr=5e-2, quiet=True)
    assert rows[-1].loss < rows[0].loss


@pytest.mark.parametrize("data, error, pattern", [
    ((np.ones(8, np.float32), np.ones((8, 2), np.float32)), ValueError, r"x must be \[N, in_features\]"),
    ((np.ones((8, 3), np.float32), np.ones((7, 2), np.float32)), ValueError, "x has 8 rows, y 7"),
    ((np.ones((8, 3), np.float32), np.ones(8, np.float32)), ValueError, "integer class labels"),
    ((np.ones((8, 3), np.int32), np.ones((8, 2), np.float32)), ValueError, "x must hold floats"),
    ((np.full((8, 3), np.nan, np.float32), np.ones((8, 2), np.float32)), ValueError, "x holds inf or NaN"),
    ((np.ones((8, 3), np.float32), -np.ones(8, np.int64)), ValueError, r"labels span \[-1, -1\]"),
    (5, TypeError, "data must be a safetensors path"),
])
def test_train_data_errors_name_the_problem(data, error, pattern):
    with pytest.raises(error, match=pattern):
        belay.train(data=data, steps=1, quiet=True)


def test_train_takes_the_clis_spellings():
    common = dict(dtype="fp16", steps=6, in_features=8, out_features=2, quiet=True)
    assert same_rows(belay.train(spike="3:1e8", **common), belay.train(spike={3: 1e8}, **common))
    assert same_rows(belay.train(spike=["2:10", "4:1e3"], **common), belay.train(spike={2: 10.0, 4: 1e3}, **common))
    with pytest.raises(ValueError, match="spike expects STEP:FACTOR"):
        belay.train(spike="3", **common)
    rows = belay.train(no_scaler=True, **common)
    assert all(r.scaler_scale == 1.0 for r in rows)
    assert same_rows(belay.train(scaler=False, **common), rows)
    with pytest.raises(TypeError, match="train: steps must be an int, got str"):
        belay.train(steps="ten")
    with pytest.raises(ValueError, match="in_features/out_features"):
        belay.train(dist="mpi")


# ---- errors that speak Python

def test_errors_are_python_exceptions_without_cpp_or_cli_names():
    assert issubclass(belay.UsageError, ValueError) and issubclass(belay.Error, RuntimeError)
    with pytest.raises(TypeError, match="AdamW: params must be a belay.Module or a list of parameters"):
        belay.AdamW(5)
    with pytest.raises(TypeError, match=r"SGD: params\[1\] is a int, not a parameter"):
        belay.SGD([belay.Linear(2, 2).weight, 3])
    with pytest.raises(TypeError, match="got one belay.Var: put it in a list"):
        belay.AdamW(belay.Linear(2, 2).weight)
    with pytest.raises(ValueError, match="^batch 32 is not a multiple of micro_batch 5$"):  # not --batch, --micro-batch
        belay.train(batch=32, micro_batch=5, quiet=True)
    with pytest.raises(ValueError, match="cannot open '/no/run--1.safetensors'"):  # a path is left as it is
        belay.train(resume="/no/run--1.safetensors", quiet=True)
    with pytest.raises(ValueError) as e:
        belay.autocast("fp16", fp32_ops="softmaxx")
    assert "--" not in str(e.value) and "fp32_ops" in str(e.value)
    w = belay.parameter(np.ones((2, 2), np.float32), "w")
    w16 = belay.cast(w, "fp16")
    with pytest.raises(ValueError) as e:
        belay.matmul(np.ones((1, 2), np.float32), w16)
    assert "::" not in str(e.value) and "autocast" in str(e.value)
    opt = belay.AdamW([w])
    step = belay.SafeStep(opt, belay.GradScaler())
    with pytest.raises(ValueError) as e:
        step.run(lambda k: belay.matmul(np.ones((1, 2), np.float32), w))  # a [1, 2] "loss"
    assert "::" not in str(e.value) and "one element" in str(e.value)


# ---- a `belay train` checkpoint from Python

def test_train_resume_reads_the_settings_the_checkpoint_stored(tmp_path):
    settings = dict(model="mlp", hidden=16, layers=3, in_features=8, out_features=2, dtype="fp16", lr=2e-2,
                    weight_decay=0.01, batch=16, seed=4, clip=1.0, quiet=True)
    whole = belay.train(steps=12, **settings)
    path = str(tmp_path / "run.safetensors")
    first = belay.train(steps=12, stop_at=6, checkpoint=path, **settings)
    assert same_rows(first, whole[:6])
    assert same_rows(belay.train(resume=path, steps=12, quiet=True), whole[6:])  # nothing else given back

    ck = belay.load_checkpoint(path)
    assert isinstance(ck.model, belay.Mlp) and ck.state.next_step == 6 and ck.optimizer.step_count == 6
    assert ck.scaler.enabled and ck.scaler.scale == ck.state.scaler.scale
    assert ck.model.parameters()[0].dtype == belay.float16
    # The same as loading into pieces built by hand with every setting passed back.
    model = belay.Mlp(8, 16, 2, layers=3)
    model.set_working_dtype("fp16")
    opt = belay.AdamW(model, lr=2e-2, weight_decay=0.01)
    belay.load_checkpoint(path, model, opt, ck.settings)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(ck.model.state_dict()[k], v)
    for k, v in opt.state_tensors().items():
        np.testing.assert_array_equal(ck.optimizer.state_tensors()[k].numpy(), v.numpy())
    belay.save(str(tmp_path / "plain.safetensors"), model, opt)
    with pytest.raises(ValueError, match="no `belay train` settings"):
        belay.load_checkpoint(str(tmp_path / "plain.safetensors"))


def test_the_readme_python_example_runs(capsys):
    readme = (pathlib.Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("## Python"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    exec(compile(code, "README.md", "exec"), {})
    first, last = capsys.readouterr().out.splitlines()[0].split(" -> ")
    assert float(last) < 0.01 * float(first)


def test_every_option_of_belay_train_is_a_keyword():
    # tests/apps/python/run.sh runs pytest in the build directory, beside the CLI it built.
    cli = pathlib.Path("belay")
    if not cli.exists():
        pytest.skip("no ./belay here: run through tests/apps/python/run.sh")
    help_text = subprocess.run([str(cli.resolve()), "train", "--help"], capture_output=True, text=True).stdout
    options = sorted(set(re.findall(r"--([a-z][a-z0-9-]*)", help_text)) - {"help"})
    cli_only = {"dist", "dist-progress-thread", "dist-timeout", "bucket-mb", "shard-optimizer", "inject-rank", "scenario",
                "print-config"}
    renamed = {"in": "in_features", "out": "out_features"}
    assert len(options) > 50
    for option in options:
        if option in cli_only:
            continue
        key = renamed.get(option, option.replace("-", "_"))
        with pytest.raises(TypeError, match=f"train: {key}|data must be"):  # a wrong type, not an unknown option
            belay.train(**{key: object()})


def _cli_or_skip():
    cli = pathlib.Path("belay")
    if not cli.exists():
        pytest.skip("no ./belay here: run through tests/apps/python/run.sh")
    return str(cli.resolve())


# The words of the options that are words; other values follow the type --help gives.
_GOOD_WORDS = {"model": "mlp", "optimizer": "sgd", "schedule": "cosine", "dtype": "bf16", "grad-dtype": "compute",
               "clip-mode": "value", "fp32-ops": "linear,gelu", "device": "cuda", "spike": "3:1e8",
               "rollback-on": "divergence", "rollback-policy": "fp32"}


def test_every_keyword_gives_the_config_the_cli_option_gives(tmp_path):
    # One option table for both (apps/run/train_options.h): the same value, the same config,
    # as `belay train --print-config` prints it and belay._belay._train_config_text gives it.
    cli = _cli_or_skip()
    # --init opens its file as the options are finished (a checkpoint or model file gives the
    # model's settings): a safetensors file of no tensors and no settings is a good word.
    weights_only = tmp_path / "init.safetensors"
    weights_only.write_bytes(struct.pack("<Q", 8) + b"{}      ")
    words = {**_GOOD_WORDS, "init": str(weights_only)}
    help_text = subprocess.run([cli, "train", "--help"], capture_output=True, text=True).stdout
    typed = dict(re.findall(r"--([a-z][a-z0-9-]*) (INT|UINT|FLOAT|TEXT)", help_text))
    flags = set(re.findall(r"--([a-z][a-z0-9-]*)\s", help_text)) - set(typed) - {"help"}
    cli_only = {"dist", "dist-progress-thread", "dist-timeout", "bucket-mb", "shard-optimizer", "inject-rank", "scenario",
                "print-config"}
    renamed = {"in": "in_features", "out": "out_features"}
    checked = 0
    for option in sorted((set(typed) | flags) - cli_only):
        key = renamed.get(option, option.replace("-", "_"))
        if option in flags:
            args, value = [f"--{option}"], True
        elif option in words:
            args, value = [f"--{option}", words[option]], words[option]
        elif typed[option] == "FLOAT":
            args, value = [f"--{option}", "0.375"], 0.375
        elif typed[option] == "TEXT":
            args, value = [f"--{option}", "some/file.safetensors"], "some/file.safetensors"
        else:
            args, value = [f"--{option}", "7"], 7
        printed = subprocess.run([cli, "train", *args, "--print-config"], capture_output=True, text=True)
        assert printed.returncode == 0, (option, printed.stderr)
        assert belay._belay._train_config_text(**{key: value}) == printed.stdout, option
        checked += 1
    assert checked > 55


@pytest.mark.parametrize("option,word", [("grad-dtype", "fp64"), ("clip-mode", "both"), ("rollback-on", "sometimes"),
                                         ("dtype", "fp8"), ("spike", "12"), ("fp32-ops", "nothing"),
                                         ("rollback-policy", "lower-lr")])
def test_a_bad_word_gives_the_cli_message_with_the_keyword(option, word):
    cli = _cli_or_skip()
    refused = subprocess.run([cli, "train", f"--{option}", word, "--print-config"], capture_output=True, text=True)
    assert refused.returncode == 2
    message = refused.stderr.strip().removeprefix("belay: error: ")
    key = option.replace("-", "_")
    with pytest.raises(belay.UsageError) as e:
        belay.train(**{key: word})
    assert str(e.value) == message.replace(f"--{option}", key)
