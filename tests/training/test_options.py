"""TrainingOptions: MATLAB's defaults, checked values, helpful errors, readable repr."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
import torch

from nbscale import OptionsError, TrainingOptions
from nbscale.training.option_names import MATLAB_ONLY, field_meant, snake_case
from nbscale.training.options import field_names


def test_defaults_follow_matlab_and_depend_on_the_solver() -> None:
    sgdm, adam, rmsprop = TrainingOptions("sgdm"), TrainingOptions("adam"), TrainingOptions("rmsprop")
    assert (sgdm.initial_learn_rate, adam.initial_learn_rate) == (0.01, 0.001)
    assert (adam.squared_gradient_decay_factor, rmsprop.squared_gradient_decay_factor) == (0.999, 0.9)
    assert sgdm.max_epochs == 30 and sgdm.mini_batch_size == 128 and sgdm.momentum == 0.9
    assert sgdm.l2_regularization == 1e-4 and math.isinf(sgdm.gradient_threshold)
    assert sgdm.shuffle == "once" and sgdm.validation_frequency == 50 and sgdm.verbose_frequency == 50
    assert sgdm.data_placement == "auto" and sgdm.plots == "none"


def test_misspelt_field_suggests_the_right_name() -> None:
    with pytest.raises(OptionsError, match="initial_learn_rate"):
        TrainingOptions("sgdm", initial_learning_rate=0.1)
    with pytest.raises(ValueError, match="max_epochs"):
        TrainingOptions("sgdm", max_epoch=3)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("shuffle", "sometimes", "'every-epoch'"),
        ("learn_rate_schedule", "linear", "'warmup-cosine'"),
        ("mini_batch_size", 0, "integer"),
        ("mini_batch_size", "big", "an integer >= 1, or 'auto' (fitted to GPU memory)"),
        ("learn_rate_reference_batch", 0, "integer"),
        ("max_epochs", 2.5, "integer"),
        ("execution_environment", "tpu", "'multi-gpu'"),
        ("gradient_threshold_method", "l1", "'global-l2norm'"),
        ("worker_load", [0, 0], "at least one positive"),
        ("precision", "half", "'mixed'"),
        ("data_placement", "disk", "'stream'"),
    ],
)
def test_bad_value_names_the_field_and_the_allowed_values(field: str, value: object, allowed: str) -> None:
    with pytest.raises(OptionsError) as caught:
        TrainingOptions("sgdm", **{field: value})
    assert field in str(caught.value) and allowed in str(caught.value)


def test_bad_solver_and_setting_a_field_later_are_checked() -> None:
    with pytest.raises(OptionsError, match="'adamw'"):
        TrainingOptions("lbfgs")
    options = TrainingOptions("adam")
    options.max_epochs = 5
    assert options.max_epochs == 5
    with pytest.raises(OptionsError, match="momentum"):
        options.momentum = 2.0
    with pytest.raises(OptionsError, match="Did you mean 'momentum'"):
        options.momentun = 0.5


def test_an_observer_is_told_of_each_accepted_change_and_is_not_part_of_the_options() -> None:
    options, told = TrainingOptions("adam"), []
    options.observe(lambda changed: told.append(changed.max_epochs))
    options.max_epochs = 5
    with pytest.raises(OptionsError):
        options.max_epochs = 0
    assert told == [5]
    assert options == TrainingOptions("adam", max_epochs=5)
    assert repr(options) == repr(TrainingOptions("adam", max_epochs=5))
    assert "_observer" not in dataclasses.asdict(options) and "_observer" not in options.to_dict()
    copied = pickle.loads(pickle.dumps(options))
    copied.max_epochs = 6
    assert told == [5] and copied.max_epochs == 6


def test_setting_the_solver_or_none_later_gives_the_solver_defaults_as_the_constructor_does() -> None:
    options = TrainingOptions("sgdm", momentum=0.5)
    options.solver = "rmsprop"
    assert (options.initial_learn_rate, options.squared_gradient_decay_factor) == (0.001, 0.9)
    assert options == TrainingOptions("rmsprop", momentum=0.5)
    explicit = TrainingOptions("sgdm", initial_learn_rate=0.2)
    explicit.solver = "adam"
    assert explicit.initial_learn_rate == 0.2  # a value the user set stays
    explicit.initial_learn_rate = None
    assert explicit.initial_learn_rate == 0.001


def test_open_ended_ranges_do_not_offer_infinity_unless_it_is_allowed() -> None:
    with pytest.raises(OptionsError, match=r"initial_learn_rate must be a finite number > 0\.$"):
        TrainingOptions("sgdm", initial_learn_rate=math.inf)
    with pytest.raises(
        OptionsError,
        match=r"mini_batch_size must be an integer >= 1, or 'auto' \(fitted to GPU "
        r"memory\)\.$",
    ):
        TrainingOptions("sgdm", mini_batch_size=0)
    with pytest.raises(OptionsError, match=r"gradient_threshold must be a number > 0 or math.inf\.$"):
        TrainingOptions("sgdm", gradient_threshold=0)


@pytest.mark.parametrize("data", ["abc", (1, 2, 3), math.nan])
def test_validation_data_without_labels_is_refused(data: object) -> None:
    with pytest.raises(OptionsError, match="validation_data must be None, a torch Dataset or DataLoader, or a tuple"):
        TrainingOptions("sgdm", validation_data=data)


def test_best_validation_needs_validation_data() -> None:
    with pytest.raises(OptionsError, match="validation_data"):
        TrainingOptions("sgdm", output_network="best-validation")


def test_repr_lists_every_field_readably() -> None:
    def show_progress(info: object) -> None:  # a function of the test's own: a Ray client in this process wraps print
        pass

    text = repr(TrainingOptions("adam", max_epochs=4, output_fn=show_progress))
    assert text.startswith("TrainingOptions('adam',") and "max_epochs=4," in text
    assert "<function show_progress>" in text and "data_placement='auto'" in text


def test_replace_changes_solver_defaults_but_keeps_explicit_values() -> None:
    options = TrainingOptions("sgdm", max_epochs=3)
    assert options.replace(solver="adam").initial_learn_rate == 0.001
    assert options.replace(solver="adam").max_epochs == 3
    assert TrainingOptions("sgdm", initial_learn_rate=0.2).replace(solver="adam").initial_learn_rate == 0.2


def test_dataclasses_replace_gives_a_checked_copy_as_for_any_dataclass() -> None:
    options = TrainingOptions("adam", max_epochs=3, mini_batch_size=64)
    changed = dataclasses.replace(options, max_epochs=5)
    assert isinstance(changed, TrainingOptions)
    assert (changed.solver, changed.max_epochs, changed.mini_batch_size) == ("adam", 5, 64)
    assert options.max_epochs == 3
    with pytest.raises(OptionsError, match="max_epochs"):
        dataclasses.replace(options, max_epochs=0)


def test_numpy_numbers_whole_floats_and_matlab_flags_are_accepted_as_plain_python_values() -> None:
    import numpy as np

    options = TrainingOptions(
        "sgdm",
        mini_batch_size=np.int64(64),
        max_epochs=3.0,
        initial_learn_rate=np.float32(0.5),
        validation_frequency=np.int32(10),
        verbose=0,
        dispatch_in_background=np.bool_(False),
    )
    assert options.mini_batch_size == 64 and type(options.mini_batch_size) is int
    assert options.max_epochs == 3 and type(options.max_epochs) is int
    assert options.initial_learn_rate == 0.5 and type(options.initial_learn_rate) is float
    assert type(options.validation_frequency) is int and options.verbose is False
    assert options.dispatch_in_background is False
    options.verbose = 1
    assert options.verbose is True
    with pytest.raises(OptionsError, match="verbose must be True or False"):
        TrainingOptions("sgdm", verbose=2)
    with pytest.raises(OptionsError, match=r"max_epochs=0 is not allowed"):
        TrainingOptions("sgdm", max_epochs=np.int64(0))


def test_a_refused_change_leaves_the_options_as_they_were() -> None:
    options = TrainingOptions("sgdm", output_network="last-iteration")
    with pytest.raises(OptionsError, match="validation_data"):
        options.output_network = "best-validation"
    assert options.output_network == "last-iteration"


def test_a_typo_sized_epoch_count_is_refused_with_the_limit() -> None:
    with pytest.raises(OptionsError, match=r"max_epochs=1e\+23 .* an integer in \[1, 1000000\]"):
        TrainingOptions("sgdm", max_epochs=1e23)


def test_worker_load_as_a_string_is_refused_not_read_digit_by_digit() -> None:
    with pytest.raises(OptionsError, match=r"worker_load='12' is not allowed.*e\.g\. \[1, 2\]"):
        TrainingOptions("sgdm", worker_load="12")


def test_compile_takes_a_flag_or_a_torch_compile_mode() -> None:
    assert TrainingOptions("sgdm", compile=True).compile is True
    assert TrainingOptions("sgdm", compile="max-autotune").compile == "max-autotune"
    with pytest.raises(OptionsError, match=r"compile must be True, False, or a torch.compile mode: 'default'"):
        TrainingOptions("sgdm", compile="fast")


@pytest.mark.parametrize(
    ("name", "good", "bad"), [("on_worker_failure", "restart", "retry"), ("learn_rate_scaling", "linear", "sqrt")]
)
def test_new_choice_fields_name_their_allowed_values(name: str, good: str, bad: str) -> None:
    assert getattr(TrainingOptions("sgdm", **{name: good}), name) == good
    with pytest.raises(OptionsError, match=rf"{name}='{bad}' is not allowed: {name} must be one of"):
        TrainingOptions("sgdm", **{name: bad})


def test_choices_are_taken_in_any_case_as_matlab_takes_them_and_kept_in_lower_case() -> None:
    options = TrainingOptions("Adam", execution_environment="CPU", shuffle="Every-Epoch", plots="None")
    assert (options.solver, options.execution_environment, options.shuffle, options.plots) == (
        "adam",
        "cpu",
        "every-epoch",
        "none",
    )
    assert options.initial_learn_rate == 0.001  # adam's default, found from the name in any case
    options.solver = "RMSProp"
    assert options.solver == "rmsprop"
    with pytest.raises(OptionsError, match=r"solver='Adamx' is not allowed: solver must be one of 'sgdm'"):
        TrainingOptions("Adamx")


# API.md's TrainingOptions line: every field it names, and the choices it gives for each
CONTRACT_FIELDS = (
    "initial_learn_rate momentum gradient_decay_factor squared_gradient_decay_factor epsilon l2_regularization "
    "gradient_threshold gradient_threshold_method max_epochs mini_batch_size shuffle learn_rate_schedule "
    "learn_rate_drop_factor learn_rate_drop_period validation_data validation_frequency validation_patience "
    "output_network execution_environment worker_load dispatch_in_background precision plots verbose "
    "verbose_frequency checkpoint_path checkpoint_frequency output_fn compile on_worker_failure learn_rate_scaling"
).split()
CONTRACT_CHOICES = {
    "solver": ["sgdm", "adam", "adamw", "rmsprop"],
    "shuffle": ["once", "never", "every-epoch"],
    "learn_rate_schedule": ["none", "piecewise", "cosine", "warmup-cosine"],
    "output_network": ["last-iteration", "best-validation"],
    "execution_environment": ["auto", "cpu", "gpu", "multi-gpu", "parallel"],
    "precision": ["single", "mixed"],
    "plots": ["training-progress", "none"],
    "on_worker_failure": ["error", "restart"],
    "learn_rate_scaling": ["none", "linear"],
}


def test_every_field_and_choice_the_contract_names_is_taken() -> None:
    assert set(CONTRACT_FIELDS) <= set(dataclasses.asdict(TrainingOptions()))
    for field, choices in CONTRACT_CHOICES.items():
        for choice in choices:
            extra = {"validation_data": ([[0.0]], [0])} if choice == "best-validation" else {}
            options = TrainingOptions(choice) if field == "solver" else TrainingOptions(**{field: choice}, **extra)
            assert getattr(options, field) == choice
        with pytest.raises(ValueError, match=f"{field} must be one of " + ", ".join(f"'{c}'" for c in choices)):
            TrainingOptions(**{field: "nonsense"})
    assert TrainingOptions(mini_batch_size="auto").mini_batch_size == "auto"
    assert TrainingOptions(compile=True).compile is True and TrainingOptions().compile is False


def test_matlab_name_value_pairs_are_read_as_the_keyword_hint_reads_the_names() -> None:
    options = TrainingOptions("sgdm", "InitialLearnRate", 0.05, "MaxEpochs", 4, "Verbose", 0, mini_batch_size=32)
    assert options == TrainingOptions("sgdm", initial_learn_rate=0.05, max_epochs=4, verbose=False, mini_batch_size=32)
    assert TrainingOptions("adam", "max_epochs", 2).max_epochs == 2
    with pytest.raises(OptionsError, match="Did you mean 'initial_learn_rate'"):
        TrainingOptions("sgdm", InitialLearnRate=0.05)  # the hint that names the same field
    with pytest.raises(OptionsError, match="Did you mean 'output_fn'"):
        TrainingOptions("sgdm", OutputFcn=print)


def test_matlab_names_with_an_nbscale_field_are_accepted_as_pairs() -> None:
    stop = lambda info: False  # noqa: E731
    validation = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    options = TrainingOptions(
        "adam",
        *("InitialLearnRate", 0.002, "MaxEpochs", 3, "MiniBatchSize", 16, "ObjectiveMetricName", "accuracy"),
        *("Metrics", ["accuracy"], "OutputFcn", stop, "ValidationData", validation, "Shuffle", "every-epoch"),
        *("Plots", "training-progress", "Verbose", False, "L2Regularization", 0.0, "DispatchInBackground", True),
    )
    assert (options.initial_learn_rate, options.max_epochs, options.mini_batch_size) == (0.002, 3, 16)
    assert options.objective_metric == "accuracy" and options.output_fn is stop
    assert options.validation_data is validation and options.shuffle == "every-epoch"
    assert options.plots == "training-progress" and options.verbose is False and options.l2_regularization == 0.0
    assert options.dispatch_in_background is True


def test_every_matlab_name_the_reference_gives_a_field_means_that_field() -> None:
    from tests.reference_doc import FIELDS

    names = field_names()
    matlab_names = {
        field: matlab for field, (matlab, _) in FIELDS.items() if matlab.isidentifier() and field != "solver"
    }
    assert matlab_names["output_fn"] == "OutputFcn" and matlab_names["objective_metric"] == "ObjectiveMetricName"
    assert {field: field_meant(matlab, names) for field, matlab in matlab_names.items()} == {
        field: field for field in matlab_names
    }
    assert not set(MATLAB_ONLY) & set(matlab_names.values())  # an option nbscale has is never said to be missing


@pytest.mark.parametrize(
    ("name", "value", "instead"),
    [
        ("PreprocessingEnvironment", "parallel", "dispatch_in_background=True"),
        ("CheckpointFrequencyUnit", "iteration", "checkpoint_frequency counts epochs"),
        ("LearnRateScheduleSettings", {}, "learn_rate_drop_factor and learn_rate_drop_period"),
        ("SequenceLength", 8, "collate_fn"),
        ("BatchNormalizationStatistics", "population", "docs/training.md"),
    ],
)
def test_a_matlab_option_nbscale_lacks_is_refused_as_such_never_read_as_a_close_field(
    name: str, value: object, instead: str
) -> None:
    with pytest.raises(OptionsError) as caught:
        TrainingOptions("sgdm", "MaxEpochs", 2, name, value)
    message = str(caught.value)
    assert message.startswith(f"TrainingOptions got MATLAB's {name!r}, and nbscale has no such option")
    assert instead in message and "\n" not in message and "Did you mean" not in message
    with pytest.raises(OptionsError, match=f"MATLAB's {name!r}, and nbscale has no such option"):
        TrainingOptions("sgdm", **{name: value})  # the keyword hint says the same
    snake = snake_case(name)
    with pytest.raises(OptionsError, match=f"'{snake}' \\(MATLAB's {name}\\), and nbscale has no such option"):
        TrainingOptions("sgdm", **{snake: value})
    assert field_meant(name, field_names()) is None and field_meant(snake, field_names()) is None


def test_checkpoint_frequency_with_its_matlab_unit_is_refused_for_the_unit_not_as_a_duplicate() -> None:
    with pytest.raises(OptionsError) as caught:
        TrainingOptions("sgdm", "CheckpointFrequency", 2, "CheckpointFrequencyUnit", "epoch")
    assert "'CheckpointFrequencyUnit'" in str(caught.value) and "both mean" not in str(caught.value)
    assert TrainingOptions("sgdm", "CheckpointFrequency", 2).checkpoint_frequency == 2


def test_a_close_name_is_only_suggested_never_taken() -> None:
    with pytest.raises(OptionsError) as caught:
        TrainingOptions("sgdm", "InitialLernRate", 0.1)
    assert str(caught.value).startswith("TrainingOptions has no option 'InitialLernRate'. Did you mean 'initial_learn")
    assert field_meant("InitialLernRate", field_names()) is None
    assert field_meant("initial_learning_rate", field_names()) is None
    assert field_meant("L2Regularization", field_names()) == "l2_regularization"


@pytest.mark.parametrize(
    ("pairs", "shown"),
    [
        (("InitialLearnRate", 0.01, "MaxEpochs"), "'MaxEpochs' has no value after it"),
        ((0.01,), "0.01 is not an option name"),
        (("InitialLearnRate", 0.01, "MaxEpochs", 2, "max_epochs", 3), "both mean 'max_epochs'"),
    ],
)
def test_a_name_value_pair_that_cannot_be_read_is_refused_in_one_line_showing_the_keyword_form(
    pairs: tuple[object, ...], shown: str
) -> None:
    with pytest.raises(OptionsError) as caught:
        TrainingOptions("sgdm", *pairs)
    message = str(caught.value)
    assert shown in message and "\n" not in message and "TrainingOptions('sgdm', " in message
    assert "initial_learn_rate=0.01" in message


def test_a_pair_and_a_keyword_for_one_field_or_a_pytorch_name_as_a_pair_are_refused() -> None:
    with pytest.raises(OptionsError, match="max_epochs both as a name-value pair and as a keyword"):
        TrainingOptions("sgdm", "MaxEpochs", 3, max_epochs=4)
    with pytest.raises(OptionsError, match="initial_learn_rate="):
        TrainingOptions("sgdm", "lr", 0.1)
