"""EstimateOptions: each choice field's allowed values are its Literal's, checked on construction."""
import dataclasses
import typing

import pytest

from autoplan.cost import EstimateOptions
from autoplan.cost.types import CHOICES
from autoplan.errors import UserError
from costmodels.memory import STATE_PRECISION_NAMES, STATE_PRECISIONS


def _literal_values(name: str) -> tuple[str, ...]:
    """The Literal values of an EstimateOptions field's annotation (None dropped)."""
    hint = typing.get_type_hints(EstimateOptions)[name]
    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    return tuple(v for a in args if typing.get_origin(a) is typing.Literal for v in typing.get_args(a))


def test_every_literal_field_is_checked_against_its_literal():
    literal = {f.name for f in dataclasses.fields(EstimateOptions) if _literal_values(f.name)}
    assert literal == set(CHOICES)
    for name, (_, allowed) in CHOICES.items():
        assert allowed == _literal_values(name)


def test_the_state_precision_names_are_the_tables_keys():
    assert tuple(STATE_PRECISIONS) == STATE_PRECISION_NAMES


@pytest.mark.parametrize("name,what", [(n, w) for n, (w, _) in CHOICES.items()])
def test_a_bad_choice_is_one_user_error_naming_the_allowed_values(name, what):
    with pytest.raises(UserError, match=f"unknown {what} 'nope'") as err:
        EstimateOptions(**{name: "nope"})
    assert err.value.fix == f"use one of: {', '.join(CHOICES[name][1])}"


def test_every_allowed_choice_constructs():
    for name, (_, allowed) in CHOICES.items():
        for value in allowed:
            assert getattr(EstimateOptions(**{name: value}), name) == value
