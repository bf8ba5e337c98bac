"""The history page: one self-contained page across the runs of a shared perf.csv.

Sections: the headline (how many configurations regressed past the threshold), the last run of each
configuration against the median of its earlier runs, every run flagged as a regression, a plot per
configuration of its values over the runs, each node's stage times over the runs (which node gets
slower job after job), and the warnings (rows dropped, lines skipped). The plots are matplotlib's
(the Agg canvas, no pyplot), imported only here and inline as PNG; without matplotlib the page says
so where they would be and shows the tables.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_multi.report.history import Group, History, NodeStages
from slurm_multi.report.page import (
    cell,
    document,
    esc,
    paragraph,
    png_image,
    relative_link,
    section,
    table,
    tag,
)

MAX_PLOTS = 60  # configurations plotted (regressions first); the table lists them all
MAX_STAGE_ROWS = 200  # node-stage rows per job model shown (the slower ones first)
MAX_LINES = 6  # nodes drawn by name in a stage plot; the rest are the median band
HISTORY_NAME = "perf_history.html"


def _number(value: Any, digits: int = 2) -> str:
    if value is None or isinstance(value, str) or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:+.1f}%"


# ----------------------------------------------------------------------------- plots


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on the Agg canvas (ImportError without matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _whole_runs(axes: Any) -> None:
    """Runs are counted: ticks at whole numbers only."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def group_plot(group: Group, threshold: float) -> bytes:
    """The configuration's value per run, the median of the earlier runs, regressions in red."""
    runs = group.runs
    figure = _figure(9.0, 2.6)
    figure.subplots_adjust(left=0.09, right=0.98, top=0.88, bottom=0.18)
    axes = figure.add_subplot()
    axes.plot(
        runs["run"],
        runs["value"],
        marker="o" if len(runs) <= 60 else None,
        markersize=3,
        linewidth=1.2,
        color="#1f77b4",
        label=group.metric or "value",
    )
    axes.plot(
        runs["run"],
        runs["median_before"],
        linestyle="--",
        linewidth=1,
        color="#888",
        label="median of the earlier runs",
    )
    bad = runs[runs["regression"]]
    if len(bad):
        axes.plot(
            bad["run"],
            bad["value"],
            linestyle="",
            marker="v",
            markersize=7,
            color="#d00",
            label=f"regression (past {threshold:g}%)",
        )
    failed = runs[runs["value"].isna()]
    if len(failed) and runs["value"].notna().any():
        axes.plot(
            failed["run"],
            [runs["value"].min()] * len(failed),
            linestyle="",
            marker="x",
            color="#999",
            label="no value (FAILURE)",
        )
    axes.set_title(group.label[:120], fontsize=8, loc="left")
    axes.set_xlabel("run (in perf.csv order)", fontsize=8)
    _whole_runs(axes)
    axes.tick_params(labelsize=7)
    axes.grid(linestyle=":", linewidth=0.5)
    axes.legend(fontsize=7, loc="best", frameon=False)
    return _png(figure)


def stages_plot(stages: NodeStages) -> bytes:
    """One row per stage: each node's seconds over the runs (the slower nodes by name, the others as
    the median across nodes), so a node that rises job after job stands out."""
    names = list(stages.series)
    figure = _figure(9.0, 0.6 + 1.7 * len(names))
    figure.subplots_adjust(
        left=0.09, right=0.8, top=1 - 0.35 / (0.6 + 1.7 * len(names)), bottom=0.08, hspace=0.5
    )
    flagged = stages.table[stages.table["slower"]] if len(stages.table) else stages.table
    for index, stage in enumerate(names, start=1):
        wide = stages.series[stage]
        axes = figure.add_subplot(len(names), 1, index)
        named = [n for n in flagged[flagged["stage"] == stage]["node"].tolist() if n in wide.columns]
        if len(wide.columns) <= MAX_LINES:
            named = list(wide.columns)
        if len(wide.columns) > len(named):
            axes.plot(
                wide.index, wide.median(axis=1), color="#888", linewidth=1.5, label="median of the nodes"
            )
        for node in named[:MAX_LINES]:
            axes.plot(
                wide.index,
                wide[node],
                marker="o" if len(wide) <= 40 else None,
                markersize=2.5,
                linewidth=1,
                label=str(node),
            )
        axes.set_title(f"{stage} (s)", fontsize=8, loc="left")
        _whole_runs(axes)
        axes.tick_params(labelsize=7)
        axes.grid(linestyle=":", linewidth=0.5)
        axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    figure.axes[-1].set_xlabel(f"run of {stages.model} (in perf_stages.jsonl order)", fontsize=8)
    return _png(figure)


