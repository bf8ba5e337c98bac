"""`python -m slurm_multi`: the helpers' entry point on a node (py/ on PYTHONPATH, no install).

A Python without click would die here with a traceback in the middle of a job; say instead, in one
line, which interpreter it is and how to point slurm-multi at a usable one.
"""

import sys

try:
    import click  # noqa: F401 - only checked here
except ImportError:
    import os

    line = (
        f"slurm-multi: helper interpreter {sys.executable} (Python {sys.version.split()[0]}) has no 'click' "
        "module; set SM_PYTHON to a Python that has it (e.g. the venv on shared storage: "
        "python3 -m venv $SM_HOME/.venv && $SM_HOME/.venv/bin/pip install -e $SM_HOME)"
    )
    sys.stderr.write(line + "\n")
    if os.environ.get("SM_ERROR_FILE"):
        from slurm_multi.shell import write_error_file

        write_error_file(os.environ["SM_ERROR_FILE"], line)
    sys.exit(2)

from slurm_multi.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
