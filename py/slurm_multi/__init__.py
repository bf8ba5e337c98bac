"""slurm-multi: node-side helpers for running one containerised job across SLURM nodes."""

__version__ = "0.1.0"

# Exit codes shared by every helper and entrypoint (documented in docs/architecture.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # runtime failure (or a FAILURE verdict)
EXIT_USAGE = 2  # bad command line or bad input file
EXIT_TIMEOUT = 3  # a wait ran out of time
