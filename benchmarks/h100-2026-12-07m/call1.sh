# H100: the engine item's feed, new (a gather thread a step ahead) vs old (the engine thread gathers), 10240 x 160 ms, alternately twice; then the daemon at 9216.
. .carry/setup.sh > /dev/null
cp .carry/bench_capacity_old.py scripts/bench_capacity_old.py
for r in 1 2; do for v in new old; do s=scripts/bench_capacity.py; [ $v = old ] && s=scripts/bench_capacity_old.py
  timeout 80 python3 $s --plan engine:160:bf16:on --engine-start 10240 --engine-max 10240 --engine-refine 0 --engine-cap-s 55 --budget-s 60 --workers 8 --out $OUT/e160-10240-$v-$r.json 2>&1 | grep -E "^  engine|Error|pipelined step" | sed "s/^/$v $r: /"; done; done
[ $SECONDS -lt 330 ] && { timeout 200 python3 scripts/bench_capacity.py --plan daemon:160:bf16:on --daemon-at 160=9216 --workers 12 --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" --seconds 8 --warmup-s 2 --daemon-cap-s 170 --budget-s 180 --out $OUT/d160-9216.json > $OUT/d160-9216.log 2>&1; echo "daemon rc $?"; grep -E "daemon|Error" $OUT/d160-9216.log | tail -8 | cut -c1-300; xz -f $OUT/d160-9216.log; }
echo "took $SECONDS s"
