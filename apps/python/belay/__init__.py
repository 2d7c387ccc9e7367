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

Everything numeric runs in the C++ engine (belay._belay); this file adds the two checkpoint
helpers that gather a run's pieces.
"""
from ._belay import *  # noqa: F401,F403  (the module defines no private names but _belay's own)
from ._belay import Error, RunState, StepRow, UsageError, __version__, inspect_checkpoint, load_checkpoint, save_checkpoint


def _settings(settings):
    """The settings as strings. fp32_ops (the ops autocast keeps in FP32) is a precision-policy
    setting that belay's resume check always compares, defaulting a checkpoint's to "none": so
    it is recorded as "none" here unless given, as belay train records it."""
    out = {str(k): str(v) for k, v in (settings or {}).items()}
    out.setdefault("fp32_ops", "none")
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
    state.settings = _settings(settings)
    save_checkpoint(path, model, optimizer, state)


def resume(path, model, optimizer, scaler=None, step=None, settings=None, new_experiment=False):
    """Load a checkpoint written by save() into the run's pieces; returns its RunState.
    Everything is checked before anything changes (belay.UsageError names the problem).
    new_experiment: accept other precision-policy settings (dtype, scaling, ...)."""
    state = load_checkpoint(path, model, optimizer, _settings(settings), new_experiment)
    if scaler is not None and state.scaler_state_loaded:
        scaler.load_state(state.scaler)
    if step is not None:
        step.next_step = state.next_step
    return state
