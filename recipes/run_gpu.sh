#!/usr/bin/env bash
# One GPU-machine call (at most 10 minutes), from the repository root:
#
#   bash recipes/run_gpu.sh train [BUDGET_MIN [MAX_STEPS]]   synthesise train + dev, train, save
#   bash recipes/run_gpu.sh eval  [BUDGET_MIN]               synthesise eval sets, evaluate
#
# Carried in: .carry/tts/root.tar.xz (or, for train, the smaller .carry/tts/root-lean.tar.xz of
# `gpu_carry.sh prepare`: no festival, no reserved flite voice) and the text (.carry/text.tar.xz or .carry/text/*.txt) for
# the classic engines (a train call without them trains on the other sets, and a warm machine
# reuses what an earlier call synthesised), .carry/real.tar.xz (the real-speech corpus,
# gpu_carry.sh real: its train split joins every call's training set REAL_REPEAT times, and its
# dev split then picks the checkpoints) with .carry/sndlib.tar.xz (libsndfile, to decode it
# without the engines), and for train .carry/ckpt/{summary.json,last.pt.000,...} (absent on the
# first call), optionally
# .carry/kokoro.tar.xz (Kokoro speech made on the CPU machine: recipes/synthetic/carried.py; a warm
# call adds .carry/kokoro2.tar.xz.. beside what the earlier calls unpacked) and
# .carry/pico.tar.xz (SVOX Pico, synthesised here: recipes/synthetic/pico.py),
# .carry/classic.tar.xz (the classic engines' speech made on the CPU machine), for eval
# optionally .carry/kokoro-eval.tar.xz (the reserved Kokoro voices, made on the CPU machine), and
# .carry/ckpt/default-model.pt (whole or .000 parts). Everything comes back in $OUT (at most 8
# files of <= 16 MiB): run.log, summary.json, last.pt.000.. and, when the dev WER improved on the
# best so far, default-model.pt.000..; eval writes eval.md and eval.json.
# BUDGET_MIN (default 9.2) is the wall clock this script may use; training gets what is left
# after synthesis minus a margin. The same seeds every call: the data are the same every call
# (SYNTH_SEED, default 0, picks the classic engines' and Pico's training sentences and voices: a new one a
# session gives the model sentences it has not heard).
# Knobs (environment): N_TRAIN=40000 N_DEV=1000 N_EVAL=640 WORKERS=16 DEVICE=cuda TRAIN_ARGS=...
# SYNTH_ENGINES=espeak-ng,espeak,flite (the engines to synthesise with; default: all carried)
# N_PICO=4000 N_PICO_DEV=200 KOKORO_REPEAT=5 (each carried Kokoro training utterance appears that
# many times in the training manifest; its dev set once) REAL_REPEAT=4.
# INIT_FROM=MODEL.pt (start from a model's weights, e.g. streamd/assets/default-model.pt, when
# there is no saved state). A warm machine keeps the state in $WORK/ckpt: a next call resumes
# from it without carrying last.pt.
set -uo pipefail
MODE=${1:-train}
BUDGET_MIN=${2:-9.2}
MAX_STEPS=${3:-6000}
T0=$(date +%s)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.out/run}
WORK=${WORK:-/tmp/streamd-run}
N_TRAIN=${N_TRAIN:-40000}
SYNTH_SEED=${SYNTH_SEED:-0}
N_DEV=${N_DEV:-1000}
N_EVAL=${N_EVAL:-640}
WORKERS=${WORKERS:-16}
DEVICE=${DEVICE:-cuda}
N_PICO=${N_PICO:-4000}
N_PICO_DEV=${N_PICO_DEV:-200}
KOKORO_REPEAT=${KOKORO_REPEAT:-5}
REAL_REPEAT=${REAL_REPEAT:-4}
CKPT=.carry/ckpt
mkdir -p "$OUT" "$WORK"
LOG=$OUT/run.log

log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
die() { log "FAILED: $*"; exit 1; }

