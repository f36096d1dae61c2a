"""``commands/choices.py`` copies what the parser shows from the modules that own it (so that
``--help`` imports none of them): every copy equals its owner's value."""
import dataclasses

from autoplan.commands import choices


def test_workload_and_band_defaults_are_the_owners():
    from autoplan.cost.uncertainty import DEFAULT_SAMPLES
    from autoplan.workload import DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ

    assert (choices.DEFAULT_SEQ, choices.DEFAULT_GLOBAL_BATCH, choices.DEFAULT_SAMPLES) == (
        DEFAULT_SEQ, DEFAULT_GLOBAL_BATCH, DEFAULT_SAMPLES)


def test_estimate_defaults_and_choices_are_the_cost_models():
    from autoplan.cost import EstimateOptions
    from autoplan.cost.types import DEFAULT_MARGIN_GIB, FP8_ENGINES, FP8_RECOMPUTES, GRAD_SYNCS, KERNELS, LOSS_KERNELS
    from autoplan.sharding.ilp import BACKENDS
    from costmodels.attention import ATTENTION_KERNELS
    from costmodels.memory import STATE_PRECISION_NAMES

    default = EstimateOptions()
    assert {k: getattr(default, k) for k in choices.ESTIMATE_DEFAULTS} == choices.ESTIMATE_DEFAULTS
    assert set(choices.ESTIMATE_DEFAULTS) <= {f.name for f in dataclasses.fields(EstimateOptions)}
    owners = (tuple(GRAD_SYNCS), tuple(KERNELS), DEFAULT_MARGIN_GIB, tuple(BACKENDS), tuple(STATE_PRECISION_NAMES))
    assert owners == (choices.GRAD_SYNCS, choices.KERNELS, choices.DEFAULT_MARGIN_GIB, choices.BACKENDS,
                      choices.STATE_PRECISION_NAMES)
    assert tuple(FP8_ENGINES) == choices.FP8_ENGINES
    assert tuple(FP8_RECOMPUTES) == choices.FP8_RECOMPUTES
    assert tuple(LOSS_KERNELS) == choices.LOSS_KERNELS
    assert tuple(ATTENTION_KERNELS) == choices.ATTENTION_KERNELS


def test_search_memcheck_and_baseline_choices_are_their_owners():
    from autoplan.apply.memcheck import ALLOCATORS
    from autoplan.baselines import SUMMARIES
    from autoplan.search.robust import DEFAULT_OBJECTIVE, OBJECTIVES

    assert (tuple(OBJECTIVES), DEFAULT_OBJECTIVE) == (choices.OBJECTIVES, choices.DEFAULT_OBJECTIVE)
    assert tuple(ALLOCATORS) == choices.ALLOCATORS
    assert choices.SUMMARIES == SUMMARIES


def test_study_questions_are_the_studys():
    from autoplan.study import QUESTIONS

    assert choices.STUDY_QUESTIONS == QUESTIONS
