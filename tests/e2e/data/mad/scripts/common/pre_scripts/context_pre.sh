#!/bin/bash
# The context's own pre-script: runs after the tools' pre-scripts, in the run directory.
echo "context pre-script: $* (tool A says: ${SM_TEST_TOOL_A:-unset})"
