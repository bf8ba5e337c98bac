"""Turn what the nodes left in a job directory into one trustworthy result.

`results pick` chooses the per-node multiple-results CSV with the most performance values;
`results collect` judges the whole job (node exits, error patterns in the logs, the chosen CSV or
the `performance: <value> <metric>` log lines) and writes JOBDIR/perf.csv (madengine's header
order), JOBDIR/summary.json and the timeline (timeline.json, .txt, .png), and with --perf-csv
appends the rows to a shared madengine perf.csv.

One module per concern (docs/results.md has the rules):

- values      what counts as a performance value (a finite number) and how numbers are written
- pick        reading, scoring and choosing the per-node CSVs
- logscan     error patterns and tracebacks in node.log
- logmetrics  the `performance: <value> <metric>` fallback and how metrics combine across nodes
- jobdir      job.json, the node directories and each node's judgement (the manifest fallback)
- hangs       the hang watch's progress.json and hang.json: which rank stopped first, who waited
- stragglers  per stage, the rank much slower than the others (information, never a failure)
- timeline    every node's events (events.log) as lanes, the critical path and where the time went
- timelinedraw  timeline.json, timeline.txt and (with matplotlib) timeline.png
- rows        perf.csv rows in madengine's columns
- collect     the whole job: candidates, aggregate, verdict -> Summary
- summary     Summary, JOBDIR/perf.csv, summary.json and the stderr table
- perfcsv     appending to a shared perf.csv under a lock, relative_change
- commands    the click group (`cli`): `results pick`, `results collect` (run_collect: the batch
              step runs it after every job) and `results mad-outputs`

perfcsv (only with --perf-csv) is imported where it is used.
"""

from __future__ import annotations

from slurm_multi.results.collect import collect
from slurm_multi.results.logmetrics import combine_metric, parse_perf_lines
from slurm_multi.results.logscan import scan_log_errors
from slurm_multi.results.pick import pick_best, score_csv
from slurm_multi.results.rows import PERF_COLUMNS
from slurm_multi.results.summary import Summary

__all__ = [
    "PERF_COLUMNS",
    "Summary",
    "collect",
    "combine_metric",
    "parse_perf_lines",
    "pick_best",
    "scan_log_errors",
    "score_csv",
]
