"""mini_batch_size="auto" (the largest mini-batch that fits every worker's GPU) and learn_rate_scaling="linear".

The search and the choices are tested here with an injected "fits" predicate, the CPU rules and the scaling through
`nbscale.train` (in the notebook's process and on a real pool); the GPU probe itself in the gpu-marked tests.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import nbscale
from nbscale.errors import OptionsError
from nbscale.training.batch_fitting import HEADROOM, MAX_PER_WORKER, largest_fitting_batch, settle
from nbscale.training.plan import RunPlan
from nbscale.training.trainer import checked_inputs
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()


def recorded(fits):
    calls: list[int] = []

    def predicate(batch: int) -> bool:
        calls.append(batch)
        return fits(batch)

    return predicate, calls


@pytest.mark.parametrize(
    ("largest_that_fits", "limit", "found", "tried"),
    [
        (300, 10_000, 256, [32, 64, 128, 256, 512]),  # doubles from 32 and stops at the first that does not fit
        (5, 10_000, 4, [32, 16, 8, 4]),  # halves from 32 to the first that fits
        (10**9, 100, 64, [32, 64]),  # never past the limit (128 > 100 is not tried)
        (10**9, 20, 16, [16]),  # a limit below the first probe starts at the power of two under it
        (0, 10_000, 0, [32, 16, 8, 4, 2, 1]),  # not even one sample fits
    ],
)
def test_the_search_finds_the_largest_power_of_two_that_fits(largest_that_fits, limit, found, tried) -> None:
    fits, calls = recorded(lambda batch: batch <= largest_that_fits)
    assert largest_fitting_batch(fits, limit) == found
    assert calls == tried


def auto(**fields) -> nbscale.TrainingOptions:
    return nbscale.TrainingOptions("sgdm", mini_batch_size="auto", initial_learn_rate=0.1, **fields)


def auto_plan(**fields) -> RunPlan:
    """The run plan settle works on: checked_inputs' for `auto(**fields)`."""
    return checked_inputs(tiny_net(), TRAIN, auto(**fields), None).plan


def not_probed(limit: int):
    raise AssertionError("the probe ran")


