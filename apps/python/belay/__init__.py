"""belay: mixed-precision training (FP16/BF16 compute, FP32 masters) whose safety belts --
dynamic loss scaling, global-norm clipping, skipping a non-finite step -- are fused into one
ordered step that logs what it did.

    model = belay.Linear(64, 8, seed=0)
    opt = belay.AdamW(model, lr=1e-2, weight_decay=0.0)
    step = belay.SafeStep(opt, belay.GradScaler(), max_norm=1.0)
    def loss_fn(k):
        with belay.autocast("fp16"):
            return belay.mse_loss(model(x), y)
    row = step.run(loss_fn)          # a StepRow: step, lr, norms, loss, skipped, reason, scale

Everything numeric runs in the C++ engine (belay._belay); this file adds what is easier said
in Python: belay.Module to subclass (a model written in Python, as torch.nn.Module), the
checkpoint helpers that gather a run's pieces, and train(resume=...) / load_checkpoint(path)
reading a `belay train` checkpoint's settings.
"""
import collections as _collections
import os as _os

from . import _belay
from ._belay import *  # noqa: F401,F403  (the module defines no private names but _belay's own)
from ._belay import (AdamW, Error, Gpt, GradScaler, Linear, Mlp, RunState, SGD, StepRow, UsageError, Var, __version__,
                     inspect_checkpoint, save_checkpoint)
from ._belay import Module as _Module


def _settings(settings, optimizer=None):
    """The settings as strings. fp32_ops (the ops autocast keeps in FP32) is a precision-policy
    setting that belay's resume check always compares, defaulting a checkpoint's to "none": so
    it is recorded as "none" here unless given, as belay train records it. An optimizer with
    parameter groups adds "param_groups" (each group's parameters and options but its LR,
    which the schedule moves), so a resume into other groups is refused, naming both."""
    out = {str(k): str(v) for k, v in (settings or {}).items()}
    out.setdefault("fp32_ops", "none")
    groups = getattr(optimizer, "param_groups", None) or []
    if len(groups) > 1:
        out.setdefault("param_groups", "; ".join(
            ",".join(p.name for p in g["params"]) + " " +
            " ".join(f"{k}={v!r}" for k, v in sorted(g.items()) if k not in ("params", "lr")) for g in groups))
    return out


def save(path, model, optimizer, scaler=None, step=None, settings=None, data_position=""):
    """Checkpoint a run atomically: masters, optimizer state, the applied-step count, the
    scaler state and the next step of `step` (a SafeStep). `settings` (str -> str) must match
    when resuming."""
    state = RunState()
    state.next_step = step.next_step if step is not None else 0
    state.optimizer_steps = optimizer.step_count
    if scaler is not None:
        state.scaler = scaler.state()
    state.data_position = data_position
    model.named_parameters()  # a belay.Module names its parameters by path: the names the settings record
    state.settings = _settings(settings, optimizer)
    save_checkpoint(path, model, optimizer, state)


def resume(path, model, optimizer, scaler=None, step=None, settings=None, new_experiment=False):
    """Load a checkpoint written by save() into the run's pieces; returns its RunState.
    Everything is checked before anything changes (belay.UsageError names the problem).
    new_experiment: accept other precision-policy settings (dtype, scaling, ...)."""
    model.named_parameters()
    state = load_checkpoint(path, model, optimizer, _settings(settings, optimizer), new_experiment)
    if scaler is not None and state.scaler_state_loaded:
        scaler.load_state(state.scaler)
    if step is not None:
        step.next_step = state.next_step
    return state


class Module(_Module):
    """A model written in Python, as torch.nn.Module: call super().__init__(), assign
    parameters (belay.parameter) and sub-modules (belay.Linear, another Module, or lists of
    them) as attributes, define forward. They are registered by being attributes: parameters(),
    named_parameters(), state_dict(), load_state_dict(), set_working_dtype(), belay.save and
    the optimizers see them under their attribute paths ("fc1.weight"), and model(x) calls
    forward (in eval mode without a graph, under autocast in the model's working dtype).

        class TwoLayer(belay.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = belay.Linear(4, 16, seed=0)
                self.mix = belay.parameter(np.eye(16, dtype=np.float32))
                self.fc2 = belay.Linear(16, 2, seed=1)
            def forward(self, x):
                return self.fc2(belay.relu(self.fc1(x)) @ self.mix)
    """

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if isinstance(value, (Var, _Module, list, tuple)):
            self.named_parameters()  # names the parameters by their paths from here, as assigned

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward(): a belay.Module subclass defines "
                                  "forward(self, x) returning a belay.Var, as a torch.nn.Module does")

    def named_children(self):
        """(name, module) for every sub-module attribute, in the order they were assigned
        (list and tuple attributes as name.0, name.1, ...)."""
        for name, value in vars(self).items():
            if isinstance(value, _Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, _Module):
                        yield f"{name}.{i}", item

    def named_parameters(self):
        """[(path, parameter)] in the order the attributes were assigned; a parameter reached
        twice (shared between sub-modules) is listed once, under its first path. Each
        parameter takes its path as its name (what optimizer state and checkpoints use)."""
        out, seen = [], set()

        def add(name, p):
            if p._id not in seen:
                seen.add(p._id)
                p._set_name(name)
                out.append((name, p))

        for name, value in vars(self).items():
            items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
            for i, item in items:
                path = name if i is None else f"{name}.{i}"
                if isinstance(item, Var) and item.is_parameter:
                    add(path, item)
                elif isinstance(item, _Module):
                    for sub, p in item.named_parameters():
                        add(f"{path}.{sub}", p)
        return out

    def train(self, mode=True):
        """Sets the training flag here and in every sub-module; returns self."""
        _Module.train(self, mode)
        for _, child in self.named_children():
            child.train(mode)
        return self

    def eval(self):
        """train(False): model(x) then records no graph and runs an FP16/BF16 model under
        autocast in its working dtype (belay has no dropout or batch norm to switch)."""
        return self.train(False)

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        for name, child in self.named_children():
            lines.append(f"  ({name}): {child!r}")
        for name, value in vars(self).items():
            if isinstance(value, Var) and value.is_parameter:
                lines.append(f"  ({name}): parameter {tuple(value.shape)} {value.dtype.name}")
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


