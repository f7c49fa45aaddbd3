# H100: daemon 160 ms at LEVELS per arm (ARMS: w12 sw12 w16 ...), the front ends' load lines beside.
spy() {  # py-spy (idle samples too) of 3 front ends' threads from SPY_AT s for SPY_S s: where a late loop waits
  sleep ${SPY_AT:-35}
  d=$(pgrep -f "streamd serve" | head -1)
  for p in $(pgrep -P "$d" -f multiprocessing-fork | head -3); do
    timeout $(( ${SPY_S:-20} + 10 )) /tmp/site/bin/py-spy record --idle --threads -r 50 -d ${SPY_S:-20} -f raw -p $p -o $OUT/$1-spy-$p.txt > /dev/null 2>&1 &
  done; wait
}
run() {  # arm tag: wN (N front ends), swN (the same, GIL switch interval SW_S in the front ends)
  local w=${1#w} pp=/tmp/site:$PWD sw= t=$PWD
  case $1 in old*) w=${1#old}; rm -rf /tmp/old; mkdir -p /tmp/old; tar --exclude=./.git -cf - . | tar -C /tmp/old -xf -; cp -r .carry/old/streamd/. /tmp/old/streamd/; pp=/tmp/site:/tmp/old; t=/tmp/old ;; esac
  case $1 in sw*) w=${1#sw}; pp=$PWD/.carry/swsite:/tmp/site:$PWD; sw=${SW_S:-0.0005} ;; esac
  spy $1$2 &
  (cd $t && SWITCH_INTERVAL_S=$sw PYTHONPATH=$pp timeout ${ARM_S:-100} python3 scripts/bench_capacity.py --plan daemon:160:bf16:on \
    --daemon-guess 8192 --daemon-at 160=${LEVELS:-6144} --daemon-cap-s $(( ${ARM_S:-100} - 15 )) --seconds 8 --warmup-s 2 \
    --workers $w --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" \
    --budget-s $(( ${ARM_S:-100} - 10 )) --out $OUT/$1$2.json > $OUT/$1$2.log 2>&1)
  mv $t/daemon-160ms-bf16.log $OUT/$1$2-daemon.log 2>/dev/null || mv $OUT/daemon-160ms-bf16.log $OUT/$1$2-daemon.log 2>/dev/null
  echo "== $1$2"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |clients:|Traceback|Error" $OUT/$1$2.log | cut -c1-150
  grep -E "front end [0-9]+:" $OUT/$1$2-daemon.log | tail -4 | grep -oE "[0-9]+ streams.{0,110}" | cut -c1-120
}
n=0; for a in ${ARMS:-w12 w16}; do n=$((n+1)); run $a -$n; done
tar -cJf $OUT/b.tar.xz -C $OUT $(cd $OUT; ls *.log *.json *.txt 2>/dev/null); rm -f $OUT/*.log $OUT/*-?.json $OUT/*-spy-*.txt; true
