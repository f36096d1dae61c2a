"""Rule verdicts: does a priced plan follow the topology and efficiency rules, with evidence.

Each rule returns one ``Verdict`` (``status``: pass | fail | warn | info) whose text carries
the numbers it was decided on, so an engineer can check it by hand:

==========================  =====  ==================================================
rule                        fails  when
==========================  =====  ==================================================
tp/ep/cp-inside-nvlink      fail   a per-layer collective group (TP/SP; EP all-to-all;
                                   Ulysses all-to-all) spans more than one NVLink domain
pp-p2p-span                 info   always: where stage-to-stage P2P goes (IB is allowed)
dp-outermost                warn   the dp axis is not the outermost active axis and its
                                   group sits on a faster level than the pp group
sp-attention-share          warn   attention > 30 % of block compute, tp > 1, SP off
cp-long-context             warn   (attention > 50 % or seq ≥ 32K) and cp = 1
zero-bubble                 warn   pp > 1 and the schedule is not zero-bubble
mfu-band                    warn   MFU below the healthy band (dense 40–55 %, MoE 25–45 %);
                                   names the largest non-compute item of the step
memory                      fail   the fullest pipeline stage exceeds HBM
(any other)                 fail   a violation the estimate reports that no rule above covers
==========================  =====  ==================================================

Groups come from ``Mesh.of(plan)`` and their spans from ``Cluster.span``; every group of an
axis is checked and the first that breaks the rule is named with its ranks and link.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.axes import DENSE_DP
from autoplan.cost import Estimate
from autoplan.explain.units import percent, ranks_text, seconds, size
from autoplan.ir import BlockGraph
from autoplan.mesh import Mesh
from autoplan.plan import Plan
from autoplan.rules import first_crossing_group, rule_mesh
from autoplan.rules import per_layer_groups as per_layer_groups_of
from costmodels.pipeline import SPLIT_BACKWARD
from topologies.cluster import LEVELS, Cluster

SP_ATTENTION_SHARE = 0.30
CP_ATTENTION_SHARE = 0.50
CP_SEQ = 32768
ZERO_BUBBLE = SPLIT_BACKWARD      # the schedules that fill the bubble with weight-gradient work
MFU_BAND = {"dense": (0.40, 0.55), "moe": (0.25, 0.45)}
CAUSES = {   # time_breakdown_s key → what an engineer calls it
    "pp_bubble": "pipeline bubble",
    "tp_comm": "exposed TP/SP communication",
    "cp_comm_exposed": "exposed CP communication",
    "ep_comm_exposed": "exposed EP all-to-all",
    "pp_p2p_exposed": "exposed PP P2P",
    "pp_engine_host": "pipeline engine host time",
    "dp_exposed": "exposed DP communication",
    "embed_sync": "tied-embedding gradient all-reduce",
    "optimizer": "optimizer step",
    "recompute": "activation recomputation",
}


@dataclass(frozen=True)
class Verdict:
    rule: str
    status: str                              # pass | fail | warn | info
    text: str
    evidence: tuple[tuple[str, object], ...] = ()

    def to_dict(self) -> dict:
        return {"rule": self.rule, "status": self.status, "text": self.text,
                "evidence": dict(self.evidence)}


def verdicts(model: BlockGraph, cluster: Cluster, plan: Plan, est: Estimate) -> list[Verdict]:
    """Every rule's verdict for ``plan`` priced as ``est``."""
    mesh = Mesh.of(plan)
    out = per_layer_groups(model, cluster, plan, est, mesh)
    out.append(pp_p2p(cluster, plan, est, mesh))
    out.append(dp_outermost(cluster, plan, est, mesh))
    out.append(sp_rule(plan, est))
    out.append(cp_rule(model, plan, est))
    out.append(zero_bubble(plan, est))
    out.append(mfu_band(model, est))
    out.append(memory(cluster, est))
    covered = {v.rule for v in out}
    out += [Verdict(v.rule, "fail", v.text) for v in est.violations if v.rule not in covered]
    return out


def _dim_time(est: Estimate, dims: tuple[str, ...], kinds: tuple[str, ...] | None = None) -> tuple[int, float, float]:
    """(calls, seconds, exposed seconds) per step of the primitives on ``dims``."""
    ps = [p for p in est.primitives if p.traffic in dims and (kinds is None or p.kind in kinds)]
    return sum(p.calls_per_step for p in ps), sum(p.time_s for p in ps), sum(p.exposed_s for p in ps)