# -- unpack the carried engines, text and libraries ---------------------------------------------
HAVE_TTS=0
TTS_PACK=.carry/tts/root.tar.xz
[ -f $TTS_PACK ] || [ "$MODE" != train ] || TTS_PACK=.carry/tts/root-lean.tar.xz
if [ -f $TTS_PACK ]; then
    tar -xJf $TTS_PACK -C .carry/tts || die "unpacking the TTS engines"
    if [ -f .carry/text.tar.xz ]; then tar -xJf .carry/text.tar.xz -C .carry || die "unpacking the text"; fi
    for f in train dev eval; do [ -s .carry/text/$f.txt ] || die "no .carry/text/$f.txt"; done
    HAVE_TTS=1
fi
[ $HAVE_TTS = 1 ] || [ "$MODE" = train ] || die "no .carry/tts/root.tar.xz (an eval call synthesises its sets: carry it)"
if [ -f .carry/pico.tar.xz ]; then tar -xJf .carry/pico.tar.xz -C .carry || die "unpacking pico"; fi
# libsndfile for decoding carried Opus: the engines' own, else the small carried bundle
SNDLIB=$PWD/.carry/tts/root/usr/lib/x86_64-linux-gnu:$PWD/.carry/tts/root/lib/x86_64-linux-gnu
if [ $HAVE_TTS = 0 ] && [ -f .carry/sndlib.tar.xz ]; then
    tar -xJf .carry/sndlib.tar.xz -C .carry || die "unpacking sndlib"
    SNDLIB=$PWD/.carry/sndlib
fi
log "mode $MODE, budget $BUDGET_MIN min; $(nproc) cores; $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())')"

# synth NAME TEXT VOICES N SEED WORKERS  ->  $WORK/NAME/manifest.jsonl
# A warm machine keeps $WORK between calls: a set made with the same arguments is reused.
synth() {
    local args="$*"
    if [ -s "$WORK/$1/manifest.jsonl" ] && [ "$(cat "$WORK/$1.args" 2>/dev/null)" = "$args" ]; then
        log "synth $1: reusing $WORK/$1 (same arguments, made by an earlier call on this machine)"
        return 0
    fi
    rm -rf "${WORK:?}/$1" "$WORK/$1.args"
    python3 -m recipes.synthetic.synth --text ".carry/text/$2" --voices "$3" --n "$4" --seed "$5" \
        --out "$WORK/$1" --engines-root .carry/tts/root --workers "$6" ${SYNTH_ENGINES:+--engines "$SYNTH_ENGINES"} \
        >"$WORK/$1.json" 2>"$WORK/$1.err"
    local rc=$?
    log "synth $1 ($2, $3 voices, n=$4, seed $5): rc $rc $(cat "$WORK/$1.json" 2>/dev/null)"
    if [ $rc -eq 0 ]; then echo "$args" >"$WORK/$1.args"; else tail -5 "$WORK/$1.err" | tee -a "$LOG"; fi
    return $rc
}

# pico NAME TEXT N SEED WORKERS  ->  $WORK/NAME/manifest.jsonl (reused like synth's sets)
pico() {
    local args="pico $*"
    if [ -s "$WORK/$1/manifest.jsonl" ] && [ "$(cat "$WORK/$1.args" 2>/dev/null)" = "$args" ]; then
        log "pico $1: reusing $WORK/$1"
        return 0
    fi
    rm -rf "${WORK:?}/$1" "$WORK/$1.args"
    python3 -m recipes.synthetic.pico make --lib .carry/pico --text ".carry/text/$2" --n "$3" \
        --seed "$4" --out "$WORK/$1" --workers "$5" >"$WORK/$1.json" 2>"$WORK/$1.err"
    local rc=$?
    log "pico $1 ($2, n=$3, seed $4): rc $rc $(cat "$WORK/$1.json" 2>/dev/null)"
    if [ $rc -eq 0 ]; then echo "$args" >"$WORK/$1.args"; else tail -5 "$WORK/$1.err" | tee -a "$LOG"; fi
    return $rc
}

