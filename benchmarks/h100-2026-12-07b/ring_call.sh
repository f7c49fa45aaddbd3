# Engine alone at 160 ms, one level, pipelined and synchronised: mapped ring reads (main) vs copies.
. .carry/setup.sh > /dev/null
for arm in copy mapped copy mapped; do pp=/tmp/site:$PWD; [ $arm = copy ] && pp=$PWD/.carry/ring/site:$pp
  PYTHONPATH=$pp timeout 70 python3 scripts/bench_capacity.py --plan engine:160:bf16:on --engine-start ${LEVEL:-8192} --engine-max ${LEVEL:-8192} --engine-refine 0 --engine-cap-s 55 --budget-s 60 --out $OUT/ring-$arm.json 2>&1 | grep -E "^  engine" | sed "s/^/$arm: /"
done
