"""Fixtures of the cost-model tests."""
import pytest
import yaml


@pytest.fixture
def profile_with(tmp_path):
    """``profile_with(base, **fields)``: the path of a copy of the shipped compute profile ``base``
    (``costmodels/profiles/BASE.yaml``) with ``fields`` replaced, and the copy's data."""
    from costmodels.compute import PROFILE_DIR

    def make(base: str, **fields) -> tuple[str, dict]:
        with open(f"{PROFILE_DIR}/{base}.yaml") as f:
            data = yaml.safe_load(f)
        data.update(fields)
        path = tmp_path / f"{base}-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(data))
        return str(path), data

    return make
