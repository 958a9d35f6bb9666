#!/bin/bash
# A/B: before (f391491, before the long-hold claim work) and after (HEAD), alternately.
set -u
PY=/work/main/.venv/bin/python
DSN=postgresql://postgres@127.0.0.1:5432/test
OUT=/tmp/ab/out; mkdir -p $OUT
. /tmp/ab/gate.sh
for bench in drain steady fairness parked; do
  for round in 1 2; do
    for side in before after; do
      gate
      cd /tmp/ab/$side
      start=$(date +%s)
      case $bench in
        drain) PYTHONPATH=/tmp/ab/$side $PY -m bench throughput --dsn $DSN --systems pgqueue --workloads drain --runs 3 --out $OUT/$side-drain-$round ;;
        steady) PYTHONPATH=/tmp/ab/$side $PY -m bench steady --dsn $DSN --systems pgqueue --producers 16 --rates 1000,2000 --seconds 30 --rounds 1 --out $OUT/$side-steady-$round ;;
        fairness) PYTHONPATH=/tmp/ab/$side $PY -m bench fairness --dsn $DSN --out $OUT/$side-fairness-$round ;;
        parked) PYTHONPATH=/tmp/ab/$side $PY -m bench durable --dsn $DSN --parts parked --out $OUT/$side-parked-$round ;;
      esac > $OUT/$side-$bench-$round.log 2>&1
      echo "$round $side $bench rc=$? $(( $(date +%s) - start ))s" >> $OUT/progress
    done
  done
done