def test_auto_takes_the_smallest_fit_over_the_workers_times_the_workers_and_says_why() -> None:
    limits: list[int] = []

    def probe(limit: int):
        limits.append(limit)
        return lambda batch: batch <= 100

    choices = settle(auto_plan(), [1, 1], 1500, None, probe, smallest=lambda batch: batch // 2)  # another worker: half
    assert limits == [750]  # 1500 samples: at most 750 a worker
    assert choices.counts == [32, 32] and choices.plan.batching.mini_batch_size == 64
    assert choices.said == (
        f"mini_batch_size='auto': 32 a worker x 2 workers = 64, the largest power of two whose "
        f"training step (probed at precision 'single') left {HEADROOM:.0%} of every worker's GPU "
        "memory free"
    )
    assert choices.plan.solver.learn_rate == 0.1  # learn_rate_scaling "none": the rate as given


def test_auto_with_an_uneven_worker_load_fits_the_most_loaded_worker() -> None:
    choices = settle(
        auto_plan(worker_load=[3, 1, 0], execution_environment="parallel"),
        [1, 1, 0],
        1500,
        None,
        lambda limit: lambda b: b <= 64,
        smallest=lambda batch: batch,
    )
    assert choices.counts == [64, 21, 0] and choices.plan.batching.mini_batch_size == 85
    assert "64 for the most loaded worker, 85 in all (worker_load)" in choices.said


def test_auto_stays_within_the_data_and_says_so() -> None:
    choices = settle(auto_plan(), [1, 1], 100, None, lambda limit: lambda batch: True, smallest=lambda batch: batch)
    assert choices.counts == [32, 32]  # 64 a worker would need 128 samples
    assert choices.said.endswith(f"(the most allowed: {MAX_PER_WORKER} a worker, and the data)")


def test_auto_that_fits_not_even_one_sample_is_a_clear_error() -> None:
    with pytest.raises(
        OptionsError,
        match=r"mini_batch_size='auto': one training step of a single sample does not "
        r"fit in the GPU memory .* precision='mixed'",
    ):
        settle(auto_plan(), [1], 1500, None, lambda limit: lambda batch: False, smallest=lambda batch: batch)


def test_a_resumed_auto_run_takes_its_checkpoints_mini_batch_without_probing() -> None:
    choices = settle(auto_plan(), [1, 1], 1500, {"options": {"mini_batch_size": 512}}, not_probed, lambda b: b)
    assert choices.counts == [256, 256]
    assert choices.said == "mini_batch_size='auto': 512, as the checkpoint resumed from was trained with"


def test_linear_scaling_scales_the_rate_by_the_global_mini_batch_over_the_reference() -> None:
    plan = auto_plan(learn_rate_scaling="linear", learn_rate_reference_batch=256)
    choices = settle(plan, [1, 1], 1500, None, lambda limit: lambda batch: batch <= 256, lambda b: b)
    assert choices.plan.batching.mini_batch_size == 512 and choices.plan.solver.learn_rate == pytest.approx(0.2)
    assert choices.plan.batching.learn_rate_scaling == "none"  # applied once
    assert choices.said.endswith(
        "; learn_rate_scaling='linear': initial_learn_rate 0.1 x 512 / 256 (learn_rate_reference_batch) = 0.2"
    )


def test_auto_on_the_cpu_is_refused_naming_the_option_and_the_fix() -> None:
    with pytest.raises(OptionsError) as caught:
        nbscale.train(tiny_net(), TRAIN, auto(execution_environment="cpu", verbose=False))
    assert str(caught.value).startswith(
        "mini_batch_size='auto' fits the mini-batch to GPU memory, but this run "
        "trains on the CPU: give a number, e.g. mini_batch_size=128"
    )


@pytest.mark.slow
def test_auto_on_a_pool_of_cpu_workers_is_refused_before_it_trains() -> None:
    with nbscale.Pool(2, cpu=True):
        with pytest.raises(OptionsError, match=r"but this run trains on the pool's CPU workers: give a number"):
            nbscale.train(tiny_net(), TRAIN, auto(execution_environment="parallel", verbose=False))
        with pytest.raises(OptionsError, match=r"but this run trains on the pool's CPU workers"):
            nbscale.sweep(tiny_net, TRAIN, auto(verbose=False), grid={"initial_learn_rate": [0.1, 0.2]})


def scaled(**fields) -> nbscale.TrainingOptions:
    return nbscale.TrainingOptions(
        "sgdm",
        **{
            "initial_learn_rate": 0.1,
            "mini_batch_size": 64,
            "max_epochs": 4,
            "learn_rate_scaling": "linear",
            "learn_rate_schedule": "piecewise",
            "learn_rate_drop_period": 2,
            "learn_rate_drop_factor": 0.5,
            **fields,
        },
    )


def test_linear_scaling_trains_with_the_scaled_rate_and_says_so_in_info_and_the_table(capsys) -> None:
    _, info = nbscale.train(tiny_net(), TRAIN, scaled(execution_environment="cpu"))
    said = "learn_rate_scaling='linear': initial_learn_rate 0.1 x 64 / 128 (learn_rate_reference_batch) = 0.05"
    assert info.mini_batch_size == 64 and info.initial_learn_rate == pytest.approx(0.05) and info.choices == said
    assert info.learn_rate[0] == pytest.approx(0.05) and info.learn_rate[-1] == pytest.approx(0.025)  # one drop
    assert f"Training on CPU ({torch.get_num_threads()} threads).\nChosen: {said}.\n|" in capsys.readouterr().out
    _, plain = nbscale.train(
        tiny_net(), TRAIN, scaled(execution_environment="cpu", learn_rate_scaling="none", verbose=False)
    )
    assert plain.initial_learn_rate == 0.1 and plain.choices == ""


@pytest.mark.slow
def test_the_info_panel_says_what_was_chosen(kernel) -> None:
    assert kernel.run("""
import nbscale
from tests.training.digits import digits, tiny_net
from tests.training.test_batch_fitting import scaled
(train_x, train_y), _ = digits()
""").ok
    result = kernel.run(
        "net, info = nbscale.train(tiny_net(), (train_x, train_y), scaled(execution_environment='cpu', "
        "plots='training-progress', verbose=False, learn_rate_reference_batch=32))"
    )
    assert result.ok, result.text
    panel = [d["text/plain"] for d in result.displays if d.get("text/plain", "").startswith("State:")][-1]
    assert (
        "\nMini-batch size: 64\nChosen: learn_rate_scaling='linear': initial_learn_rate 0.1 x 64 / 32 "
        "(learn_rate_reference_batch) = 0.2\n" in panel
    )


@pytest.mark.slow
def test_linear_scaling_on_a_pool_scales_by_the_global_mini_batch_and_trains_like_one_process() -> None:
    torch.manual_seed(3)
    alone, alone_info = nbscale.train(tiny_net(), TRAIN, scaled(execution_environment="cpu", verbose=False))
    with nbscale.Pool(2, cpu=True):
        torch.manual_seed(3)
        net, info = nbscale.train(tiny_net(), TRAIN, scaled(execution_environment="parallel", verbose=False))
    assert info.initial_learn_rate == pytest.approx(0.05) and info.choices == alone_info.choices
    assert info.learn_rate == alone_info.learn_rate
    assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(alone.parameters(), net.parameters(), strict=True))


# ---- on GPUs (skipped where none is visible) ---------------------------------------------------------------------


