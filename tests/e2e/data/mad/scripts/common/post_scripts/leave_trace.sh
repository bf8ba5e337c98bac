#!/bin/bash
# What a profiler's post-script does (madengine's trace.sh copies rocprof_output to the workspace):
# leave a tool output in the run directory and one in the workspace above it.
mkdir -p rocprof_output
echo "trace of $(hostname)" >rocprof_output/results.csv
echo "env of $(hostname)" >../dummy_tools_env.csv
echo "post_script B left rocprof_output/ and ../dummy_tools_env.csv"
