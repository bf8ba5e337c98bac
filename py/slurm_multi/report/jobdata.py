"""What the job page shows, read from the files collect and the job wrote: summary.json (the verdict
and everything judged), timeline.json, job.json, perf.csv, and the hung ranks' diagnostics files that
summary.json names. Nothing is judged again here: a fact is read from the file that owns it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.common import HelperError, usage_error
from slurm_multi.readfile import read_bytes, read_json
from slurm_multi.report.page import AREA, MAX_INLINE_CHARS, link
from slurm_multi.results.jobdir import load_job_json

SUMMARY, TIMELINE, PERF = "summary.json", "timeline.json", "perf.csv"
REPORT = "report.html"
MAX_STACK_RANKS = 8  # hung ranks whose diagnostics are shown inline; the others' are linked


@dataclass
class JobData:
    """A collected job directory as the page needs it."""

    root: Path
    summary: dict[str, Any]
    timeline: dict[str, Any] | None
    job: dict[str, Any]
    perf_header: list[str] = field(default_factory=list)
    perf_rows: list[list[str]] = field(default_factory=list)
    diagnostics: dict[str, str] = field(default_factory=dict)  # jobdir-relative path -> text
    problems: list[str] = field(default_factory=list)  # what the page could not read
    prefix: str = ""  # from the page's directory to the job dir ("" when the page is in it)

    def present(self, name: str) -> bool:
        """Whether the job dir has this file or directory (the page links only what is there). A name
        no file can have (too long, a NUL: a results_csv of job.json) is not there: os.path.exists
        says False for every OSError, where Path.exists raises all but ENOENT's kind."""
        return os.path.exists(self.root / name)

    def link(self, name: str, text: str | None = None) -> str:
        """A relative link to the job dir's `name` from where the page is."""
        return link(self.prefix + name, text if text is not None else name)


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def read_summary(root: Path) -> dict[str, Any]:
    """summary.json, which the page cannot do without: a missing or broken one is a usage error
    naming the command that writes it."""
    path = root / SUMMARY
    fix = f"run `slurm-multi results collect {root}` (or bin/sm-collect) first"
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise usage_error(f"{AREA}: {path} does not exist; {fix}") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise usage_error(f"{AREA}: cannot read {path}: {_json_error(exc)}; {fix}") from None
    if not isinstance(data, dict) or "verdict" not in data:
        raise usage_error(f"{AREA}: {path} is not the summary.json results collect writes; {fix}")
    return data


def read_timeline(root: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = read_json(root / TIMELINE)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        problems.append(f"{TIMELINE} unreadable ({_json_error(exc)}): no timeline picture")
        return None
    if not isinstance(data, dict):
        problems.append(f"{TIMELINE} is not a JSON object: no timeline picture")
        return None
    return data


def read_perf(root: Path, data: JobData) -> None:
    """JOBDIR/perf.csv through its one reader (results.madoutputs)."""
    from slurm_multi.results.madoutputs import read_perf_csv

    if not (root / PERF).is_file():
        data.problems.append(f"{PERF} is not there: no performance rows shown")
        return
    try:
        data.perf_header, data.perf_rows = read_perf_csv(root / PERF)
    except HelperError as exc:
        data.problems.append(str(exc.message).removeprefix("results: "))


def read_text(path: Path, limit: int = MAX_INLINE_CHARS) -> str:
    """A text file's start (bytes that are not UTF-8 replaced); an error text when unreadable."""
    try:
        return read_bytes(path, limit + 1).decode("utf-8", "replace")
    except OSError as exc:
        return f"(unreadable: {exc.strerror or exc})"


def hang_entries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The hang's causes then waiters, each with its role, from summary.json."""
    hang = summary.get("hang") if isinstance(summary.get("hang"), dict) else {}
    entries = []
    for role in ("causes", "waiters"):
        for entry in hang.get(role) or []:
            if isinstance(entry, dict):
                entries.append(dict(entry, role="cause" if role == "causes" else "waiter"))
    return entries


def read_diagnostics(root: Path, summary: dict[str, Any]) -> dict[str, str]:
    """The diagnostics files summary.json names for the hung ranks (the causes first), for the
    first MAX_STACK_RANKS of them; only paths inside the job dir."""
    texts: dict[str, str] = {}
    base = root.resolve()
    for entry in hang_entries(summary)[:MAX_STACK_RANKS]:
        for name in entry.get("diagnostics") or []:
            if not isinstance(name, str):
                continue
            path = (root / name).resolve()
            if base not in path.parents:  # summary.json names files of this job dir, nothing else
                continue
            texts[name] = read_text(path)
    return texts


def read_job(root: Path, page: Path | None = None) -> JobData:
    """Everything the job page shows. Only a missing or broken summary.json is an error; any other
    file that cannot be read costs its part of the page, said on the page."""
    if not root.is_dir():
        raise usage_error(f"{AREA}: job directory {root} does not exist; pass the directory the job wrote")
    summary = read_summary(root)
    problems: list[str] = []
    timeline = read_timeline(root, problems)
    job = load_job_json(root, [])  # what it lacks, collect already said (summary.json's warnings)
    data = JobData(root, summary, timeline, job, problems=problems)
    if page is not None and os.path.abspath(page.parent) != os.path.abspath(root):
        data.prefix = (
            os.path.relpath(os.path.abspath(root), os.path.abspath(page.parent)).replace(os.sep, "/") + "/"
        )
    read_perf(root, data)
    data.diagnostics = read_diagnostics(root, summary)
    return data
