"""``autoplan.atomic``: a marked section of a Markdown file rewritten whole, the rest byte for byte."""
from __future__ import annotations

import os

import pytest

from autoplan.atomic import write_section
from autoplan.errors import UserError


def test_write_section_replaces_only_its_own_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n<!-- other:start -->\nx\n<!-- other:end -->\n")
    write_section(str(path), "bench", "first")
    write_section(str(path), "bench", "second\n\n")
    text = path.read_text()
    assert text == ("# Results\n\n<!-- other:start -->\nx\n<!-- other:end -->\n\n"
                    "<!-- bench:start -->\nsecond\n<!-- bench:end -->\n")
    write_section(str(path), "other", "y")       # a section in the middle: what follows it is kept
    assert path.read_text() == ("# Results\n\n<!-- other:start -->\ny\n<!-- other:end -->\n\n"
                                "<!-- bench:start -->\nsecond\n<!-- bench:end -->\n")


def test_write_section_starts_a_missing_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "new.md"
    write_section(str(path), "study-q4", "body")
    assert path.read_text() == "# Results\n\n<!-- study-q4:start -->\nbody\n<!-- study-q4:end -->\n"
    assert os.listdir(tmp_path) == ["new.md"]


def test_write_section_into_a_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot write") as e:
        write_section(str(tmp_path / "nowhere" / "RESULTS.md"), "x", "y", flag="--results-md")
    assert "--results-md" in e.value.fix
