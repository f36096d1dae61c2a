"""SearchOptions nests the cost model's options and keeps only the search's own."""
import dataclasses

import pytest

from autoplan.cost import EstimateOptions
from autoplan.errors import UserError
from autoplan.search import SearchOptions
from autoplan.search.robust import OBJECTIVES


def test_the_search_keeps_no_copy_of_an_estimate_option():
    search = {f.name for f in dataclasses.fields(SearchOptions)}
    assert not search & {f.name for f in dataclasses.fields(EstimateOptions)}
    assert SearchOptions().estimate == EstimateOptions()


def test_the_estimate_options_travel_whole():
    estimate = EstimateOptions(fsdp_prefetch=2, state_precision="apex-dfa-bf16", grad_reduce_bytes=2.0)
    assert SearchOptions(estimate=estimate, top_k=3).estimate is estimate


@pytest.mark.parametrize("field,value,problem", [("objective", "p99", "unknown objective 'p99'"),
                                                 ("schedules", ("1f1b", "zb-h3"), "unknown schedule 'zb-h3'")])
def test_a_bad_search_choice_is_a_user_error(field, value, problem):
    with pytest.raises(UserError, match=problem) as err:
        SearchOptions(**{field: value})
    assert err.value.fix


def test_every_objective_constructs():
    for objective in OBJECTIVES:
        assert SearchOptions(objective=objective).objective == objective