def per_layer_groups(model: BlockGraph, cluster: Cluster, plan: Plan, est: Estimate, mesh: Mesh) -> list[Verdict]:
    """Per-layer collectives inside one NVLink domain (the groups of ``autoplan.rules``): TP/SP,
    EP all-to-all, Ulysses all-to-all (under USP its sub-groups)."""
    traffic = {"tp": ("TP/SP collectives", ("tp", "sp"), None), "ep": ("EP all-to-alls", ("ep",), None),
               "cp": ("Ulysses all-to-alls", ("cp",), ("all_to_all",))}
    out = []
    groups = per_layer_groups_of(plan, mesh, experts=model.model.experts, nvlink_domain=cluster.nvlink_domain)
    for g in groups:
        what, dims, kinds = traffic[g.axis]
        label = "expert TP" if g.rule == "etp-inside-nvlink" else {"tp": "TP", "ep": "EP", "cp": "CP (Ulysses)"}[g.axis]
        calls, t, exposed = _dim_time(est, dims, kinds)
        count = mesh.num_ranks // g.size
        ev = (("group_size", g.size), ("groups", count), ("calls_per_step", calls), ("time_s", t),
              ("exposed_s", exposed))
        cost = f"{calls:,} {what} per step take {seconds(t)} ({seconds(exposed)} exposed)"
        bad = first_crossing_group(mesh, g, cluster.nvlink_domain)
        if bad is None:
            first = rule_mesh(mesh, g).group(g.axis)[:g.size]
            s = cluster.span(first)
            out.append(Verdict(g.rule, "pass",
                               f"{label} groups of {g.size} ranks ({ranks_text(first)}, …) each sit in one NVLink "
                               f"domain of {cluster.nvlink_domain} GPUs: {cost} on {cluster.describe_span(s)}",
                               ev + (("span", cluster.describe_span(s)),)))
        else:
            s = cluster.span(bad)
            link = cluster.describe_span(s)
            out.append(Verdict(g.rule, "fail",
                               f"{label} group of {g.size} ranks ({ranks_text(bad)}) spans {s.domains} NVLink "
                               f"domains over {link}: {cost}, per layer, off NVLink",
                               ev + (("span", link), ("domains", s.domains), ("ranks", ranks_text(bad)))))
    if plan.cp > 1 and plan.cp_algo == "usp" and not any(g.axis == "cp" for g in groups):
        why = ("the plan's split ulysses=1 sends" if plan.ulysses else
               f"USP with tp = {plan.tp} leaves no room for Ulysses inside the {cluster.nvlink_domain}-GPU "
               f"NVLink domain:")
        out.append(Verdict("cp-inside-nvlink", "info", f"{why} all CP traffic is the ring's P2P"))
    return out


def pp_p2p(cluster: Cluster, plan: Plan, est: Estimate, mesh: Mesh) -> Verdict:
    """PP P2P may cross IB: reported, never failed."""
    if plan.pp == 1:
        return Verdict("pp-p2p-span", "info", "no pipeline parallelism (pp = 1): no stage-to-stage P2P")
    g = mesh.group("pp")
    whole = cluster.span(g)
    calls, t, exposed = _dim_time(est, ("pp",))
    send = next((p for p in est.primitives if p.kind == "p2p" and p.purpose == "activations"), None)
    per = send.bytes_per_call if send is not None else 0.0
    hop = send.span if send is not None else cluster.describe_span(cluster.span(g[:2]))   # the priced (slowest) hop
    return Verdict("pp-p2p-span", "info",
                   f"PP P2P's slowest stage-to-stage hop goes over {hop} "
                   f"(PP group of {len(g)} ranks {ranks_text(g)} spans {cluster.describe_span(whole)}): "
                   f"{calls:,} sends per step of {size(per)}, {seconds(t)}, {seconds(exposed)} exposed — "
                   f"allowed: P2P overlaps other micro-batches' compute",
                   (("group_size", len(g)), ("span", hop), ("calls_per_step", calls),
                    ("bytes_per_call", per), ("time_s", t), ("exposed_s", exposed)))


