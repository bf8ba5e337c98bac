# shellcheck shell=bash
# Settings: every option of sbatch/multi.sbatch is also an SM_* environment variable; madengine's
# names are accepted as aliases. The one table (option, variable, aliases, default, type, validation,
# help) is Python's: py/slurm_multi/settings.py. The batch step's job plan parses its argv against it
# and exports every resolved value to the nodes; bash defines no default of its own.

# settings::resolve_env: a stage run by hand (bin/sm-node outside a batch step): the environment
# resolved against the table (defaults, aliases), validated, exported. A no-op when the batch step
# (or a job.json re-run) has already resolved them.
settings::resolve_env() {
  [[ ${SM_SETTINGS_RESOLVED:-0} != 1 ]] || return 0
  local file rc=0
  file=$(mktemp "${TMPDIR:-/tmp}/sm-settings.XXXXXX") || return 2
  util::sm settings env "${file}" || rc=$?
  ((rc == 0)) && util::source "${file}"
  rm -f "${file}"
  return "${rc}"
}

settings::truthy() { [[ ${1,,} == true || $1 == 1 || ${1,,} == yes ]]; }
