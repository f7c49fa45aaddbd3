# Kernel v2 (tl.dot + tl.gather): CUDA tests, one layer's micro-benchmark, the engine at 160 ms (x2 each arm) and 1120 ms.
. .carry/setup.sh > /dev/null
timeout 170 python3 -m pytest -q -m cuda -p no:cacheprovider tests/model tests/engine 2>&1 | grep -v -i warn | tail -6
timeout 60 python3 .carry/kernel/micro.py 2>&1 | grep -v -i warn
run() { # arm chunk level
  pp=/tmp/site:$PWD; [ $1 = ref ] && pp=$PWD/.carry/kernel/site:$pp
  PYTHONPATH=$pp timeout 75 python3 scripts/bench_capacity.py --plan engine:$2:bf16:on --engine-start $3 --engine-max $3 --engine-refine 0 --engine-cap-s 55 --budget-s 60 --out $OUT/k$2-$1-$4.json 2>&1 | grep -E "^  engine" | sed "s/^/$1: /"
}
run ref 160 8192 1; run kernel 160 8192 1; run ref 160 8192 2; run kernel 160 8192 2
[ -n "${WITH_1120:-}" ] && { run ref 1120 12288 1; run kernel 1120 12288 1; }