# unpack NAME: the carried .carry/NAME.tar.xz (Kokoro or real speech) decoded to WAV with
# libsndfile -> $WORK/NAME/SET/manifest.jsonl (SET: train, dev; eval for kokoro-eval; realdev).
# Not carried this call: what an earlier call on this (warm) machine unpacked, if any.
unpack() {
    if [ ! -f ".carry/$1.tar.xz" ]; then
        if [ -s "$WORK/$1.args" ]; then log "$1: not carried; reusing $WORK/$1 from an earlier call"; return 0; fi
        return 1
    fi
    local sum
    sum=$(sha256sum ".carry/$1.tar.xz" | cut -d' ' -f1)
    if [ "$(cat "$WORK/$1.args" 2>/dev/null)" = "$sum" ]; then log "$1: reusing $WORK/$1"; return 0; fi
    rm -rf "${WORK:?}/$1" "$WORK/$1.args"
    LD_LIBRARY_PATH=$SNDLIB python3 -m recipes.synthetic.carried unpack --pack ".carry/$1.tar.xz" --out "$WORK/$1" \
        --workers 4 >"$WORK/$1.json" 2>"$WORK/$1.err"
    local rc=$?
    log "$1 unpack: rc $rc $(cat "$WORK/$1.json" 2>/dev/null)"
    if [ $rc -eq 0 ]; then echo "$sum" >"$WORK/$1.args"; else tail -5 "$WORK/$1.err" | tee -a "$LOG"; fi
    return $rc
}

