# #29 at 160 ms: a GPU step reads its rows' segments from the pinned rings themselves (MAPPED_RINGS, working tree)
# against HEAD's copies (a slot range of whole rings, or a host-gathered batch). CUDA tests first; then per arm the live
# item 6144 and the daemon 4096/5120/6144 at 160 ms, ORDER="new old" (or "old new").
. .carry/setup.sh > /dev/null
[ "${TESTS_S:-120}" = 0 ] || timeout ${TESTS_S:-120} python3 -m pytest -q -m cuda -p no:cacheprovider tests/engine/test_streaming.py tests/engine/test_migration_cuda.py \
  > $OUT/cuda-tests.txt 2>&1; tail -3 $OUT/cuda-tests.txt
[ -d /tmp/old ] || git worktree add -q --detach /tmp/old main || exit 1
run() {  # new: the working tree; old: HEAD
  t=$PWD; [ $1 = old ] && t=/tmp/old
  (cd $t && PYTHONPATH=/tmp/site:$t timeout ${ARM_S:-200} python3 scripts/bench_capacity.py --plan ${PLAN:-live:160:bf16:on,daemon:160:bf16:on} \
    --daemon-guess 8192 --live-at 160=6144 --daemon-at 160=4096/5120/6144 --live-s 10 --live-cap-s 60 --daemon-cap-s 130 \
    --seconds 8 --warmup-s 2 --workers 8 --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" \
    --budget-s $(( ${ARM_S:-200} - 10 )) --out $OUT/$1.json > $OUT/$1.log 2>&1)
  echo "== $1"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |clients:|rings cannot" $OUT/$1.log | cut -c1-150
  grep -E "steps in|GPU worked|rings cannot" $OUT/daemon-160ms-bf16.log | cut -c60- | tail -8; mv $OUT/daemon-160ms-bf16.log $OUT/$1-daemon.log
}
for n in ${ORDER:-new old}; do run $n; done
xz -9 $OUT/*.log; true