# ---- `belay train` checkpoints read from Python

def _hex_float(text):
    return float.fromhex(text) if text.startswith(("0x", "-0x")) else float(text)


def _train_options_of(path):
    """The belay.train keywords a `belay train` checkpoint's stored settings give (what the
    resume check compares): the model's kind and shape as the model-kind table reads them."""
    info = inspect_checkpoint(path)
    s = dict(info["state"].settings)
    if "model" not in s:
        raise UsageError(f"checkpoint '{path}' holds no `belay train` settings (written by belay.save? "
                         "then build the model and optimizer and call belay.resume)")
    kw = {**_belay._model_keywords(s, path), "dtype": s["dtype"], "grad_dtype": s["grad_dtype"], "optimizer": s["optimizer"], "lr": _hex_float(s["lr"]),
          "weight_decay": _hex_float(s["weight_decay"]), "schedule": s["schedule"], "batch": int(s["batch"]),
          "micro_batch": int(s["micro_batch"]), "seed": int(s["seed"]), "unfused": s["fused"] == "0",
          "scaler": s["scaler"] == "1"}
    clip = _hex_float(s["clip"])
    if clip != float("inf"):
        kw["clip"] = clip
    if s.get("fp32_ops", "none") != "none":
        kw["fp32_ops"] = s["fp32_ops"]
    return kw, s


def train(**options):
    """belay train as a function: the CLI's long options as keywords ('-' as '_'; --in/--out are
    in_features/out_features); returns the StepRows. data= a safetensors path or (x, y) arrays.
    With resume=path, the settings stored in that `belay train` checkpoint (model, sizes, dtype,
    optimizer, lr, ...) are the defaults: give steps= and only what changes (steps counts the
    whole run). momentum, warmup, schedule lengths and data arrays are not stored: give them
    again if the run had them. See _belay.train for the early-stop and Ctrl-C behaviour."""
    options = {k: _os.fspath(v) if isinstance(v, _os.PathLike) else v for k, v in options.items()}  # paths as str
    resume = options.get("resume")
    if resume is not None and not isinstance(resume, str):
        raise TypeError(f"train: resume must be a str (a checkpoint's path), got {type(resume).__name__}")
    if resume:
        stored, _ = _train_options_of(resume)
        if isinstance(options.get("data"), (tuple, list)):
            stored.pop("in_features")
            stored.pop("out_features")
        options = {**stored, **options}
    return _belay.train(**options)


train.__doc__ += "\n\n" + (_belay.train.__doc__ or "")

Checkpoint = _collections.namedtuple("Checkpoint", "model optimizer scaler state settings")
Checkpoint.__doc__ = "What belay.load_checkpoint(path) rebuilt from a `belay train` checkpoint"


def load_checkpoint(path, model=None, optimizer=None, settings=None, new_experiment=False):
    """Two forms.

    load_checkpoint(path): a `belay train` checkpoint alone -> Checkpoint(model, optimizer,
    scaler, state, settings): the model (Linear, Mlp or Gpt, in its working dtype) and optimizer
    built from the stored settings and loaded bit for bit, a GradScaler in the saved state.
    The LR schedule is the optimizer's constant lr (set_schedule to continue a cosine one).

    load_checkpoint(path, model, optimizer, settings={}, new_experiment=False): loads into
    pieces you built; checks everything first; returns the RunState."""
    if model is not None or optimizer is not None:
        if model is None or optimizer is None:
            raise TypeError("load_checkpoint: give both model and optimizer, or neither (to rebuild them from the file)")
        return _belay.load_checkpoint(path, model, optimizer, settings or {}, new_experiment)
    kw, stored = _train_options_of(path)
    net = _belay._model_from_settings(stored, path)  # the model-kind table's, as belay train built it
    keeps_fp32 = "linear" in kw.get("fp32_ops", "").split(",")
    net.set_working_dtype("fp32" if keeps_fp32 else kw["dtype"])
    net.set_grad_dtype(kw["dtype"] if kw["grad_dtype"] == "compute" else "fp32")
    if kw["optimizer"] == "sgd":
        opt = SGD(net, lr=kw["lr"], weight_decay=kw["weight_decay"])
    else:
        opt = AdamW(net, lr=kw["lr"], weight_decay=kw["weight_decay"])
    state = _belay.load_checkpoint(path, net, opt, stored, new_experiment)
    scaler = GradScaler(enabled=kw["scaler"])
    if kw["scaler"] and state.scaler_state_loaded:
        scaler.load_state(state.scaler)
    return Checkpoint(net, opt, scaler, state, stored)
