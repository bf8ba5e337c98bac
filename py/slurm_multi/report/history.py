"""The runs in a shared perf.csv, as the history page shows them (pandas, imported only here).

- A **configuration** is what relative_change compares on (results.perfcsv.CONFIG_COLUMNS: the model,
  its metric, n_gpus, nnodes, ... ): the rows with the same one are the runs of one thing, in file
  order (the order collect appended them).
- Each run's **change** is against the median of the configuration's earlier runs that have a value
  (a median, so one odd run does not move the yardstick); the last run's is the page's headline.
- A run is a **regression** when its change is worse than `--regression-pct` percent: lower for a
  throughput (or a metric of unknown kind), higher for a latency or a memory figure (the metric's
  kind is results.logmetrics.metric_kind's, the rule that combines log metrics).
- **Stage times per node** come from perf_stages.jsonl beside the perf.csv (collect appends one line
  per job: results.stagehistory). Per job model, node and stage: the last run against the median of
  that node's earlier runs; a node is flagged slower when that is more than `--regression-pct`
  percent, more than FLOOR_SECONDS and at least MIN_SECONDS (the straggler rule's floors: a stage
  under a second jitters by 2x from scheduling alone).

The file is read as collect's picker reads a results CSV (results.pick.read_table): a row that cannot
be trusted is dropped with one warning naming its line, never a traceback; a file that is not a CSV
with `model` and `performance` columns is one line (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.common import HelperError, usage_error
from slurm_multi.report.page import AREA
from slurm_multi.results.logmetrics import metric_kind
from slurm_multi.results.perfcsv import CONFIG_COLUMNS, MAX_PERF_CSV_BYTES, config_key
from slurm_multi.results.pick import CsvProblem, read_table
from slurm_multi.results.stagehistory import STAGES_NAME, read_stage_history
from slurm_multi.results.stragglers import FLOOR_SECONDS, MIN_SECONDS
from slurm_multi.results.values import as_number

DEFAULT_REGRESSION_PCT = 5.0
LOWER_IS_BETTER = frozenset({"latency", "memory"})
SUPER_JSON = "perf_super.json"  # results.madoutputs writes it beside the shared perf.csv


@dataclass
class Group:
    """One model and configuration: its runs in file order (a pandas DataFrame with the columns
    run, machine_name, performance, value, status, median_before, change_pct, regression)."""

    key: tuple[str, ...]
    model: str
    metric: str
    config: dict[str, str]
    lower_is_better: bool
    runs: Any
    configs: Any = None  # perf_super.json's `configs` of its latest record, when there is one

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.config.items())
        return f"{self.model} · {self.metric or 'no metric'}" + (f" · {shown}" if shown else "")

    @property
    def last(self) -> Any:
        return self.runs.iloc[-1]

    @property
    def regressed(self) -> bool:
        return bool(self.last["regression"])

    def verdict(self) -> str:
        """The last run in a word: REGRESSION, better, ok, no value, first run."""
        last = self.last
        if last["regression"]:
            return "REGRESSION"
        if math.isnan(last["value"]):
            return "no value"
        if math.isnan(last["change_pct"]):
            return "first run" if len(self.runs) == 1 else "no earlier value"
        better = last["change_pct"] < 0 if self.lower_is_better else last["change_pct"] > 0
        return "better" if better and abs(last["change_pct"]) > 0 else "ok"


@dataclass
class NodeStages:
    """One job model's stage times per node over its runs: `table` (pandas: model, node, stage,
    runs, last, median_before, change_pct, rising, slower) and `series` (per stage, a frame of
    seconds: one row per run, one column per node)."""

    model: str
    runs: int
    table: Any
    series: dict[str, Any]


@dataclass
class History:
    path: Path
    rows: int
    threshold: float
    groups: list[Group] = field(default_factory=list)
    stages: list[NodeStages] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stages_file: Path | None = None
    super_file: Path | None = None

    @property
    def regressions(self) -> list[tuple[Group, Any]]:
        """Every run flagged as a regression: (its group, its row)."""
        return [(g, row) for g in self.groups for _, row in g.runs[g.runs["regression"]].iterrows()]


def pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise HelperError(
            f"{AREA}: --history needs pandas, which is not installed for this Python; pip install pandas "
            "(or pip install -e $SM_HOME) into SM_PYTHON's environment"
        ) from None
    return pandas


def read_rows(path: Path) -> tuple[list[str], list[tuple[str, ...]], list[str]]:
    """The perf.csv's header, its rows (a row that cannot be trusted dropped) and the warnings."""
    if not path.is_file():
        raise usage_error(
            f"{AREA}: --history {path} is not a file; pass the shared perf.csv that "
            "`results collect --perf-csv` appends to"
        )
    try:
        table = read_table(path, path.name, MAX_PERF_CSV_BYTES)
    except CsvProblem as exc:
        raise usage_error(f"{AREA}: --history {path}: {exc}; pass a perf.csv as collect writes it") from None
    warnings = list(table.warnings)
    known = {"model", "performance", "metric", "status", "machine_name", *CONFIG_COLUMNS}
    names: list[str] = []
    for index, name in enumerate(table.header):
        name = name.lower() if name.lower() in known else name  # matched as the picker matches them
        if name in names:  # the first of two columns of one name counts
            warnings.append(f"{path.name}: column {name!r} appears twice; the first one counts")
            name = f"{name} (column {index + 1})"
        names.append(name)
    if "model" not in names:
        raise usage_error(
            f"{AREA}: --history {path}: no 'model' column; pass a perf.csv as collect writes it"
        )
    return names, list(table.records), warnings


