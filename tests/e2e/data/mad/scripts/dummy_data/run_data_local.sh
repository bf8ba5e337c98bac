#!/bin/bash
# A model whose data comes from a local data provider (the shape of madengine's
# run_data_local.sh, written here): it fails unless MAD_DATAHOME is a read-only mount with the data.
mounted=$(mount | grep " ${MAD_DATAHOME} ")
if [ -z "${mounted}" ]; then
  echo "${MAD_DATAHOME} is NOT mounted"
  exit 1
fi
echo "data: ${MAD_DATANAME} at ${MAD_DATAHOME}: ${mounted}"
cat "${MAD_DATAHOME}/sample.txt" || exit 1
if touch "${MAD_DATAHOME}/written" 2>/dev/null; then
  echo "data: ${MAD_DATAHOME} is writable" >&2
  exit 1
fi
echo "performance: 100 samples_per_second"
