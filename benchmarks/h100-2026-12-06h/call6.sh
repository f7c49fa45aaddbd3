# Same-call A/B, daemon at 160 ms x 5120 then 6144 (8 front ends): e67da1d (before this session's front-end and
# engine-thread savings) against HEAD, alternately: old, new, new, old.
. .carry/setup.sh > /dev/null
git worktree add -q /tmp/old e67da1d || exit 1
run() {  # tree name run
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 110 python3 scripts/bench_capacity.py --plan daemon:160:bf16:on --daemon-guess 8192 \
    --daemon-at 160=5120/6144 --daemon-cap-s 100 --seconds 8 --warmup-s 2 --workers 8 --client-procs 6 \
    --daemon-args "--batch-wait-ms=2 --admission=max_streams" --budget-s 100 --out $OUT/ab-$2-$3.json > $OUT/ab-$2-$3.log 2>&1)
  echo "== $2 (run $3)"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |clients:" $OUT/ab-$2-$3.log | cut -c1-150
  mv $OUT/daemon-160ms-bf16.log $OUT/daemon-$2-$3.log 2>/dev/null || mv $1/daemon-160ms-bf16.log $OUT/daemon-$2-$3.log 2>/dev/null
}
run /tmp/old old 1; run $PWD new 1; run $PWD new 2; run /tmp/old old 2
xz -9 $OUT/*.log; true
