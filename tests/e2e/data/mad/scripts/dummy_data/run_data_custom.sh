#!/bin/bash
# A model whose data a custom provider made before it ran: MAD_DATAHOME holds the samples.
count=$(ls "${MAD_DATAHOME}" | grep -c '^sample_')
echo "data: ${MAD_DATANAME} at ${MAD_DATAHOME}: ${count} samples"
[ "${count}" -eq 3 ] || exit 1
echo "performance: ${count} samples_per_second"
