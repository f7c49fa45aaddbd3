# Same call A/B: old (3bff8d1's engine/app files over the tree) vs main vs gc thresholds, daemon 160 ms at LEVELS.
rm -rf /tmp/old; mkdir -p /tmp/old && tar --exclude=./.git -cf - . | tar -C /tmp/old -xf - && cp -r .carry/old/streamd/. /tmp/old/streamd/
run() {  # arm tag
  local t=$PWD pp=/tmp/site:$PWD gc=
  local w=8; case $1 in w12) w=12 ;; esac
  case $1 in old) t=/tmp/old; pp=/tmp/site:/tmp/old ;; gc) pp=$PWD/.carry/gcsite:/tmp/site:$PWD; gc=${GC_T:-50000,20,100} ;; esac
  (cd $t && GC_THRESHOLDS=$gc PYTHONPATH=$pp timeout ${ARM_S:-100} python3 scripts/bench_capacity.py --plan daemon:160:bf16:on \
    --daemon-guess 8192 --daemon-at 160=${LEVELS:-5120} --daemon-cap-s $(( ${ARM_S:-100} - 15 )) --seconds 8 --warmup-s 2 \
    --workers $w --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" \
    --budget-s $(( ${ARM_S:-100} - 10 )) --out $OUT/$1$2.json > $OUT/$1$2.log 2>&1)
  mv $t/daemon-160ms-bf16.log $OUT/$1$2-daemon.log 2>/dev/null || mv $OUT/daemon-160ms-bf16.log $OUT/$1$2-daemon.log 2>/dev/null
  echo "== $1$2"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |clients:|Traceback|Error" $OUT/$1$2.log | cut -c1-150
  grep -E "garbage collector" $OUT/$1$2-daemon.log | tail -3 | grep -oE "[0-9]+ streams.{0,95}|garbage collector held it.*" | cut -c1-110
}
n=0; for a in ${ARMS:-old main gc}; do n=$((n+1)); run $a -$n; done
tar -cJf $OUT/b.tar.xz -C $OUT $(cd $OUT; ls *.log *.json); rm -f $OUT/*.log $OUT/*-?.json; true