class Plotter:
    """The plots, or (without matplotlib, or when one cannot be drawn) a line saying why."""

    def __init__(self) -> None:
        self.missing = ""

    def draw(self, make: Any, *args: Any, alt: str) -> str:
        if self.missing:
            return paragraph(self.missing, "muted")
        try:
            return png_image(make(*args), alt)
        except ImportError:
            self.missing = (
                "Plots need matplotlib: pip install 'slurm-multi[timeline]'. The tables say the same."
            )
            return paragraph(self.missing, "muted")
        except Exception as exc:  # a plot is never worth a traceback
            return paragraph(f"plot not drawn ({type(exc).__name__}: {str(exc)[:120]})", "warn")


# ----------------------------------------------------------------------------- sections


def headline(history: History) -> str:
    regressed = [g for g in history.groups if g.regressed]
    flagged = history.regressions
    if regressed:
        what = "; ".join(f"{g.label}: {_pct(g.last['change_pct'])}" for g in regressed[:5])
        past = f"past {history.threshold:g}%"
        text = f"{len(regressed)} configuration(s) regressed in their last run {past}: {what}"
        line = tag("p", esc(text), id="regression-summary", class_="regression")
    else:
        line = tag(
            "p",
            esc(f"No configuration's last run regressed past {history.threshold:g}%."),
            id="regression-summary",
            class_="ok",
        )
    stats = (
        f"{history.rows} row(s), {len(history.groups)} model/configuration(s), "
        f"{len(flagged)} run(s) flagged in all; threshold --regression-pct {history.threshold:g}"
    )
    return "\n".join(
        [tag("h1", esc(f"Performance history: {history.path.name}")), line, paragraph(stats, "muted")]
    )


def last_runs(history: History) -> str:
    if not history.groups:
        return section("Last run against the earlier ones", paragraph("No rows yet."), "last-runs")
    rows = []
    for group in sorted(history.groups, key=lambda g: not g.regressed):
        last = group.last
        verdict = group.verdict()
        rows.append(
            "<tr"
            + (' class="flagged"' if group.regressed else "")
            + ">"
            + "".join(
                [
                    cell(group.model),
                    cell(group.metric),
                    cell(", ".join(f"{k}={v}" for k, v in group.config.items())),
                    cell(len(group.runs), numeric=True),
                    cell(last["machine_name"]),
                    cell(_number(last["value"]), numeric=True),
                    cell(_number(last["median_before"]), numeric=True),
                    cell(_pct(last["change_pct"]), numeric=True),
                    tag(
                        "td",
                        esc(verdict),
                        class_="regression"
                        if verdict == "REGRESSION"
                        else "ok"
                        if verdict in ("ok", "better")
                        else "muted",
                    ),
                ]
            )
            + "</tr>"
        )
    headers = [
        "model",
        "metric",
        "configuration",
        "runs",
        "last run (machine_name)",
        "last value",
        "median of the earlier runs",
        "change",
        "last run",
    ]
    note = paragraph(
        "A configuration is what relative_change compares on (model, metric, n_gpus, nnodes, "
        "gpus_per_node, training_precision, args, tags, gpu_architecture). Lower is worse for a "
        "throughput, higher for a latency or memory metric.",
        "muted",
    )
    return section(
        "Last run against the earlier ones",
        table(headers, rows, id_="last-runs") + "\n" + note,
        "last-runs-section",
    )


def regressions(history: History) -> str:
    flagged = history.regressions
    if not flagged:
        return section(
            "Regressions",
            paragraph(f"No run was worse than the median before it by more than {history.threshold:g}%."),
            "regressions",
        )
    rows = [
        [
            cell(g.label),
            cell(int(r["run"]), numeric=True),
            cell(r["machine_name"]),
            cell(_number(r["value"]), numeric=True),
            cell(_number(r["median_before"]), numeric=True),
            tag("td", esc(_pct(r["change_pct"])), class_="regression num"),
        ]
        for g, r in flagged
    ]
    headers = [
        "model · metric · configuration",
        "run",
        "machine_name",
        "value",
        "median of the earlier runs",
        "change",
    ]
    return section(
        f"Regressions: {len(flagged)} run(s)", table(headers, rows, id_="regressions"), "regressions"
    )


