#!/usr/bin/env bash
# Download the Debian TTS engines and unpack them into a portable folder for the GPU machine.
#   recipes/synthetic/engines.sh [DEST]     (default DEST: .carry/tts)
# Leaves DEST/debs (the .deb files), DEST/root (unpacked, pruned) and DEST/root.tar.xz (the
# root packed, to carry: the unpacked root is too large to carry). Unpack it with
#   tar -xJf DEST/root.tar.xz -C DEST
# tts.py sets the environment for the engines under a root (see recipes/synthetic/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.carry/tts}

ESPEAK_NG=(espeak-ng libespeak-ng1 espeak-ng-data libasound2 libasyncns0 libbsd0 libcap2
  libdbus-1-3 libflac12 libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libmd0 libmp3lame0
  libmpg123-0 libogg0 libopus0 libpcaudio0 libpulse0 libsndfile1 libsonic0 libsystemd0
  libvorbis0a libvorbisenc2 libx11-6 libx11-xcb1 libxau6 libxcb1 libxdmcp6 libzstd1)
ESPEAK=(espeak libespeak1 espeak-data libdb5.3 libjack-jackd2-0 libportaudio2)
FLITE=(flite libflite1)
FESTIVAL=(festival libestools2.5 festlex-cmu festlex-poslex festvox-kallpc16k festvox-kdlpc16k
  libgomp1 libtinfo6)

mkdir -p "$DEST/debs"
if [ -z "$(ls "$DEST/debs"/*.deb 2>/dev/null)" ]; then
  apt-get update -qq
  (cd "$DEST/debs" && apt-get download -qq "${ESPEAK_NG[@]}" "${ESPEAK[@]}" "${FLITE[@]}" "${FESTIVAL[@]}")
fi

ROOT="$DEST/root"
rm -rf "$ROOT"
mkdir -p "$ROOT"
for deb in "$DEST/debs"/*.deb; do dpkg -x "$deb" "$ROOT"; done

rm -rf "$ROOT"/usr/share/{doc,man,lintian,bug,locale,pkgconfig,info,menu,alsa} "$ROOT"/usr/include \
  "$ROOT"/etc "$ROOT"/var
find "$ROOT" -name '*.a' -delete
# Flite: one binary per voice (the plain `flite` links every voice, the unused ones too).
find "$ROOT"/usr/bin -type f ! -name espeak-ng ! -name espeak ! -name festival \
  ! -name 'flite_cmu_us_kal16' ! -name 'flite_cmu_us_awb' ! -name 'flite_cmu_us_rms' \
  ! -name 'flite_cmu_us_slt' -delete
find "$ROOT"/usr/bin -xtype l -delete
rm -f "$ROOT"/usr/lib/x86_64-linux-gnu/libflite_cmu_{time_awb,us_kal}.so*
# English data only.
NG="$ROOT"/usr/lib/x86_64-linux-gnu/espeak-ng-data
find "$NG"/lang -mindepth 1 -maxdepth 1 ! -name gmw -exec rm -rf {} +
find "$NG"/lang/gmw -mindepth 1 ! -name 'en*' -delete
rm -rf "$NG"/voices/mb "$NG"/mbrola_ph
OLD="$ROOT"/usr/lib/x86_64-linux-gnu/espeak-data
find "$OLD"/voices -mindepth 1 -maxdepth 1 ! -name '!v' ! -name default ! -name en ! -name en-us \
  ! -name other -exec rm -rf {} +
find "$OLD"/voices/other -mindepth 1 ! -name 'en-*' -delete
rm -rf "$OLD"/mbrola_ph
for data in "$ROOT"/usr/lib/x86_64-linux-gnu/espeak-ng-data "$ROOT"/usr/lib/x86_64-linux-gnu/espeak-data; do
  find "$data" -maxdepth 1 -name '*_dict' ! -name en_dict -delete
done

tar -cJf "$DEST/root.tar.xz" -C "$DEST" root
echo "tts root: $ROOT: $(du -sh --apparent-size "$ROOT" | cut -f1) in $(find "$ROOT" -type f | wc -l) files;" \
  "packed: $DEST/root.tar.xz: $(du -sh --apparent-size "$DEST/root.tar.xz" | cut -f1)"
