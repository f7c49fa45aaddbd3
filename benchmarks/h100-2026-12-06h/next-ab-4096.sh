# Same-call A/B at a level both pass (4096 x 160 ms, 8 front ends): front-end and engine CPU, e67da1d vs HEAD, old/new/new/old.
. .carry/setup.sh > /dev/null
git worktree add -q /tmp/old e67da1d || exit 1
run() {  # tree name run
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 62 python3 scripts/bench_capacity.py --plan daemon:160:bf16:on --daemon-guess 8192 \
    --daemon-at 160=4096 --daemon-cap-s 55 --seconds 8 --warmup-s 2 --workers 8 --client-procs 6 \
    --daemon-args "--batch-wait-ms=2 --admission=max_streams" --budget-s 55 --out $OUT/ab-$2-$3.json > $OUT/ab-$2-$3.log 2>&1)
  echo "== $2 (run $3)"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |clients:" $OUT/ab-$2-$3.log | cut -c1-150
  grep -E "front end [0-9]+:" $OUT/daemon-160ms-bf16.log | tail -8 | cut -c60- | sort | head -3
  rm -f $OUT/daemon-160ms-bf16.log $OUT/ab-$2-$3.log
}
run /tmp/old old 1; run $PWD new 1; run $PWD new 2; run /tmp/old old 2
