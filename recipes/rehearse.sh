#!/usr/bin/env bash
# Rehearse a session's warm chain of training calls on this CPU machine (a few minutes) before
# spending device time on it: a copy of the tree whose .carry holds the first ROWS rows of each
# pack named (`carried shrink`), then `run_gpu.sh train` as the first call (the packs of CALL1)
# and as a warm second call on the same WORK (the packs of CALL2 added), 2 and 4 steps on the CPU.
# Prints each call's log lines about the packs and the training manifest; fails as a call would,
# or when a pack carried did not unpack.
#
#   bash recipes/rehearse.sh "real kokoro" "kokoro2 kokoro3"      (python3: ./dev's .venv if there is one)
#   TRAIN_ARGS="--deepen 16" bash recipes/rehearse.sh "real kokoro" "kokoro2"   (more train.py flags)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python3 ] && export PATH="$PWD/.venv/bin:$PATH"
ROWS=${ROWS:-6}
R=$(mktemp -d /tmp/streamd-rehearse.XXXXXX)
mkdir -p "$R/repo/.carry"
git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null \
    | tar -xf - -C "$R/repo"  # the tree as .ci/run copies it
call() {  # call N PACKS MAX_STEPS
    for p in $2; do python3 -m recipes.synthetic.carried shrink --pack ".carry/$p.tar.xz" \
        --out "$R/repo/.carry/$p.tar.xz" --rows "$ROWS" >/dev/null; done
    (cd "$R/repo" && OUT=$R/out$1 WORK=$R/work DEVICE=cpu INIT_FROM=streamd/assets/default-model.pt \
        KOKORO_REPEAT=1 REAL_REPEAT=1 TRAIN_ARGS="--eval-minutes 100 ${TRAIN_ARGS:-}" \
        bash recipes/run_gpu.sh train 4 "$3" >"$R/call$1.out" 2>&1) ||
        { tail -30 "$R/call$1.out"; echo "rehearsal: call $1 FAILED ($R)"; exit 1; }
    for p in $2; do  # every pack carried must have unpacked (run_gpu.sh goes on without one that did not)
        grep -q "$p unpack: rc 0" "$R/out$1/run.log" || { grep "$p" "$R/out$1/run.log"; tail -5 "$R/work/$p.err";
            echo "rehearsal: call $1 did not unpack $p ($R)"; exit 1; }
    done
    echo "call $1:"
    grep -E "unpack|reusing|without|WARNING|training manifest|resuming|starting from" "$R/out$1/run.log" | cut -c1-240
}
call 1 "$1" 2
call 2 "$2" 4
rm -rf "$R"
echo "rehearsal: both calls ran"