def dp_outermost(cluster: Cluster, plan: Plan, est: Estimate, mesh: Mesh) -> Verdict:
    """DP outermost: the once-per-step gradient traffic takes the slowest links."""
    dp_group = mesh.group(DENSE_DP)
    if len(dp_group) == 1:
        return Verdict("dp-outermost", "pass", "no data parallelism: nothing to place")
    sizes = dict(mesh.sizes)
    active = [a for a in plan.order if sizes[a] > 1]
    dp_span = cluster.span(dp_group)
    calls, t, exposed = _dim_time(est, ("dp",))
    ev = (("order", "-".join(plan.order)), ("dp_span", cluster.describe_span(dp_span)),
          ("time_s", t), ("exposed_s", exposed))
    traffic = f"DP traffic {seconds(t)} per step, {seconds(exposed)} exposed"
    if "dp" not in active:
        return Verdict("dp-outermost", "pass",
                       f"dp/ep = 1: the DP group of {len(dp_group)} ranks ({ranks_text(dp_group)}) is the cp/ep ranks, "
                       f"spanning {cluster.describe_span(dp_span)}; {traffic}", ev)
    if active[-1] == "dp":
        return Verdict("dp-outermost", "pass",
                       f"dp is the outermost axis (order {'-'.join(plan.order)}): the DP group of {len(dp_group)} "
                       f"ranks ({ranks_text(dp_group)}) spans {cluster.describe_span(dp_span)}; {traffic}", ev)
    outer = [a for a in active[active.index("dp") + 1:]]
    worst = max((cluster.span(mesh.group(a)) for a in outer), key=lambda s: LEVELS.index(s.level))
    if LEVELS.index(dp_span.level) >= LEVELS.index(worst.level):
        return Verdict("dp-outermost", "pass",
                       f"dp sits inside {', '.join(outer)} (order {'-'.join(plan.order)}) but its group of "
                       f"{len(dp_group)} ranks already spans {cluster.describe_span(dp_span)}, as far out as "
                       f"theirs ({cluster.describe_span(worst)}); {traffic}", ev)
    return Verdict("dp-outermost", "warn",
                   f"dp is inside {', '.join(outer)} (order {'-'.join(plan.order)}): the DP group of {len(dp_group)} "
                   f"ranks ({ranks_text(dp_group)}) spans {cluster.describe_span(dp_span)} while the "
                   f"{'/'.join(outer)} groups span {cluster.describe_span(worst)}; {traffic} — outermost DP "
                   f"would leave the faster links to the per-micro-batch traffic",
                   ev + (("outer_span", cluster.describe_span(worst)),))


def sp_rule(plan: Plan, est: Estimate) -> Verdict:
    share = est.attention_time_share
    ev = (("attention_time_share", share), ("threshold", SP_ATTENTION_SHARE), ("sp", plan.sp), ("tp", plan.tp))
    if plan.tp == 1:
        return Verdict("sp-attention-share", "info",
                       f"no TP axis (tp = 1), so no sequence parallelism; attention is {percent(share)} of "
                       f"block compute", ev)
    if share > SP_ATTENTION_SHARE and not plan.sp:
        return Verdict("sp-attention-share", "warn",
                       f"attention is {percent(share)} of block compute (> {SP_ATTENTION_SHARE:.0%}) and "
                       f"SP is off on tp = {plan.tp}: turn SP on", ev)
    return Verdict("sp-attention-share", "pass",
                   f"attention is {percent(share)} of block compute "
                   f"({'>' if share > SP_ATTENTION_SHARE else '≤'} {SP_ATTENTION_SHARE:.0%}); "
                   f"SP is {'on' if plan.sp else 'off'} (tp = {plan.tp})", ev)


