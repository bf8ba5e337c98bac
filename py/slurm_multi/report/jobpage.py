"""The job page, JOBDIR/report.html: one self-contained page with everything collect judged.

Sections, in order: the verdict and every reason; the job's facts and files; each rank's stages;
the timeline picture and the critical path; stragglers; the hang (causes, waiters, the stacks their
diagnostics captured); bad nodes and earlier attempts; the profile; the world size; the chosen CSV
and every candidate's score; the performance rows; the warnings. Every link is relative to the job
dir, so a copied job dir (a laptop, a ticket attachment) shows the same page.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_multi.report.jobdata import REPORT, JobData, hang_entries
from slurm_multi.report.page import (
    cell,
    document,
    esc,
    paragraph,
    preformatted,
    seconds,
    section,
    simple_table,
    table,
    tag,
)
from slurm_multi.report.timelinesvg import timeline_svg
from slurm_multi.results.jobdir import stage_order
from slurm_multi.results.timelinedraw import MAX_PNG_LANES
from slurm_multi.statusfile import STATUS_FILE

# The job dir's files the facts section links when they are there.
JOB_FILES = (
    "summary.json",
    "perf.csv",
    "job.json",
    "timeline.txt",
    "timeline.png",
    "timeline.json",
    "batch.log",
    "perf_super.json",
    "profile-flush.json",
)
# Diagnostics shown open: the stacks (the hang watch's py-spy dump, the kernel's); then the rest.
STACK_FILES = ("py-spy.txt", "kernel-stacks.txt")
FIRST_FILES = (*STACK_FILES, "hang-processes.txt", "container-log-tail.txt", "node-log-tail.txt")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _inside(data: JobData, text: str) -> str | None:
    """A path summary.json or a flush record names, relative to the job dir; None when it is not
    in the job dir (it is shown, not linked)."""
    path = Path(text)
    if not path.is_absolute():
        return text if ".." not in path.parts else None
    try:
        return str(path.resolve().relative_to(data.root.resolve()))
    except ValueError:
        return None


# ----------------------------------------------------------------------------- sections


def header(data: JobData) -> str:
    s = data.summary
    verdict = _text(s.get("verdict")) or "?"
    nnodes = s.get("nnodes")
    title = (
        f"job {_text(s.get('job_id'))} ({_text(s.get('model'))}, {nnodes} node{'s' if nnodes != 1 else ''})"
    )
    parts = [
        tag("h1", esc(title)),
        tag("p", esc(verdict), id="verdict", class_=f"verdict {verdict}"),
    ]
    if s.get("time"):
        parts.append(tag("p", "<b>time:</b> " + esc(s["time"]), id="time"))
    return "\n".join(parts)


def reasons(data: JobData) -> str:
    found = [_text(r) for r in _list(data.summary.get("reasons"))]
    if not found:
        return section(
            "Reasons",
            paragraph("None: every node ended well and the results hold a value.", "ok"),
            "reasons-section",
        )
    items = "\n".join(tag("li", esc(reason), class_="reason") for reason in found)
    body = tag("ul", f"\n{items}\n", id="reasons", class_="reasons")
    return section(
        f"Why {_text(data.summary.get('verdict'))}: {len(found)} reason(s)", body, "reasons-section"
    )


def facts(data: JobData) -> str:
    s, job = data.summary, data.job
    nodes = [str(n) for n in _list(job.get("nodes"))]
    rows = [
        ("job id", _text(s.get("job_id"))),
        (
            "model",
            _text(s.get("model")) + (f" (manifest key {job['model_key']})" if job.get("model_key") else ""),
        ),
        ("nodes", f"{s.get('nnodes')}: {', '.join(nodes[:32])}{' ...' if len(nodes) > 32 else ''}"),
        ("image", _text(job.get("image"))),
        ("image ID", _text(job.get("image_id"))),
        ("runtime", _text(job.get("runtime"))),
        ("launcher", _text(job.get("launcher"))),
        ("profile", _text(job.get("profile"))),
        ("started", _text(job.get("started"))),
        ("wall time", f"{seconds(_dict(data.timeline).get('wall_seconds'))} s" if data.timeline else ""),
    ]
    body = simple_table(["fact", "value"], [(k, v) for k, v in rows if v and v != "-"])
    files = [data.link(name) for name in JOB_FILES if data.present(name)]
    body += "\n" + tag("p", "<b>files:</b> " + " · ".join(files)) if files else ""
    return section("The job", body, "facts")


def stages_table(data: JobData) -> str:
    nodes = [n for n in _list(data.summary.get("nodes")) if isinstance(n, dict)]
    if not nodes:
        return section("Stages per rank", paragraph("No node was judged."), "stages")
    names = stage_order({name: 0 for n in nodes for name in _dict(n.get("stages"))})
    slow = {
        (st.get("stage"), st.get("rank"))
        for st in _list(data.summary.get("stragglers"))
        if isinstance(st, dict)
    }
    rows = []
    for node in nodes:
        rank, stages = node.get("rank"), _dict(node.get("stages"))
        ok = node.get("status") == "ok" and node.get("exit_code") in (0, None)
        dirname = f"node_{rank}"
        files = [
            data.link(f"{dirname}/{f}", f)
            for f in ("node.log", STATUS_FILE)
            if data.present(f"{dirname}/{f}")
        ]
        errors = _list(node.get("log_errors"))
        first = _dict(errors[0]) if errors else {}
        error_text = (
            (
                f"{first.get('pattern')} at node.log:{first.get('line')}"
                + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")
            )
            if first
            else ""
        )
        row = [
            cell(rank, numeric=True),
            cell(node.get("node")),
            tag("td", esc(node.get("status")), class_="ok" if ok else "bad"),
            cell("-" if node.get("exit_code") is None else node.get("exit_code"), numeric=True),
            *[cell(seconds(stages.get(name)), numeric=True, flagged=(name, rank) in slow) for name in names],
            cell(node.get("last_progress") or "-"),
            cell("; ".join(_text(r) for r in _list(node.get("reasons"))) or ""),
            cell(error_text),
            tag("td", " ".join(files)),
        ]
        rows.append(row)
    headers = [
        "rank",
        "node",
        "status",
        "exit",
        *[f"{n} (s)" for n in names],
        "last progress",
        "reasons",
        "error pattern",
        "files",
    ]
    note = paragraph("Seconds per stage; a shaded cell is a straggler.", "muted")
    return section("Stages per rank", table(headers, rows, id_="stage-table") + "\n" + note, "stages")


def timeline(data: JobData) -> str:
    if data.timeline is None:
        return section(
            "Timeline", paragraph("No timeline.json: run bin/sm-collect on the job dir."), "timeline"
        )
    t = data.timeline
    parts = []
    svg = timeline_svg(t)
    parts.append(tag("div", svg, class_="timeline") if svg else paragraph("No stage times to draw."))
    path = _dict(t.get("critical_path"))
    if path.get("text"):
        parts.append(tag("p", "<b>where the time went:</b> " + esc(path["text"])))
    segments = [s for s in _list(path.get("segments")) if isinstance(s, dict)]
    if segments:
        chain = " › ".join(
            f"r{s.get('rank')} {s.get('stage')} {seconds(s.get('start'))}-{seconds(s.get('end'))}"
            for s in segments
        )
        parts.append(tag("p", "<b>critical path:</b> " + esc(chain), class_="muted"))
    shares = [s for s in _list(path.get("shares")) if isinstance(s, dict)]
    if shares:
        parts.append(
            simple_table(
                ["stage", "seconds on the critical path", "share of the wall time", "mostly"],
                [
                    (
                        s.get("stage"),
                        seconds(s.get("seconds")),
                        f"{s['share'] * 100:.0f}%" if isinstance(s.get("share"), (int, float)) else "-",
                        s.get("dominant") or "",
                    )
                    for s in shares
                ],
                numeric=(1, 2),
            )
        )
    if t.get("approximate"):
        parts.append(
            paragraph(
                "Faded lanes come from status.json's stage seconds (no events file): "
                "their lengths are right, where they sit is a guess.",
                "muted",
            )
        )
    if len(_list(t.get("nodes"))) > MAX_PNG_LANES:
        parts.append(
            paragraph(
                f"More than {MAX_PNG_LANES} nodes: the picture shows the critical path only; "
                "timeline.txt and timeline.json hold every lane.",
                "muted",
            )
        )
    return section("Timeline", "\n".join(parts), "timeline")


def stragglers(data: JobData) -> str:
    from slurm_multi.results.stragglers import Straggler

    lines = []
    for item in _list(data.summary.get("stragglers")):
        try:
            lines.append(Straggler(**item).describe())  # the summary's own wording
        except (TypeError, ValueError):
            lines.append(str(item))
    if not lines:
        return section(
            "Stragglers",
            paragraph("None: no rank took much longer than the others in any stage."),
            "stragglers",
        )
    items = "\n".join(tag("li", esc(line), class_="straggler") for line in lines)
    return section(f"Stragglers: {len(lines)}", tag("ul", items), "stragglers")


def _diagnostics_order(name: str) -> tuple[int, str]:
    base = os.path.basename(name)
    return (FIRST_FILES.index(base) if base in FIRST_FILES else len(FIRST_FILES), base)


def hang(data: JobData) -> str:
    entries = hang_entries(data.summary)
    if not entries:
        return section("Hang", paragraph("No rank was stopped as hung."), "hang")
    rows = [
        [
            tag("td", esc(e["role"]), class_="bad" if e["role"] == "cause" else "warn"),
            cell(e.get("rank"), numeric=True),
            cell(e.get("node")),
            cell(e.get("state")),
            cell(e.get("detail")),
            cell(seconds(e.get("quiet_seconds")), numeric=True),
            cell(e.get("last_progress") or "-"),
            cell(e.get("detected") or "-"),
        ]
        for e in entries
    ]
    parts = [
        table(
            ["role", "rank", "node", "state", "detail", "quiet (s)", "last progress", "detected"],
            rows,
            id_="hang-table",
        )
    ]
    for entry in entries:
        names = sorted(
            (n for n in _list(entry.get("diagnostics")) if isinstance(n, str)), key=_diagnostics_order
        )
        if not names:
            continue
        parts.append(
            tag(
                "h3",
                esc(
                    f"{entry.get('node')} (rank {entry.get('rank')}), {entry['role']}: "
                    "what its diagnostics captured"
                ),
            )
        )
        for name in names:
            label = data.link(name) if data.present(name) else esc(name)
            if name not in data.diagnostics:
                parts.append(tag("p", label))
                continue
            opened = " open" if os.path.basename(name) in STACK_FILES else ""
            parts.append(
                f"<details{opened}><summary>{label}</summary>{preformatted(data.diagnostics[name])}</details>"
            )
    return section(
        "Hang: "
        + ", ".join(f"{e['role']} {e.get('node')} (rank {e.get('rank')})" for e in entries[:4])
        + (" ..." if len(entries) > 4 else ""),
        "\n".join(parts),
        "hang",
    )


def bad_nodes(data: JobData) -> str:
    bad = [b for b in _list(data.summary.get("bad_nodes")) if isinstance(b, dict)]
    attempts = [a for a in _list(data.summary.get("attempts")) if isinstance(a, dict)]
    parts = []
    if bad:
        parts.append(
            simple_table(
                ["node", "node index", "reason"],
                [(b.get("node"), b.get("rank"), b.get("reason")) for b in bad],
            )
        )
    else:
        parts.append(paragraph("No bad node: every node passed the fitness check (or it was off)."))
    if attempts:
        rows = []
        for a in attempts:
            where = _text(a.get("dir")).rstrip("/")
            target = f"{where}/summary.json" if where and data.present(f"{where}/summary.json") else where
            named = "; ".join(
                f"{b.get('node')}: {b.get('reason')}"
                for b in _list(a.get("bad_nodes"))
                if isinstance(b, dict)
            )
            rows.append(
                [
                    cell(a.get("attempt"), numeric=True),
                    cell(a.get("cause")),
                    cell(a.get("requeued_after_s"), numeric=True),
                    cell(a.get("at")),
                    cell(", ".join(str(x) for x in _list(a.get("excluded")))),
                    cell(named),
                    tag(
                        "td", data.link(target, f"{where}/") if where and data.present(where) else esc(where)
                    ),
                ]
            )
        parts.append(tag("h3", "Earlier attempts (this job was requeued)"))
        parts.append(
            table(
                ["attempt", "cause", "requeued after (s)", "at", "excluded", "bad nodes", "files"],
                rows,
                id_="attempts",
            )
        )
    return section("Bad nodes and earlier attempts", "\n".join(parts), "bad-nodes")


def _bytes(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        return "-"
    from slurm_multi.reports import human_bytes

    return human_bytes(value)


def profile(data: JobData) -> str:
    p = data.summary.get("profile")
    if not isinstance(p, dict):
        return section("Profile", paragraph("Not profiled."), "profile")
    complete = bool(p.get("complete"))
    head = (
        f"{p.get('type')}: {'complete' if complete else 'INCOMPLETE'}, "
        f"{p.get('reports')} of {p.get('expected')} "
        f"report(s), {_bytes(p.get('bytes'))}"
        + (" (--profile-optional: the verdict stands)" if p.get("optional") and not complete else "")
    )
    rows = []
    for r in (r for r in _list(p.get("ranks")) if isinstance(r, dict)):
        reports = r.get("report")
        shown = reports if isinstance(reports, list) else [reports] if reports else []
        links = " ".join(
            data.link(rel, text) if (rel := _inside(data, str(text))) and data.present(rel) else esc(text)
            for text in shown
        )
        rows.append(
            [
                cell(r.get("rank"), numeric=True),
                cell(r.get("node")),
                tag("td", links),
                cell(_bytes(r.get("bytes")), numeric=True),
                tag("td", "yes" if r.get("settled") else "no", class_="ok" if r.get("settled") else "bad"),
                cell(r.get("reason") or ""),
            ]
        )
    body = tag("p", esc(head), class_="ok" if complete else "bad") + "\n"
    body += paragraph(f"flush: {p.get('flush')}", "muted") + "\n" if p.get("flush") else ""
    body += table(["rank", "node", "report", "size", "complete", "why not"], rows, id_="profile-table")
    return section("Profile", body, "profile")


def world(data: JobData) -> str:
    w = data.summary.get("world")
    if not isinstance(w, dict):
        return section(
            "World size", paragraph("Not checked: the job asked for no multi-node world."), "world"
        )
    expected = w.get("expected")
    seen = _dict(w.get("seen"))
    silent = [str(s) for s in _list(w.get("silent"))]
    rows = [
        [cell(rank, numeric=True), cell(size, numeric=True, flagged=size != expected)]
        for rank, size in sorted(seen.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0)
    ]
    short = [rank for rank, size in seen.items() if size != expected]
    verdict = (
        f"{len(short)} rank(s) ran in a smaller world than the job's {expected}"
        if short
        else f"every rank that printed a world size saw {expected}"
    )
    body = tag("p", esc(verdict), class_="bad" if short else "ok")
    body += "\n" + table(["rank", "world size it printed"], rows)
    if silent:
        body += "\n" + paragraph(f"printed no world size: {', '.join(silent)}", "warn")
    return section("World size", body, "world")


def results(data: JobData) -> str:
    s = data.summary
    chosen = s.get("chosen_csv")
    candidates = [c for c in _list(s.get("candidates")) if isinstance(c, dict)]
    source = _text(s.get("source"))
    lines = [
        f"results CSV looked for: {s.get('results_csv') or 'none named'}",
        f"rows from: {dict(csv='the chosen CSV', log='performance: log lines').get(source, 'nowhere')}",
    ]
    parts = [paragraph(line) for line in lines]
    if candidates:
        rows = []
        for c in candidates:
            path = _text(c.get("path"))
            is_chosen = path == chosen
            rows.append(
                [
                    tag("td", "chosen" if is_chosen else "", class_="ok" if is_chosen else None),
                    tag("td", data.link(path) if data.present(path) else esc(path)),
                    cell(c.get("rows"), numeric=True),
                    cell(c.get("non_empty"), numeric=True),
                    tag("td", esc(c.get("error") or ""), class_="bad" if c.get("error") else None),
                ]
            )
        parts.append(
            table(["", "candidate", "rows", "rows with a performance value", "error"], rows, id_="candidates")
        )
        parts.append(
            paragraph(
                "The CSV with the most performance values wins, then the most rows, then the higher "
                "rank; a CSV with no value is never chosen.",
                "muted",
            )
        )
    metrics = _dict(s.get("log_metrics"))
    if metrics:
        rows = [
            (
                metric,
                m.get("rule"),
                m.get("value"),
                ", ".join(
                    f"r{v.get('rank')} {v.get('value')}"
                    for v in _list(m.get("values"))
                    if isinstance(v, dict)
                ),
            )
            for metric, m in ((k, _dict(v)) for k, v in metrics.items())
        ]
        parts.append(simple_table(["metric", "rule", "value", "per node"], rows, numeric=(2,)))
    return section("The chosen CSV", "\n".join(parts), "results")


def perf(data: JobData) -> str:
    if not data.perf_header:
        return section("Performance rows", paragraph("No perf.csv rows to show."), "perf")
    header, rows = data.perf_header, data.perf_rows
    always = ("model", "performance", "metric", "status")
    shown = [i for i, name in enumerate(header) if name in always or any(i < len(r) and r[i] for r in rows)]
    status = header.index("status") if "status" in header else None
    body = []
    for row in rows:
        failed = status is not None and status < len(row) and row[status] != "SUCCESS"
        body.append(
            [
                cell(
                    row[i] if i < len(row) else "",
                    numeric=header[i] == "performance",
                    flagged=failed and header[i] == "status",
                )
                for i in shown
            ]
        )
    text = tag("div", table([header[i] for i in shown], body, id_="perf-rows"), class_="wide")
    note = paragraph(
        f"{len(rows)} row(s); columns with no value are left out (perf.csv has them all).", "muted"
    )
    return section("Performance rows", text + "\n" + note, "perf")


def warnings(data: JobData) -> str:
    found = [_text(w) for w in _list(data.summary.get("warnings"))] + [f"page: {p}" for p in data.problems]
    if not found:
        return section("Warnings", paragraph("None."), "warnings")
    items = "\n".join(tag("li", esc(w)) for w in found)
    return section(f"Warnings: {len(found)}", tag("ul", items, class_="warn"), "warnings")


SECTIONS = (
    reasons,
    facts,
    stages_table,
    timeline,
    stragglers,
    hang,
    bad_nodes,
    profile,
    world,
    results,
    perf,
    warnings,
)


def job_page(data: JobData) -> str:
    """The whole page's HTML."""
    s = data.summary
    title = f"{s.get('verdict')}: job {s.get('job_id')} ({s.get('model')})"
    body = "\n".join([header(data), *(render(data) for render in SECTIONS)])
    return document(title, body)


def write_job_page(root: Path, out: Path | None = None) -> tuple[Path, JobData]:
    """Read JOBDIR's files and write the page (JOBDIR/report.html, or `out`); its path and what it
    showed."""
    from slurm_multi.report.jobdata import read_job
    from slurm_multi.report.page import write_page

    path = out if out is not None else root / REPORT
    data = read_job(root, path)
    write_page(path, job_page(data))
    return path, data


def section_names() -> Sequence[str]:
    """The sections' ids, in page order (the tests walk them)."""
    return (
        "verdict",
        "reasons-section",
        "facts",
        "stages",
        "timeline",
        "stragglers",
        "hang",
        "bad-nodes",
        "profile",
        "world",
        "results",
        "perf",
        "warnings",
    )
