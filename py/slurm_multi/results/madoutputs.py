"""madengine's other result files, made from a collected job dir: perf_entry.json/.csv, perf_super.json/.csv
and perf_entry_super.json/.csv, with the records madengine's reporting makes from the same rows
(madengine: reporting/update_perf_csv.py, reporting/update_perf_super.py, utils/config_parser.py).

The inputs are what `results collect` wrote: JOBDIR/perf.csv (the rows, their status), summary.json
(which per-node CSV was chosen) and job.json (the args, the model's script and checkout). pandas
reads the results and config CSVs as madengine reads them (so a `temperature` of 45 is the number
45.0 in `multi_results`, as in madengine's files) and writes the perf_super CSVs. pandas is imported
only here, after the verdict: collect's own path never pays for it.

Where this differs from madengine, on purpose (docs say so, code does not):
- Each result row gets the config row of ITS model (and benchmark, when both have one), as
  ConfigParser.match_config_to_result's docstring promises; madengine's caller pops `model` before
  matching, so every row got the first config row. An exact model match wins over a substring one
  (model-1 must not take model-10's row); no match is None and a warning, as the docstring says,
  not a silent first row. One config row applies to every row.
- A row's status and test_duration are perf.csv's (one judgement: collect's), not recomputed.
- An existing perf_super.json that is not a JSON list of objects is an error and is left as it
  was (madengine starts a new list, dropping the old records).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.common import HelperError, talk, usage_error
from slurm_multi.results.perfcsv import LOCK_SUFFIX, LOCK_TIMEOUT_S, check_target, locked
from slurm_multi.results.pick import CsvProblem, column_index, read_table
from slurm_multi.results.rows import PERF_COLUMNS
from slurm_multi.results.shared import AREA, is_path, json_error, os_error, read_json, write_atomic

ENTRY_JSON, ENTRY_CSV = "perf_entry.json", "perf_entry.csv"
SUPER_JSON, SUPER_CSV = "perf_super.json", "perf_super.csv"
ENTRY_SUPER_JSON, ENTRY_SUPER_CSV = "perf_entry_super.json", "perf_entry_super.csv"
# madengine's common_info: the run's columns every result row shares (perf.csv's, less these).
ROW_COLUMNS = ("model", "performance", "metric", "status")
COMMON_COLUMNS = tuple(column for column in PERF_COLUMNS if column not in ROW_COLUMNS)
# Result columns that never go into multi_results (madengine pops them; `status` is ours to set).
NOT_MULTI_RESULTS = ("test_duration", "status")
# config_parser: `--config <path>` in the model's args; repository names under scripts/.
CONFIG_ARG = re.compile(r"--config\s+(\S+)")
KNOWN_REPOS = ("MAD", "MAD-private", "MAD-internal")
SERIALIZED = ("configs", "multi_results")  # JSON text in the CSVs


@dataclass
class Records:
    """A job's madengine records: perf_entry's (perf.csv's rows + configs) and perf_super's."""

    header: list[str]
    rows: list[list[str]]
    entries: list[dict[str, Any]]
    supers: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


@dataclass
class Written:
    """What write_mad_outputs did (`skipped`: why nothing, for a job without a manifest model)."""

    jobdir: Path
    records: int = 0
    shared: Path | None = None
    shared_total: int = 0
    skipped: str = ""
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.skipped:
            return self.skipped
        names = ", ".join((ENTRY_JSON, ENTRY_CSV, SUPER_JSON, SUPER_CSV, ENTRY_SUPER_JSON, ENTRY_SUPER_CSV))
        line = f"madengine files: {self.records} record(s) in {self.jobdir}: {names}"
        if self.shared is not None:
            line += (
                f"; beside {self.shared}: {SUPER_JSON} ({self.shared_total} records in all), {SUPER_CSV}, "
                f"{ENTRY_SUPER_JSON}, {ENTRY_SUPER_CSV}, {ENTRY_JSON}"
            )
        return line


# ----------------------------------------------------------------------------- the command's body


def write_mad_outputs(jobdir: Path, perf_csv: str | None = None, hold_on_bad_nodes: bool = False) -> Written:
    """Write JOBDIR's madengine files and, with `perf_csv`, the cumulative ones beside it (under the
    shared perf.csv's lock). A job without a manifest model writes nothing (Written.skipped says so).
    hold_on_bad_nodes: nothing beside perf_csv when summary.json names bad nodes (collect's
    --no-perf-csv-on-bad-nodes appended nothing then)."""
    if not is_path(jobdir, "dir"):
        raise usage_error(f"{AREA}: job directory {jobdir} does not exist; pass the directory the job wrote")
    if not is_path(jobdir / "perf.csv", "file"):
        raise usage_error(
            f"{AREA}: {jobdir / 'perf.csv'} does not exist; run `slurm-multi results collect {jobdir}` first"
        )
    target = check_target(perf_csv) if perf_csv is not None else None
    job = _json_object(jobdir / "job.json", "the batch step wrote it; fix or move it aside")
    if not _text(job.get("model_key")):
        return Written(jobdir, skipped=f"{jobdir}: no manifest model (job.json has no model_key): "
                       "madengine's perf_entry/perf_super files are not written")  # fmt: skip
    summary = _json_object(jobdir / "summary.json", "re-run results collect", required=True)
    records = build_records(jobdir, job, summary)
    write_job_files(jobdir, records)
    done = Written(jobdir, len(records.supers), warnings=records.warnings)
    if target is not None and hold_on_bad_nodes and summary.get("bad_nodes"):
        done.warnings.append(f"bad nodes: nothing written beside {target} (collect appended no rows there)")
    elif target is not None:
        done.shared, done.shared_total = target, write_shared_files(target, records)
    return done


def mad_outputs(jobdir: Path, perf_csv: str | None = None, hold_on_bad_nodes: bool = False) -> None:
    """`results mad-outputs` (and collect's --mad-outputs): write the files, then say so (the
    warnings first)."""
    from slurm_multi.results.commands import talk_warnings

    done = write_mad_outputs(jobdir, perf_csv, hold_on_bad_nodes)
    talk_warnings(done.warnings)
    talk(AREA, done.describe())


def _json_object(path: Path, fix: str, required: bool = False) -> dict[str, Any]:
    """The JSON object in `path` ({} when it is not there and not `required`)."""
    if not required and not is_path(path, "any"):
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        raise usage_error(f"{AREA}: cannot read {path}: {json_error(exc)}; {fix}") from None
    if not isinstance(data, dict):
        raise usage_error(f"{AREA}: {path} is not a JSON object; {fix}")
    return data


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# ----------------------------------------------------------------------------- records


def build_records(jobdir: Path, job: Mapping[str, Any], summary: Mapping[str, Any]) -> Records:
    """perf_entry and perf_super records of the job's perf.csv rows: from the chosen CSV
    (summary.json `chosen_csv`) madengine's multiple-results records, else its single-result ones."""
    header, rows = read_perf_csv(jobdir / "perf.csv")
    warnings: list[str] = []
    args = _text(job.get("args")) or (rows[0][header.index("args")] if "args" in header and rows else "")
    configs = load_configs(args, _model_scripts(job), _checkout_root(job), warnings)
    chosen = _text(summary.get("chosen_csv"))
    records = Records(header, rows, [], [], warnings)
    if summary.get("source") == "csv" and chosen:
        results = read_results(_chosen_path(jobdir, chosen), len(rows))
        for values, result in zip(rows, results):
            row = dict(zip(header, values))
            config = _row_config(configs, result, row["model"], warnings)
            records.entries.append(dict(row, configs=config))
            records.supers.append(multi_record(row, result, config))
    else:
        for values in rows:
            row = dict(zip(header, values))
            records.entries.append(dict(row, configs=configs))
            records.supers.append(dict(row, configs=configs, multi_results=None))
    return records


def read_perf_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """JOBDIR/perf.csv as collect wrote it: its header and rows, every value the text it holds."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            table = [row for row in csv.reader(handle, strict=True) if row]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        why = os_error(exc) if isinstance(exc, OSError) else str(exc)
        raise usage_error(f"{AREA}: cannot read {path}: {why}; re-run results collect") from None
    if not table or "model" not in table[0] or any(len(row) != len(table[0]) for row in table):
        raise usage_error(f"{AREA}: {path} is not the perf.csv results collect writes; re-run it")
    return table[0], table[1:]


def _chosen_path(jobdir: Path, chosen: str) -> Path:
    """summary.json names the chosen CSV as collect was given the job dir (`<jobdir>/node_3/x.csv`,
    perhaps relative to another cwd): its node dir and name, in this job dir."""
    path = Path(chosen)
    return jobdir / path.parent.name / path.name


@dataclass(frozen=True)
class Result:
    """One row of the chosen results CSV: its values as pandas reads them (madengine's types), the
    model as written, and the columns that are not model, performance or metric."""

    values: dict[str, Any]
    model: str
    performance: Any
    extras: dict[str, Any]


def read_results(path: Path, expected: int) -> list[Result]:
    """The chosen CSV's rows, the rows collect kept (pick.read_table: a malformed row is dropped
    there too, so row i is perf.csv's row i), typed by pandas as madengine's read_csv types them."""
    try:
        table = read_table(path)
    except CsvProblem as exc:
        raise usage_error(f"{AREA}: chosen CSV {path}: {exc}; re-run results collect") from None
    if len(table.records) != expected:
        raise usage_error(
            f"{AREA}: chosen CSV {path} has {len(table.records)} rows, perf.csv {expected}; it changed since "
            "collect: re-run results collect"
        )
    pd = _pandas()
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([table.header, *table.records])
    frame = pd.read_csv(io.StringIO(buffer.getvalue()))
    names = [str(name) for name in frame.columns]  # pandas' names (a duplicate is renamed x.1)
    # The columns collect read as model, performance and metric (any case, as rows.py reads them).
    extra_at = [
        at for at, name in enumerate(table.header)
        if name.lower() not in ("model", "performance", "metric") and name not in NOT_MULTI_RESULTS
    ]  # fmt: skip
    model_at, perf_at = column_index(table.header, "model"), column_index(table.header, "performance")
    results = []
    for raw, row in zip(table.records, frame.itertuples(index=False, name=None)):
        values = [_native(value) for value in row]
        extras = {names[at]: values[at] for at in extra_at if not _missing(values[at])}
        results.append(
            Result(
                dict(zip(names, values)),
                raw[model_at] if model_at is not None else "",
                values[perf_at] if perf_at is not None else None,
                extras,
            )
        )
    return results


def multi_record(row: Mapping[str, str], result: Result, config: Any) -> dict[str, Any]:
    """madengine's perf_super record of one multiple-results row, in its key order: the common
    columns, model, performance, metric, multi_results, status, configs."""
    record: dict[str, Any] = {column: row.get(column, "") for column in COMMON_COLUMNS}
    record["model"] = row["model"]
    # perf.csv's performance is empty when it is not a finite number: then None (madengine: NaN).
    performance = result.performance if row["performance"] and not _missing(result.performance) else None
    record["performance"] = performance
    record["metric"] = row["metric"]
    record["multi_results"] = dict(result.extras) or None
    record["status"] = row["status"]
    record["configs"] = config
    return record


def _missing(value: Any) -> bool:
    """No value: None, "" or NaN (how pandas reads an empty cell; numpy's float64 is a float)."""
    return (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or (isinstance(value, str) and not value)
    )


def _native(value: Any) -> Any:
    """A pandas/numpy scalar as the Python value json writes (to_dict already gives most)."""
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, (str, bytes)) else value


# ----------------------------------------------------------------------------- configs


def _model_scripts(job: Mapping[str, Any]) -> str:
    values = job.get("manifest_values")
    scalars = values.get("scalars") if isinstance(values, dict) else None
    return _text(scalars.get("SM_MODEL_SCRIPTS")) if isinstance(scalars, dict) else ""


def _checkout_root(job: Mapping[str, Any]) -> str:
    """What the model's scripts are relative to: --model-dir, else the manifest's directory (as
    slurm_multi.context resolves the script); "" (the cwd, as madengine) without either."""
    settings = job.get("settings")
    model_dir = _text(settings.get("SM_MODEL_DIR")) if isinstance(settings, dict) else ""
    manifest = _text(job.get("manifest"))
    return model_dir or (os.path.dirname(os.path.abspath(manifest)) if manifest else "")


def config_candidates(config: str, scripts: str, root: str) -> list[str]:
    """Where `--config <config>` may be, in config_parser's order: the model script's directory,
    the scripts tree's root (`scripts/`, or `scripts/MAD*/`), every directory between them, and
    then (ours) the checkout root itself. All relative to `root`; an absolute path is itself."""
    if os.path.isabs(config):
        return [config]
    script_dir = os.path.dirname(scripts)
    dirs = [script_dir] if script_dir else []
    parts = Path(script_dir).parts
    if "scripts" in parts:
        at = parts.index("scripts")
        top = parts[: at + 2] if len(parts) > at + 1 and parts[at + 1] in KNOWN_REPOS else parts[: at + 1]
        dirs.append(os.path.join(*top))
        dirs += [os.path.join(*parts[:end]) for end in range(len(parts) - 1, len(top) - 1, -1)]
    dirs.append("")
    seen, found = set(), []
    for directory in dirs:
        path = os.path.normpath(os.path.join(root, directory, config))
        if path not in seen:
            seen.add(path)
            found.append(path)
    return found


def load_configs(args: str, scripts: str, root: str, warnings: list[str]) -> Any:
    """The config file named by `--config` in the args: a CSV as a list of row dicts (blank rows
    dropped, empty cells None), a .json or .yaml file as it is. None without --config; None and a
    warning when it is named but cannot be found or read."""
    match = CONFIG_ARG.search(args)
    if not match:
        return None
    named = match.group(1)
    candidates = config_candidates(named, scripts, root)
    path = next((p for p in candidates if is_path(p, "file")), None)
    if path is None:
        warnings.append(
            f"--config {named} not found (tried {', '.join(candidates[:4])}"
            f"{', ...' if len(candidates) > 4 else ''}); configs are None"
        )
        return None
    try:
        return read_config(path)
    except (OSError, ValueError, ImportError, RecursionError) as exc:
        why = os_error(exc) if isinstance(exc, OSError) else str(exc).splitlines()[0] if str(exc) else ""
        warnings.append(f"--config {path} unreadable ({why or type(exc).__name__}); configs are None")
        return None


def read_config(path: str) -> Any:
    """One config file as config_parser loads it (OSError, ValueError or ImportError otherwise)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        pd = _pandas()
        frame = pd.read_csv(path).dropna(how="all")
        return [
            {str(k): None if _missing(v) else _native(v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")
        ]
    if suffix == ".json":
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError("PyYAML is not installed: pip install pyyaml") from None
        with open(path, encoding="utf-8") as handle:
            try:
                return yaml.safe_load(handle)
            except yaml.YAMLError as exc:
                raise ValueError(f"not YAML: {exc}") from None
    raise ValueError(f"a {suffix or 'suffixless'} file: configs are .csv, .json or .yaml")


def _row_config(configs: Any, result: Result, model: str, warnings: list[str]) -> Any:
    """A result row's configs: a list of config rows matched to it, anything else as it is."""
    if not isinstance(configs, list) or not configs:
        return configs or None
    found = match_config(configs, result)
    if found is None:
        warnings.append(f"{model}: no --config row has model {result.model!r}; its configs are None")
    return found


def _normal(value: Any) -> str:
    return str(value).replace("/", "_").replace("-", "_").lower().strip()


def _same(a: Any, b: Any) -> bool:
    return a == b or str(a).strip() == str(b).strip()


def match_config(configs: Sequence[Any], result: Result) -> Any:
    """The config row of a result row: one row applies to every result; otherwise the row whose
    `model` is the result's (normalised as madengine does: `/` and `-` as `_`, case ignored; an exact
    match before a substring one) and, when both have a `benchmark`, the same benchmark. None when
    no row matches."""
    if len(configs) == 1:
        return configs[0]
    wanted = _normal(result.model)
    if not wanted:
        return None
    benchmark = result.values.get("benchmark")

    def fits(config: Any, exact: bool) -> bool:
        if not isinstance(config, dict) or _missing(config.get("model")):
            return False
        have = _normal(config["model"])
        if not (have == wanted if exact else have and (have in wanted or wanted in have)):
            return False
        theirs = config.get("benchmark")
        return _missing(theirs) or _missing(benchmark) or _same(theirs, benchmark)

    for exact in (True, False):
        for config in configs:
            if fits(config, exact):
                return config
    return None


# ----------------------------------------------------------------------------- files


def json_text(value: Any) -> str:
    """madengine's layout (json.dump, indent 2) and a final newline."""
    return json.dumps(value, indent=2) + "\n"


def entry_json_text(entries: Sequence[dict[str, Any]]) -> str:
    """perf_entry.json as madengine's multiple-results path writes it: one row an object, more a list."""
    return json_text(entries[0] if len(entries) == 1 else list(entries))


def rows_csv_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([header, *rows])
    return buffer.getvalue()


def super_csv_text(records: Sequence[Mapping[str, Any]]) -> str:
    """A perf_super list as a CSV (madengine's convert_super_json_to_csv): one column per key in
    order of first appearance, `configs` and `multi_results` as JSON text, None (or no key) empty."""
    pd = _pandas()
    frame = pd.DataFrame(list(records))
    for column in SERIALIZED:
        if column in frame.columns:
            frame[column] = [None if _missing(v) else json.dumps(v) for v in frame[column].tolist()]
    return frame.to_csv(index=False, lineterminator="\n")


def write_job_files(jobdir: Path, records: Records) -> None:
    """JOBDIR's six files: this job's records only (a re-run writes the same files)."""
    supers = json_text(records.supers)
    super_csv = super_csv_text(records.supers)
    write_atomic(jobdir / ENTRY_JSON, entry_json_text(records.entries))
    write_atomic(jobdir / ENTRY_CSV, rows_csv_text(records.header, records.rows))
    write_atomic(jobdir / SUPER_JSON, supers)
    write_atomic(jobdir / SUPER_CSV, super_csv)
    write_atomic(jobdir / ENTRY_SUPER_JSON, supers)
    write_atomic(jobdir / ENTRY_SUPER_CSV, super_csv)


def write_shared_files(target: Path, records: Records, lock_timeout: float = LOCK_TIMEOUT_S) -> int:
    """Beside the shared perf.csv `target`, under its lock: perf_super.json with this job's records
    appended, perf_super.csv rebuilt from it, perf_entry_super.json/.csv and perf_entry.json with this
    job's. Returns how many records perf_super.json holds. An existing perf_super.json that is not a
    JSON list of objects: a one-line error, nothing written."""
    hint = f"is {os.path.abspath(target.parent)} writable?"
    with locked(target.with_name(target.name + LOCK_SUFFIX), lock_timeout):
        cumulative = read_super_json(target.with_name(SUPER_JSON)) + list(records.supers)
        texts = {  # all made before the first write: a failure leaves the files as they were
            SUPER_JSON: json_text(cumulative),
            SUPER_CSV: super_csv_text(cumulative),
            ENTRY_SUPER_JSON: json_text(records.supers),
            ENTRY_SUPER_CSV: super_csv_text(records.supers),
            ENTRY_JSON: entry_json_text(records.entries),
        }
        for name, text in texts.items():
            write_atomic(target.with_name(name), text, hint)
    return len(cumulative)


def read_super_json(path: Path) -> list[Any]:
    """An existing cumulative perf_super.json ([] when there is none)."""
    if not is_path(path, "any"):
        return []
    try:
        data = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        raise _bad_super(path, f"unreadable ({json_error(exc)})") from None
    if not isinstance(data, list):
        raise _bad_super(path, f"a JSON {type(data).__name__ if data is not None else 'null'}, not a list")
    if not all(isinstance(item, dict) for item in data):
        raise _bad_super(path, "a list whose items are not all JSON objects")
    return data


def _bad_super(path: Path, what: str) -> HelperError:
    return usage_error(f"{AREA}: {path} is {what}; fix or move it aside (nothing was written beside it)")


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise HelperError(
            f"{AREA}: pandas is not installed for this Python; pip install pandas (or pip install -e "
            "$SM_HOME) into SM_PYTHON's environment"
        ) from None
    return pandas


def warm_up() -> None:
    """What the batch step's warm start (`slurm-multi warm results mad-outputs`) pays while the job
    runs: pandas' import, ~0.3 s of CPU that otherwise follows every manifest job's verdict. A
    missing pandas is said when the files are asked for."""
    try:
        _pandas()
    except HelperError:
        pass