def plots(history: History, plotter: Plotter) -> str:
    if not history.groups:
        return ""
    ordered = sorted(history.groups, key=lambda g: not g.regressed)
    parts = []
    for group in ordered[:MAX_PLOTS]:
        parts.append(tag("h3", esc(group.label), class_="regression" if group.regressed else None))
        if group.configs is not None:
            text = json.dumps(group.configs, sort_keys=True, default=str)
            parts.append(paragraph(f"config (perf_super.json): {text[:400]}", "muted"))
        parts.append(plotter.draw(group_plot, group, history.threshold, alt=f"{group.label} over the runs"))
    if len(ordered) > MAX_PLOTS:
        parts.append(
            paragraph(
                f"{len(ordered) - MAX_PLOTS} more configuration(s) not plotted; the table above "
                "lists them all.",
                "muted",
            )
        )
    return section("Values over the runs", "\n".join(parts), "plots")


def node_stages(history: History, plotter: Plotter) -> str:
    if history.stages_file is None:
        return section(
            "Stage times per node over the runs",
            paragraph(
                "No perf_stages.jsonl beside the perf.csv: collect appends one line there per job from this "
                "version on (`results collect --perf-csv`)."
            ),
            "node-stages",
        )
    parts = []
    for stages in history.stages:
        slower = stages.table[stages.table["slower"]] if len(stages.table) else stages.table
        title = f"{stages.model}: {stages.runs} run(s)"
        if len(slower):
            title += f"; slower in its last run: {', '.join(sorted(set(map(str, slower['node']))))}"
        parts.append(tag("h3", esc(title), class_="regression" if len(slower) else None))
        rows = []
        for _, r in stages.table.head(MAX_STAGE_ROWS).iterrows():
            rows.append(
                "<tr"
                + (' class="flagged"' if r["slower"] else "")
                + ">"
                + "".join(
                    [
                        cell(r["node"]),
                        cell(r["stage"]),
                        cell(int(r["runs"]), numeric=True),
                        cell(_number(r["last"]), numeric=True),
                        cell(_number(r["median_before"]), numeric=True),
                        cell(_pct(r["change_pct"]), numeric=True),
                        cell(int(r["rising"]), numeric=True),
                        tag(
                            "td",
                            "SLOWER" if r["slower"] else "",
                            class_="regression" if r["slower"] else None,
                        ),
                    ]
                )
                + "</tr>"
            )
        headers = [
            "node",
            "stage",
            "runs",
            "last (s)",
            "median of its earlier runs (s)",
            "change",
            "rising for (runs)",
            "",
        ]
        parts.append(table(headers, rows, class_="node-stages"))
        if len(stages.table) > MAX_STAGE_ROWS:
            parts.append(
                paragraph(f"{len(stages.table) - MAX_STAGE_ROWS} more node-stage rows not shown.", "muted")
            )
        if stages.series:
            parts.append(plotter.draw(stages_plot, stages, alt=f"{stages.model}: stage times per node"))
    note = paragraph(
        f"Slower: the last run more than {history.threshold:g}% and more than 0.5 s over the median of "
        "the node's earlier runs, and at least 1 s. Rising: how many runs in a row it took longer.",
        "muted",
    )
    return section("Stage times per node over the runs", "\n".join([*parts, note]), "node-stages")


def warnings(history: History) -> str:
    if not history.warnings:
        return section("Warnings", paragraph("None."), "warnings")
    items = "\n".join(tag("li", esc(w)) for w in history.warnings)
    return section(f"Warnings: {len(history.warnings)}", tag("ul", items, class_="warn"), "warnings")


def files(history: History, page: Path) -> str:
    found: Sequence[Path | None] = (history.path, history.super_file, history.stages_file)
    links = [relative_link(path, page) for path in found if path is not None]
    return tag("p", "<b>files:</b> " + " · ".join(links))


def history_page(history: History, page: Path) -> str:
    plotter = Plotter()
    body = "\n".join(
        [
            headline(history),
            files(history, page),
            last_runs(history),
            regressions(history),
            plots(history, plotter),
            node_stages(history, plotter),
            warnings(history),
        ]
    )
    return document(f"history: {history.path.name}", body)


def write_history_page(perf_csv: Path, threshold: float, out: Path | None = None) -> tuple[Path, History]:
    """Read the perf.csv (and what is beside it) and write the page (default: perf_history.html
    beside it); its path and what it showed."""
    from slurm_multi.report.history import read_history
    from slurm_multi.report.page import write_page

    history = read_history(perf_csv, threshold)
    path = out if out is not None else perf_csv.with_name(HISTORY_NAME)
    write_page(path, history_page(history, path))
    return path, history
