# Session 33, call 2: CUDA tests (the kernel reading slot rings in place), the subsampling micro,
# then the engine at 160 ms: base (3b8b7d4, .carry/base) vs new (working tree), alternately, twice.
. .carry/setup.sh > /dev/null
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/model tests/engine 2>&1 | grep -E "passed|failed|Error|error" | tail -8
timeout 100 python3 .carry/sub/micro.py 2>&1 | grep -v -i warn | head -60
run() { # arm chunk level tag
  dir=$PWD; [ $1 = base ] && dir=$PWD/.carry/base
  timeout 75 python3 $dir/scripts/bench_capacity.py --plan engine:$2:bf16:on --engine-start $3 --engine-max $3 --engine-refine 0 --engine-cap-s 55 --budget-s 60 --out $OUT/e$2-$1-$3-$4.json 2>&1 | grep -E "^  engine" | sed "s/^/$1 $3: /"
}
run base 160 8192 1; run new 160 8192 1; run base 160 8192 2; run new 160 8192 2
run new 160 9728 1
