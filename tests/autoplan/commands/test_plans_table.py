"""The search table at a glance: compact plans never cut at any width, what differs in bold,
ties within 0.5 % named, the progress bar only on searches longer than a second."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from autoplan.commands.plans_table import TIE_TOLERANCE, plan_cells, plans_table, tie_note, tie_ranks
from autoplan.plan import Plan

# the five plans of the README's main search, with their step times
TOP5 = (("tp=2,pp=8,dp=32,cp=2,vpp=2,mbs=2,schedule=zbv,zero=2,cp_algo=ulysses", 3.946),
        ("tp=2,pp=8,dp=64,vpp=2,mbs=1,schedule=zbv,zero=2", 3.947),
        ("tp=2,pp=16,dp=16,cp=2,vpp=2,mbs=2,schedule=zbv,zero=2", 3.982),
        ("tp=2,pp=16,dp=32,vpp=2,mbs=1,schedule=zbv,zero=2", 3.982),
        ("tp=8,pp=8,dp=16,vpp=3,schedule=interleaved,recompute=selective,order=tp-cp-ep-pp-dp", 4.101))


def _candidates(rows=TOP5):
    out = []
    for text, step in rows:
        e = SimpleNamespace(step_time_s=step, throughput=1024 * 2048 / step, mfu=0.567, memory_gib=69.04,
                            hbm_gib=74.5, memory_limit_gib=70.5, bubble_fraction=0.077, comm_exposed_s=0.3212)
        out.append(SimpleNamespace(plan=Plan.parse(text, num_gpus=1024), estimate=e))
    return out


def _render(table, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text().splitlines()


def _plan_cells_of(lines: list[str]) -> list[str]:
    """The plan column read back from rendered rows (a row's wrapped tail has no rank)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("─")) + 1
    cells: list[str] = []
    for line in lines[start:]:
        rank, rest = line[:2].strip(), line[2:].strip()
        plan = rest.split("  ")[0].strip()
        if rank:
            cells.append(plan)
        else:
            cells[-1] += " " + plan
    return cells


@pytest.mark.parametrize("width", [100, 80, 64])
def test_every_plan_is_whole_at_any_width(width):
    cands = _candidates()
    lines = _render(plans_table(cands, "tokens", width=width), width)
    assert max(map(len, lines)) <= width
    assert "…" not in "\n".join(lines)
    assert _plan_cells_of(lines) == [c.plan.to_compact() for c in cands]
    assert [Plan.parse(cell, num_gpus=1024) for cell in _plan_cells_of(lines)] == [c.plan for c in cands]
    header = next(line for line in lines if "plan" in line)
    assert "step" in header and "tokens/s" in header and "MFU" in header
    assert ("comm exp." in header) == (width >= 80)           # the first column to go when narrow


def test_plans_fit_one_line_each_at_100_columns():
    lines = _render(plans_table(_candidates(TOP5[:4]), "tokens", width=100), 100)
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("─")) + 1:]
    assert [r.split()[:2] for r in rows] == [["1=", "tp2·cp2·pp8·dp32"], ["1=", "tp2·pp8·dp64"],
                                             ["3=", "tp2·cp2·pp16·dp16"], ["3=", "tp2·pp16·dp32"]]
    assert "tp2·cp2·pp8·dp32 zero2 mbs2 zbv ulysses" in rows[0]


def test_wide_shows_the_canonical_string():
    cands = _candidates()
    lines = _render(plans_table(cands, "samples", wide=True, width=300), 300)
    assert [c.plan.to_string() in "\n".join(lines) for c in cands] == [True] * 5
    assert "samples/s" in lines[1]


def test_what_differs_is_bold():
    cells = plan_cells([c.plan for c in _candidates(TOP5[:2])])
    bold = [[cell.plain[s.start:s.end] for s in cell.spans if s.style == "bold"] for cell in cells]
    # both are tp2, pp8, zero2, zbv: what differs is cp, dp, mbs and the cp algorithm
    assert bold == [["cp2", "dp32", "mbs2", "ulysses"], ["dp64", "mbs1"]]
    assert plan_cells([_candidates()[0].plan])[0].spans == [] or \
        all(s.style == "" for s in plan_cells([_candidates()[0].plan])[0].spans)


def test_ties_within_noise_share_a_rank():
    assert TIE_TOLERANCE == 0.005
    assert tie_ranks([3.946, 3.947, 3.982, 3.982, 4.101]) == ["1=", "1=", "3=", "3=", "5"]
    assert tie_ranks([1.0, 1.004, 1.009]) == ["1=", "1=", "3"]     # relative to the run's first
    assert tie_ranks([1.0, 1.1]) == ["1", "2"]
    assert tie_note(_candidates()).startswith("1=, 3=: ties — ")
    assert tie_note(_candidates(TOP5[3:])) == ""


def test_progress_bar_only_after_a_second():
    from autoplan.search import progress

    slow = progress.RichProgress(10)
    clock = iter([100.5, 101.5, 101.6])
    slow._start, slow._clock = 100.0, lambda: next(clock)
    slow.advance()
    assert slow._p is None                       # half a second in: nothing shown
    slow.advance()
    assert slow._p is not None and slow._p.tasks[0].completed == 2
    assert slow._p.console.stderr                # never on stdout
    slow.stop()
    assert isinstance(progress.progress_bar(False, 10), progress.NoProgress)
