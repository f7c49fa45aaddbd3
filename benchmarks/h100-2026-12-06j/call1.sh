# #29 item 2 on an H100: why the daemon's steps stay small at 160 ms. Arms (ARMS, in order), each a
# `bench_capacity.py --plan daemon:160:bf16:on` at LEVELS (default 5120/6144), 8 front ends, 6 client procs:
#   main    the working tree
#   gc      the same, every process's collector thresholds GC_T (default 50000,20,100) (.carry/gcsite)
#   nopipe  the engine's pipelined launch off (a copy of the tree, `_pipelining` -> False)
#   wait10  --batch-wait-ms=10 in place of 2
rm -rf /tmp/nopipe; mkdir -p /tmp/nopipe && tar --exclude=./.git -cf - . | tar -C /tmp/nopipe -xf -
sed -i 's/return self.recognizer.model.device.type == "cuda"/return False/' /tmp/nopipe/streamd/engine/engine.py
grep -c "return False" /tmp/nopipe/streamd/engine/engine.py > /dev/null || exit 1
run() {  # arm
  local t=$PWD pp=/tmp/site:$PWD wait=2 gc=
  case $1 in nopipe) t=/tmp/nopipe; pp=/tmp/site:/tmp/nopipe ;; wait10) wait=10 ;;
    gc*) pp=$PWD/.carry/gcsite:/tmp/site:$PWD; gc=${GC_T:-50000,20,100} ;; esac
  (cd $t && GC_THRESHOLDS=$gc PYTHONPATH=$pp timeout ${ARM_S:-130} python3 scripts/bench_capacity.py --plan daemon:160:bf16:on \
    --daemon-guess 8192 --daemon-at 160=${LEVELS:-5120/6144} --daemon-cap-s $(( ${ARM_S:-130} - 15 )) --seconds 8 --warmup-s 2 \
    --workers 8 --client-procs 6 --daemon-args "--batch-wait-ms=$wait --admission=max_streams" \
    --budget-s $(( ${ARM_S:-130} - 10 )) --out $OUT/$1$2.json > $OUT/$1$2.log 2>&1)
  mv $t/daemon-160ms-bf16.log $OUT/$1$2-daemon.log 2>/dev/null || mv $OUT/daemon-160ms-bf16.log $OUT/$1$2-daemon.log 2>/dev/null
  echo "== $1$2"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |clients:|Traceback|Error" $OUT/$1$2.log | cut -c1-150
  grep -E "steps in|GPU worked" $OUT/$1$2-daemon.log | cut -c60-230 | tail -4
  grep -E "garbage collector" $OUT/$1$2-daemon.log | tail -8 | grep -oE "event loop.{0,60}|garbage collector held it.*" | cut -c1-130
}
n=0; for a in ${ARMS:-main gc nopipe wait10}; do n=$((n+1)); run $a -$n; done
xz -9 $OUT/*.log; true
