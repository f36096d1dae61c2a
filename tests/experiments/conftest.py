"""Shared by the tests of ``experiments/``: its scripts imported as modules."""
import importlib
import os
import sys

import pytest

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")


@pytest.fixture(scope="session")
def experiment():
    """``experiment(name)``: the module of ``experiments/<name>.py``, imported with its folder on
    ``sys.path`` as the scripts expect of each other (one module per name, in ``sys.modules``)."""
    if EXPERIMENTS not in sys.path:
        sys.path.insert(0, EXPERIMENTS)
    return importlib.import_module