if [ "$MODE" = train ]; then
    TRAIN_SETS=()
    DEV_SETS=()
    if [ $HAVE_TTS = 1 ]; then
        synth train train.txt train "$N_TRAIN" "$SYNTH_SEED" "$WORKERS" & p1=$!
        synth dev dev.txt train "$N_DEV" 1 4 & p2=$!
    fi
    if [ -d .carry/pico ]; then
        pico pico-train train.txt "$N_PICO" $((20 + SYNTH_SEED)) 4 & p3=$!
        pico pico-dev dev.txt "$N_PICO_DEV" 21 2 & p4=$!
        # A failure here leaves that engine out rather than losing the call.
        if wait $p3 && wait $p4; then
            TRAIN_SETS+=("$WORK/pico-train/manifest.jsonl")
            DEV_SETS+=("$WORK/pico-dev/manifest.jsonl")
        else
            log "WARNING: training WITHOUT Pico (synthesis failed, see above)"
        fi
    fi
    # kokoro2, kokoro3..: later packs for a warm machine that keeps the first (gpu_carry.sh kokoro
    # MIB NAME): every pack carried now or unpacked by an earlier call on this machine
    KOKORO_SETS=0
    for k in $( (ls .carry; ls "$WORK") 2>/dev/null | sed -n 's/^\(kokoro[0-9]*\)\.\(tar\.xz\|args\)$/\1/p' | sort -uV); do
        unpack $k || continue
        KOKORO_SETS=$((KOKORO_SETS + 1))
        [ -s "$WORK/$k/train/manifest.jsonl" ] && TRAIN_SETS+=("$WORK/$k/train/manifest.jsonl*$KOKORO_REPEAT")
        [ -s "$WORK/$k/dev/manifest.jsonl" ] && DEV_SETS+=("$WORK/$k/dev/manifest.jsonl")
    done
    [ $KOKORO_SETS -gt 0 ] || log "training without Kokoro speech (none carried or unpacked)"
    # the classic engines' speech made on the CPU machine (gpu_carry.sh classic), when the engines
    # themselves do not travel
    if unpack classic; then TRAIN_SETS+=("$WORK/classic/train/manifest.jsonl"); fi
    REAL_DEV=()
    if unpack real; then
        TRAIN_SETS+=("$WORK/real/train/manifest.jsonl*$REAL_REPEAT")
        REAL_DEV=("$WORK/real/realdev/manifest.jsonl")
    else
        log "WARNING: training WITHOUT real speech (none carried or unpacked)"
    fi
    if [ $HAVE_TTS = 1 ]; then
        wait $p1 || die "train synthesis"
        wait $p2 || die "dev synthesis"
    fi
    # the classic engines' speech: this call's, or what an earlier call on this machine made
    [ -s "$WORK/train/manifest.jsonl" ] && TRAIN_SETS+=("$WORK/train/manifest.jsonl")
    [ -s "$WORK/dev/manifest.jsonl" ] && DEV_SETS+=("$WORK/dev/manifest.jsonl")
    # Real speech's dev split picks the checkpoints when carried (the TTS dev sets then do not).
    [ ${#REAL_DEV[@]} -gt 0 ] && DEV_SETS=("${REAL_DEV[@]}")
    [ ${#TRAIN_SETS[@]} -gt 0 ] && [ ${#DEV_SETS[@]} -gt 0 ] || die "nothing to train or pick checkpoints on"
    python3 -m recipes.synthetic.carried merge --out "$WORK/train-all.jsonl" "${TRAIN_SETS[@]}" >/dev/null &&
        python3 -m recipes.synthetic.carried merge --out "$WORK/dev-all.jsonl" "${DEV_SETS[@]}" >/dev/null ||
        die "merging the manifests"
    log "training manifest: $(wc -l <"$WORK/train-all.jsonl") rows from ${TRAIN_SETS[*]}; dev: $(wc -l <"$WORK/dev-all.jsonl") rows"
    # The state to continue: the newest of this machine's own (a warm machine keeps it between
    # calls, so nothing needs to travel) and the carried one; else INIT_FROM's weights; else none.
    RESUME=()
    step_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["progress"]["step"])' "$1/summary.json" 2>/dev/null || echo -1; }
    SRC=$CKPT
    if [ "$(step_of "$WORK/ckpt")" -gt "$(step_of $CKPT)" ]; then SRC=$WORK/ckpt; fi
    if [ -e $SRC/last.pt ] || [ -e $SRC/last.pt.000 ]; then
        RESUME=(--resume $SRC/last.pt)
        log "resuming from $SRC/last.pt (step $(step_of $SRC))"
    elif [ -n "${INIT_FROM:-}" ]; then
        RESUME=(--init-from "$INIT_FROM")
        log "no saved state: starting from the weights of $INIT_FROM"
    else
        log "no $CKPT/last.pt*: training from scratch"
    fi
    # training (incl. its final dev eval and save) gets the rest of the budget minus 25 s
    MIN=$(python3 -c "print(round(($BUDGET_MIN * 60 - ($(date +%s) - $T0) - 25) / 60, 2))")
    log "training for $MIN min (max-steps $MAX_STEPS)"
    # shellcheck disable=SC2086
    python3 -m recipes.train --train-manifest "$WORK/train-all.jsonl" \
        --dev-manifest "$WORK/dev-all.jsonl" --tokenizer "$WORK/tokenizer.model" \
        --out "$OUT" --log "$LOG" --minutes "$MIN" --max-steps "$MAX_STEPS" \
        --device "$DEVICE" --workers 10 --chunk-mb 15 "${RESUME[@]}" ${TRAIN_ARGS:-} \
        2> >(tee "$WORK/train.err" >&2)
    rc=$?
    [ $rc -eq 0 ] || { tail -30 "$WORK/train.err" | tee -a "$LOG"; die "train.py rc $rc"; }
    rm -rf "$WORK/ckpt" && mkdir -p "$WORK/ckpt" && cp "$OUT"/last.pt.* "$OUT"/summary.json "$WORK/ckpt/"
elif [ "$MODE" = eval ]; then
    synth eval eval.txt eval "$N_EVAL" 2 8 & p1=$!
    synth eval-train-voices eval.txt train "$N_EVAL" 3 8 & p2=$!
    wait $p1 || die "eval synthesis (reserved voices)"
    wait $p2 || die "eval synthesis (training voices)"
    KOKORO_EVAL=()
    if [ -f .carry/kokoro-eval.tar.xz ] && unpack kokoro-eval; then
        KOKORO_EVAL=(--manifest "reserved-kokoro-voices=$WORK/kokoro-eval/eval/manifest.jsonl")
    fi
    [ -e $CKPT/default-model.pt ] || [ -e $CKPT/default-model.pt.000 ] || die "no $CKPT/default-model.pt"
    python3 -m recipes.evaluate --model $CKPT/default-model.pt --device "$DEVICE" --batch 320 \
        --manifest "reserved-voices=$WORK/eval/manifest.jsonl" \
        --manifest "training-voices=$WORK/eval-train-voices/manifest.jsonl" "${KOKORO_EVAL[@]}" --out "$OUT" \
        2> >(tee "$WORK/eval.err" >&2) | tee -a "$LOG"
    rc=$?
    [ $rc -eq 0 ] || { tail -30 "$WORK/eval.err" | tee -a "$LOG"; die "evaluate.py rc $rc"; }
else
    die "mode $MODE: use train or eval"
fi
log "done; \$OUT: $(cd "$OUT" && ls -l | awk 'NR>1 {printf "%s (%d) ", $NF, $5}')"
