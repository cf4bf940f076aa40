"""The values TrainingOptions' named choices allow: each a Literal type and its tuple of names."""

from __future__ import annotations

from typing import Literal, get_args

Solver = Literal["sgdm", "adam", "adamw", "rmsprop"]
ShuffleMode = Literal["once", "never", "every-epoch"]
Schedule = Literal["none", "piecewise", "cosine", "warmup-cosine"]
ThresholdMethod = Literal["l2norm", "global-l2norm", "absolute-value"]
OutputNetwork = Literal["last-iteration", "best-validation"]
Environment = Literal["auto", "cpu", "gpu", "multi-gpu", "parallel"]
Precision = Literal["single", "mixed"]
Plots = Literal["training-progress", "none"]
DataPlacement = Literal["auto", "stream", "device"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
WorkerFailure = Literal["error", "restart"]
LearnRateScaling = Literal["none", "linear"]
AutoBatch = Literal["auto"]
ScheduleStep = Literal["iteration", "epoch"]
ObjectiveGoal = Literal["auto", "minimize", "maximize"]

SOLVERS: tuple[str, ...] = get_args(Solver)
SHUFFLE_MODES: tuple[str, ...] = get_args(ShuffleMode)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
THRESHOLD_METHODS: tuple[str, ...] = get_args(ThresholdMethod)
OUTPUT_NETWORKS: tuple[str, ...] = get_args(OutputNetwork)
ENVIRONMENTS: tuple[str, ...] = get_args(Environment)
PRECISIONS: tuple[str, ...] = get_args(Precision)
PLOTS: tuple[str, ...] = get_args(Plots)
DATA_PLACEMENTS: tuple[str, ...] = get_args(DataPlacement)
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
WORKER_FAILURES: tuple[str, ...] = get_args(WorkerFailure)
LEARN_RATE_SCALINGS: tuple[str, ...] = get_args(LearnRateScaling)
SCHEDULE_STEPS: tuple[str, ...] = get_args(ScheduleStep)
OBJECTIVE_GOALS: tuple[str, ...] = get_args(ObjectiveGoal)
MAX_EPOCHS_LIMIT = 1_000_000  # more is a typo (1e23), not a plan: it would train until interrupted


# MATLAB's solver-dependent defaults: each field's default by solver
SOLVER_DEFAULTS: dict[str, dict[str, float]] = {
    "initial_learn_rate": {"sgdm": 0.01, "adam": 0.001, "adamw": 0.001, "rmsprop": 0.001},
    "squared_gradient_decay_factor": {"sgdm": 0.999, "adam": 0.999, "adamw": 0.999, "rmsprop": 0.9},
}
