"""The report of a ``python -m benchmarks`` run: ratio table, memory table (markdown) and a PNG chart.

Ratios are per source (S3, HTTP) and workload, of each system's rate in the workload's unit
(``peers.WORKLOADS``): ``vs local`` = rate / the local copy's rate from that source (the limit:
1.00), ``vs best peer`` = rate / the highest rate among the peers that ran on that source (rclone,
s3fs-fuse, fsspec's caches; the best peer reads 1.00). A system that did not run shows its status ("not installed (...)", "failed: ...", "timed out after N s in <step>") instead: its figures
are not counted, and a goal of a system that failed or timed out counts as not met.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.peers import GOALS, WORKLOADS, Outcome

__all__ = ["Ratio", "chart", "markdown_table", "memory_rows", "ratio_rows", "ratios"]


@dataclass(frozen=True)
class Ratio:
    """One (source, workload, system): ``rate`` in the workload's unit, ``mb_s``, and the two
    ratios (None where there is no local copy / no peer figure to divide by)."""

    workload: str
    system: str
    source: str
    rate: float
    mb_s: float
    vs_local: float | None
    vs_peer: float | None
    best_peer: bool = False


def ratios(outcomes: list[Outcome]) -> list[Ratio]:
    """Every measured (source, workload, system): sources in run order, then workloads in
    ``WORKLOADS`` order, systems in run order."""
    out = []
    for source in dict.fromkeys(o.source for o in outcomes):
        for w in WORKLOADS:
            ran = [(o, o.measures[w.key]) for o in outcomes
                   if o.source == source and o.status == "ok" and w.key in o.measures]
            local = next((m.rate(w.unit) for o, m in ran if o.role == "local"), None)
            peers = [(m.rate(w.unit), o.system) for o, m in ran if o.role == "peer"]
            best, best_name = max(peers) if peers else (None, "")
            for o, m in ran:
                rate = m.rate(w.unit)
                out.append(Ratio(w.key, o.system, source, rate, m.rate("MB/s"), rate / local if local else None,
                                 rate / best if best else None, o.system == best_name))
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _sources(outcomes: list[Outcome]) -> list[str]:
    return list(dict.fromkeys(o.source for o in outcomes))


def ratio_rows(outcomes: list[Outcome]) -> tuple[list[str], list[list[str]], int, int]:
    """``(headers, rows, goals met, goals)`` of the ratio table (goals counted per source)."""
    by_key = {(r.source, r.workload, r.system): r for r in ratios(outcomes)}
    rows, met_n, goal_n = [], 0, 0
    cells = ((s, w, o) for s in _sources(outcomes) for w in WORKLOADS for o in outcomes if o.source == s)
    for source, w, o in cells:
        r = by_key.get((source, w.key, o.system))
        goal = next((g for g in GOALS if g.workload == w.key and o.system in g.systems), None)
        if r is None:
            # a goal of a system that ran but gave no figure (failed, timed out) is not met
            missed = goal is not None and not o.status.startswith("not installed")
            rows.append([source, w.title, o.system, o.status if o.status != "ok" else "not measured", "", "",
                         "NOT met (no figure)" if missed else ""])
            goal_n += missed
            continue
        gtext = "(limit)" if o.role == "local" else "(best peer)" if r.best_peer else ""
        if goal is not None:
            ok = all(v is not None and v >= want for v, want in ((r.vs_local, goal.vs_local),
                                                                 (r.vs_peer, goal.vs_peer)))
            local = f">={goal.vs_local:g}x local, " if goal.vs_local else ""
            gtext = f"{local}>={goal.vs_peer:g}x peer: {'met' if ok else 'NOT met'}"
            met_n, goal_n = met_n + ok, goal_n + 1
        value = f"{r.rate:,.1f} {w.unit}" + (f" ({r.mb_s:,.1f} MB/s)" if w.unit != "MB/s" else "")
        rows.append([source, w.title, o.system, value, _x(r.vs_local), _x(r.vs_peer), gtext])
    return ["source", "workload", "system", "rate", "vs local", "vs best peer", "goal"], rows, met_n, goal_n


def memory_rows(outcomes: list[Outcome]) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)``: peak RSS (MiB) of each system's serving, warmup and reader processes."""

    def mib(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    rows = [[o.source, o.system, o.status if o.status != "ok" else "ok", mib(o.daemon_rss_mib),
             mib(o.warmup_rss_mib), mib(o.reader_rss_mib)] for o in outcomes]
    return ["source", "system", "status", "FUSE daemon", "warmup process", "reader process (max)"], rows


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table (``|`` in cells escaped)."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(headers), "|" + "---|" * len(headers)] + [line(r) for r in rows])


def chart(outcomes: list[Outcome], path: str, title: str) -> str:
    """A PNG at ``path``: one panel per workload, each system's rate as a multiple of the local
    copy's (log scale, the limit at 1). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = ratios(outcomes)
    several = len(_sources(outcomes)) > 1

    def label(system: str, source: str) -> str:
        return f"{system} [{source}]" if several else system

    systems = list(dict.fromkeys(label(o.system, o.source) for o in outcomes))
    fig, axes = plt.subplots(len(WORKLOADS), 1, figsize=(9, 2.0 + 1.6 * len(WORKLOADS) * (1.6 if several else 1)),
                             sharex=True)
    for ax, w in zip(axes, WORKLOADS, strict=True):
        vals = {label(r.system, r.source): r.vs_local for r in rs if r.workload == w.key and r.vs_local}
        names = [s for s in systems if s in vals]
        ax.barh(names, [vals[s] for s in names],
                color=["#1f77b4" if "datacache" in s else "#7f7f7f" if "local" in s else "#ff7f0e" for s in names])
        for i, s in enumerate(names):
            ax.text(vals[s], i, f" {vals[s]:.2f}x", va="center", fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
        ax.set_title(f"{w.title} ({w.unit}, vs local copy)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
