#!/bin/bash
# The model of the tools job: it prints its arguments as bash gave them ($VAR expanded inside the
# container, as under madengine), the tools' variables, what it sees of ../scripts/common, and a
# performance line.
echo "model: args [$*] rank ${NODE_RANK}/${NNODES}"
echo "model: SM_TEST_TOOL_A=${SM_TEST_TOOL_A:-unset} SM_TEST_TOOL_B=${SM_TEST_TOOL_B:-unset}"
[ -f ../scripts/common/tools.json ] && echo "model: ../scripts/common/tools.json is there"
echo "performance: 4${NODE_RANK}.5 samples_per_second"
