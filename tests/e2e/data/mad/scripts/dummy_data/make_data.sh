#!/bin/bash
# A custom data provider's script (madengine runs it in MAD_DATAHOME: `cd <home>; bash <path> <args>`):
# it makes $1 sample files where it runs.
for i in $(seq 1 "${1:-1}"); do echo "sample ${i}" >"sample_${i}.txt"; done
echo "make_data: ${1:-1} samples in $(pwd)"
