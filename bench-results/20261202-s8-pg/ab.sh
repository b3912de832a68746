#!/bin/bash
# usage: ab.sh TAG BIN_A BIN_B  — 3 interleaved rounds (A B, B A, A B)
tag=$1; A=$2; B=$3
cd /work/wt-pg2
for r in 1 2 3; do
  if [ $r = 2 ]; then order="B A"; else order="A B"; fi
  for w in $order; do
    if [ $w = A ]; then bin=$A; else bin=$B; fi
    echo "$(date -u +%T) round $r $w load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/pg2/$tag.log
    bash scripts/with-postgres.sh sh -c "$bin bench --backend postgres --postgres-url \"\$TALLY_TEST_PG_URL\" --quick --json --profile" > /tmp/pg2/$tag-$r-$w.json 2> /tmp/pg2/$tag-$r-$w.err
  done
done
echo "$(date -u +%T) done load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/pg2/$tag.log
