"""`slurm-multi report`: the pages a person reads, one per job and one across runs.

- page        the pieces of a self-contained HTML page (style inline, no script, relative links)
- jobdata     what a job page shows, read from what collect wrote (summary.json, timeline.json, ...)
- jobpage     JOBDIR/report.html: the verdict, every reason, the stages, the timeline, the hang, ...
- timelinesvg the job's timeline as inline SVG (no matplotlib: the batch step draws it)
- history     a shared perf.csv's runs per configuration, regressions, node stage times (pandas)
- historypage the history page, its plots (matplotlib)
- commands    the click command (`cli`)

docs/report.md says what the pages show.
"""
