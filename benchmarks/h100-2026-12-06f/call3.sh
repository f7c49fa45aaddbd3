# Same call A/B: the daemon at 160 ms x 4096 and 1120 ms x 7056 as the first level, 06d's tree (f47be50) against HEAD, alternately.
. .carry/setup.sh > /dev/null
git worktree add -q /tmp/old f47be50 || exit 1
run() {  # tree name chunk streams
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 80 python3 scripts/bench_capacity.py --plan daemon:$3:bf16:on --daemon-at $3=$4 \
    --daemon-cap-s 70 --seconds 8 --warmup-s 2 --workers 8 --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" \
    --budget-s 70 --out $OUT/ab-$2-$3-$4-$5.json > $OUT/ab-$2-$3-$4-$5.log 2>&1)
  echo "$2 $3 x $4 (run $5): $(grep -E '^ +[0-9]+ +[0-9]+ +[0-9.]+ ' $OUT/ab-$2-$3-$4-$5.log | head -1)"
}
run /tmp/old old 160 4096 1; run $PWD new 160 4096 1; run $PWD new 160 4096 2; run /tmp/old old 160 4096 2
run /tmp/old old 1120 7056 1; run $PWD new 1120 7056 1
xz -9 $OUT/*.log; true