def _change(value: float, before: float) -> float:
    if math.isnan(value) or math.isnan(before) or before == 0:
        return math.nan
    return (value - before) / abs(before) * 100


def analyse_group(frame: Any, threshold: float, lower_is_better: bool) -> Any:
    """The group's runs with each one's median of the earlier values, change and regression flag."""
    runs = frame[["machine_name", "performance", "value", "status"]].reset_index(drop=True)
    runs.insert(0, "run", range(1, len(runs) + 1))
    runs["median_before"] = runs["value"].expanding(min_periods=1).median().shift(1)
    runs["change_pct"] = [_change(v, b) for v, b in zip(runs["value"], runs["median_before"])]
    worse = runs["change_pct"] > threshold if lower_is_better else runs["change_pct"] < -threshold
    runs["regression"] = worse.astype(bool)  # a change that is NaN compares False: never flagged
    return runs


def read_supers(path: Path, warnings: list[str]) -> dict[tuple[str, ...], Any]:
    """perf_super.json's `configs` per configuration (the latest record's), when the file is there."""
    if not path.is_file():
        return {}
    from slurm_multi.results.madoutputs import read_super_json

    try:
        records = read_super_json(path)
    except HelperError as exc:
        warnings.append(f"{SUPER_JSON}: {exc.message.split(': ', 2)[-1]}")
        return {}
    found: dict[tuple[str, ...], Any] = {}
    for record in records:
        values = {k: "" if v is None else str(v) for k, v in record.items() if isinstance(k, str)}
        if record.get("configs") is not None:
            found[config_key(values)] = record["configs"]
    return found


def read_history(path: Path, threshold: float = DEFAULT_REGRESSION_PCT) -> History:
    """Everything the history page shows about the perf.csv at `path`."""
    pd = pandas()
    header, records, warnings = read_rows(path)
    history = History(path, len(records), threshold, warnings=warnings)
    supers_path = path.with_name(SUPER_JSON)
    supers = read_supers(supers_path, history.warnings)
    history.super_file = supers_path if supers_path.is_file() else None
    frame = pd.DataFrame(records, columns=header)
    for column in ("machine_name", "metric", "status", *CONFIG_COLUMNS):
        if column not in frame.columns:
            frame[column] = ""
    frame["value"] = [
        as_number(text) if as_number(text) is not None else math.nan for text in frame["performance"]
    ]
    frame["key"] = [config_key(row) for row in frame[list(CONFIG_COLUMNS)].to_dict("records")]
    for key, rows in frame.groupby("key", sort=False):
        first = rows.iloc[0]
        lower = metric_kind(str(first["metric"])) in LOWER_IS_BETTER
        config = {c: str(first[c]) for c in CONFIG_COLUMNS[2:] if str(first[c])}
        history.groups.append(
            Group(
                key,
                str(first["model"]),
                str(first["metric"]),
                config,
                lower,
                analyse_group(rows, threshold, lower),
                supers.get(key),
            )
        )
    stages_path = path.with_name(STAGES_NAME)
    if stages_path.exists():
        history.stages_file = stages_path
        stage_records, stage_warnings = read_stage_history(stages_path)
        history.warnings += stage_warnings
        history.stages = node_stages(pd, stage_records, threshold)
    return history


def _rising(values: list[float]) -> int:
    """How many runs in a row, up to the last, each took longer than the one before."""
    count = 0
    for before, after in zip(values[-2::-1], values[::-1]):
        if not after > before:
            break
        count += 1
    return count


def node_stages(pd: Any, records: list[dict[str, Any]], threshold: float) -> list[NodeStages]:
    """Per job model: each node's stage seconds per run, and its last run against its earlier ones."""
    long_rows = []
    runs_per_model: dict[str, int] = {}
    for record in records:
        model = record["model"] or "?"
        run = runs_per_model[model] = runs_per_model.get(model, 0) + 1
        for node in record["nodes"]:
            for stage, seconds in node["stages"].items():
                long_rows.append((model, run, record["machine_name"], node["node"], stage, seconds))
    if not long_rows:
        return []
    frame = pd.DataFrame(long_rows, columns=["model", "run", "machine_name", "node", "stage", "seconds"])
    found = []
    for model, rows in frame.groupby("model", sort=False):
        series, table = {}, []
        stages = list(dict.fromkeys(rows["stage"]))
        for stage in stages:
            wide = rows[rows["stage"] == stage].pivot_table(
                index="run", columns="node", values="seconds", aggfunc="last"
            )
            series[stage] = wide
            for node in wide.columns:
                values = [v for v in wide[node].tolist() if not math.isnan(v)]
                if not values:
                    continue
                last = values[-1]
                before = float(pd.Series(values[:-1]).median()) if len(values) > 1 else math.nan
                change = _change(last, before)
                slower = (
                    not math.isnan(change)
                    and change > threshold
                    and last - before > FLOOR_SECONDS
                    and last >= MIN_SECONDS
                )
                table.append((str(node), stage, len(values), last, before, change, _rising(values), slower))
        columns = ["node", "stage", "runs", "last", "median_before", "change_pct", "rising", "slower"]
        summary = pd.DataFrame(table, columns=columns)
        if len(summary):
            summary = summary.sort_values(
                ["slower", "change_pct"], ascending=[False, False], na_position="last"
            )
        found.append(NodeStages(str(model), runs_per_model[model], summary.reset_index(drop=True), series))
    return found