def cp_rule(model: BlockGraph, plan: Plan, est: Estimate) -> Verdict:
    share, seq = est.attention_time_share, model.seq_len
    trigger = share > CP_ATTENTION_SHARE or seq >= CP_SEQ
    why = (f"seq {seq:,} {'≥' if seq >= CP_SEQ else '<'} {CP_SEQ // 1024}K, attention {percent(share)} "
           f"{'>' if share > CP_ATTENTION_SHARE else '≤'} {CP_ATTENTION_SHARE:.0%}")
    calls, t, exposed = _dim_time(est, ("cp",))
    ev = (("attention_time_share", share), ("seq", seq), ("cp", plan.cp), ("time_s", t), ("exposed_s", exposed))
    if trigger and plan.cp == 1:
        return Verdict("cp-long-context", "warn", f"{why}, but cp = 1: context parallelism expected", ev)
    if trigger:
        return Verdict("cp-long-context", "pass",
                       f"{why}: cp = {plan.cp} ({plan.cp_algo}), {seq // plan.cp:,} tokens per rank; CP "
                       f"communication {seconds(t)} per step, {seconds(exposed)} exposed", ev)
    if plan.cp > 1:
        return Verdict("cp-long-context", "info",
                       f"{why}: CP not required, yet cp = {plan.cp} ({plan.cp_algo}) costs {seconds(t)} per step "
                       f"({seconds(exposed)} exposed)", ev)
    return Verdict("cp-long-context", "pass", f"{why}: no context parallelism needed, cp = 1", ev)


def zero_bubble(plan: Plan, est: Estimate) -> Verdict:
    bubble = est.time_breakdown_s.get("pp_bubble", 0.0)
    ev = (("pp", plan.pp), ("schedule", plan.schedule), ("bubble_fraction", est.bubble_fraction),
          ("bubble_s", bubble))
    if plan.pp == 1:
        return Verdict("zero-bubble", "pass", "no pipeline (pp = 1): no bubble", ev)
    if plan.schedule in ZERO_BUBBLE:
        return Verdict("zero-bubble", "pass",
                       f"zero-bubble schedule {plan.schedule} on pp = {plan.pp}: bubble "
                       f"{percent(est.bubble_fraction)} of the pipeline ({seconds(bubble)} per step)", ev)
    return Verdict("zero-bubble", "warn",
                   f"pp = {plan.pp} with {plan.schedule}: bubble {percent(est.bubble_fraction)} of the pipeline "
                   f"({seconds(bubble)} of the {seconds(est.step_time_s)} step); a zero-bubble schedule "
                   f"({', '.join(ZERO_BUBBLE)}) fills it with weight-gradient work", ev)


def largest_overhead(est: Estimate) -> tuple[str, float]:
    """(cause, seconds): the biggest non-compute item of the step, recomputation included
    (its share of compute time is (HFU − MFU) / HFU)."""
    items = {k: v for k, v in est.time_breakdown_s.items() if k != "compute"}
    if est.hfu > 0:
        items["recompute"] = est.time_breakdown_s.get("compute", 0.0) * (est.hfu - est.mfu) / est.hfu
    key = max(sorted(items), key=lambda k: items[k])
    return key, items[key]


def mfu_band(model: BlockGraph, est: Estimate) -> Verdict:
    kind = "moe" if model.model.experts else "dense"
    low, high = MFU_BAND[kind]
    ev = (("mfu", est.mfu), ("band_low", low), ("band_high", high), ("model_kind", kind))
    band = f"the {kind} band {low * 100:.0f}–{high * 100:.0f}%"
    if est.mfu < low:
        key, s = largest_overhead(est)
        return Verdict("mfu-band", "warn",
                       f"MFU {percent(est.mfu)} is below {band}; likely cause: {CAUSES.get(key, key)}, "
                       f"{seconds(s)} of the {seconds(est.step_time_s)} step ({percent(s / est.step_time_s)})",
                       ev + (("cause", key), ("cause_s", s)))
    if est.mfu > high:
        return Verdict("mfu-band", "info", f"MFU {percent(est.mfu)} is above {band}: an optimistic estimate "
                                           f"or an unusually favourable shape", ev)
    return Verdict("mfu-band", "pass", f"MFU {percent(est.mfu)} is inside {band}", ev)


def memory(cluster: Cluster, est: Estimate) -> Verdict:
    stages = est.memory_per_stage_gib or (est.memory_gib,)
    worst = max(range(len(stages)), key=lambda i: stages[i])
    ev = (("memory_gib", est.memory_gib), ("hbm_gib", est.hbm_gib), ("stage", worst))
    text = (f"the fullest pipeline stage ({worst}) needs {est.memory_gib:.1f} GiB per GPU of the "
            f"{cluster.gpu.name}'s {est.hbm_gib:.1f} GiB HBM")
    return Verdict("memory", "pass" if est.fits else "fail", text + ("" if est.fits else ": does not fit"), ev)