def memory_hungry_net() -> nn.Module:
    """A net for 8x8 digits that upsamples each image 256-fold first: some hundred MB a sample, so a GPU's memory,
    not MAX_PER_WORKER, limits the mini-batch."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Upsample(scale_factor=256),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def is_power_of_two(number: int) -> bool:
    return number > 0 and number & (number - 1) == 0


@pytest.mark.gpu
@pytest.mark.slow
def test_auto_on_a_gpu_fits_the_largest_power_of_two_that_leaves_headroom() -> None:
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    _, info = nbscale.train(
        memory_hungry_net(),
        TRAIN,
        nbscale.TrainingOptions(
            "sgdm",
            mini_batch_size="auto",
            learn_rate_scaling="linear",
            initial_learn_rate=0.05,
            max_epochs=1,
            execution_environment="gpu",
            verbose=False,
            validation_data=VAL,
            validation_frequency=10,
        ),
    )
    assert is_power_of_two(info.mini_batch_size) and info.mini_batch_size < MAX_PER_WORKER  # memory was the limit
    assert info.choices.startswith(
        f"mini_batch_size='auto': {info.mini_batch_size}, the largest power of two whose "
        "training step (probed at precision 'single') left 20% of the GPU's memory free"
    )
    assert info.initial_learn_rate == pytest.approx(0.05 * info.mini_batch_size / 128)
    assert info.stop_reason == "Max epochs completed"
    # the probe leaves the peak statistics to training, which kept clear of the GPU's limit
    assert torch.cuda.max_memory_reserved() <= (1 - HEADROOM / 2) * (free + torch.cuda.memory_reserved())


def batch_norm_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


@pytest.mark.gpu
@pytest.mark.slow
def test_the_probe_leaves_the_network_its_statistics_and_random_numbers_as_they_were() -> None:
    options = dict(initial_learn_rate=0.05, max_epochs=3, execution_environment="gpu", verbose=False)
    torch.manual_seed(1)
    net, info = nbscale.train(
        batch_norm_mlp(), TRAIN, nbscale.TrainingOptions("sgdm", mini_batch_size="auto", **options)
    )
    assert info.mini_batch_size == MAX_PER_WORKER  # a small network: the cap, not the memory
    torch.manual_seed(1)
    same, _ = nbscale.train(
        batch_norm_mlp(), TRAIN, nbscale.TrainingOptions("sgdm", mini_batch_size=info.mini_batch_size, **options)
    )
    for trained, again in zip(net.state_dict().values(), same.state_dict().values(), strict=True):
        assert torch.allclose(trained.float(), again.float(), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.slow
def test_auto_on_a_gpu_pool_is_the_per_worker_fit_times_the_workers() -> None:
    workers = torch.cuda.device_count()
    with nbscale.Pool(gpus=list(range(workers))):
        _, info = nbscale.train(
            memory_hungry_net(),
            TRAIN,
            nbscale.TrainingOptions(
                "sgdm", mini_batch_size="auto", max_epochs=1, execution_environment="parallel", verbose=False
            ),
        )
    per_worker = info.mini_batch_size // workers
    assert is_power_of_two(per_worker) and info.mini_batch_size == per_worker * workers
    across = f" a worker x {workers} workers = {info.mini_batch_size}" if workers > 1 else ""
    whose = "every worker's GPU" if workers > 1 else "the GPU's"
    assert info.choices.startswith(f"mini_batch_size='auto': {per_worker}{across}, the largest power of two")
    assert f"left 20% of {whose} memory free" in info.choices
    assert math.isclose(info.initial_learn_rate, 0.01)  # no scaling asked for: sgdm's default rate


def distilling_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A step_fn that also runs memory_hungry_net as a teacher (distillation): the step, not the small student,
    sets how much memory a mini-batch takes."""
    teacher = distilling_step.teacher.to(inputs.device)  # type: ignore[attr-defined]
    with torch.no_grad():
        target = teacher(inputs).softmax(1)
    outputs = model(inputs)
    return nn.functional.cross_entropy(outputs, labels) + nn.functional.cross_entropy(outputs, target), outputs


@pytest.mark.gpu
@pytest.mark.slow
def test_auto_probes_the_users_step_fn_not_the_model_alone() -> None:
    options = nbscale.TrainingOptions(
        "sgdm", mini_batch_size="auto", max_epochs=1, execution_environment="gpu", verbose=False
    )
    _, alone = nbscale.train(batch_norm_mlp(), TRAIN, options)
    distilling_step.teacher = memory_hungry_net().eval()  # type: ignore[attr-defined]
    assert alone.mini_batch_size == MAX_PER_WORKER  # the student alone: the cap
    _, distilled = nbscale.train(batch_norm_mlp(), TRAIN, options, step_fn=distilling_step)
    # the teacher's activations fill the GPU: the probe ran the step as training runs it
    assert is_power_of_two(distilled.mini_batch_size) and distilled.mini_batch_size < MAX_PER_WORKER
    assert distilled.stop_reason == "Max epochs completed"
