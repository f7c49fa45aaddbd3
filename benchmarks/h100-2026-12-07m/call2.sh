# H100 call 2: the daemon at 9216 x 160 ms, 12 front ends: this tree vs a384ee1 (.carry/old), alternately;
# then, if time is left, the engine item at 10240 x 160 ms (the feed on the engine thread alone).
# .carry/old: `mkdir -p .carry/old && git archive a384ee1 streamd scripts | tar -x -C .carry/old` (the weights in assets/ are not needed).
. .carry/setup.sh > /dev/null
D='--plan daemon:160:bf16:on --daemon-at 160=9216 --workers 12 --client-procs 6 --seconds 8 --warmup-s 2 --daemon-cap-s 110 --budget-s 120'
for r in 1 2; do for v in new old; do
  [ $SECONDS -gt 120 ] && break
  if [ $v = old ]; then dir=.carry/old; else dir=.; fi
  (cd $dir && PYTHONPATH=/tmp/site:$PWD timeout 130 python3 scripts/bench_capacity.py $D --daemon-args "--batch-wait-ms=2 --admission=max_streams" --out $OUT/d160-9216-$v-$r.json > $OUT/d160-9216-$v-$r.log 2>&1)
  echo "$v $r: $(grep -E '^ +9216 ' $OUT/d160-9216-$v-$r.log | head -1)"; grep -E "clients:|audio messages" $OUT/d160-9216-$v-$r.log | sed "s/^/$v $r: /"
  mv $OUT/daemon-160ms-bf16.log $OUT/daemon-$v-$r.log 2>/dev/null
done; done
[ $SECONDS -lt 150 ] && timeout 80 python3 scripts/bench_capacity.py --plan engine:160:bf16:on --engine-start 10240 --engine-max 10240 --engine-refine 0 --engine-cap-s 55 --budget-s 60 --workers 12 --out $OUT/e160-10240.json 2>&1 | grep -E "^  engine|Error|pipelined step"
for f in $OUT/*.log; do xz -f $f; done; echo "took $SECONDS s"
