#!/usr/bin/env bash
# The occlusion guide's before/after images (docs/images/occlusion-{input,off,on}.png): a public-domain hand
# drawing from Debian's openclipart-png over scikit-image's astronaut photo (public domain), her face swapped
# with Grace Hopper's portrait (public domain, from Debian's facedetect), with occlusion off and on.
#
#   scripts/occlusion-images.sh [OUT_DIR]      # default docs/images
#
# The two Debian packages are downloaded with `apt-get download` and unpacked into a temporary folder; nothing
# is installed. Needs the hand model in the model store (`swapcast models import hand_landmark_lite`).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="$(realpath -m "${1:-docs/images}")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download openclipart-png facedetect >/dev/null)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done

"$python" -m app.bench.occlusion_images \
    --hand "$work/root/usr/share/openclipart/png/people/bodypart/reminder-hand_benji_park_01.png" \
    --source "$work/root/usr/share/doc/facedetect/examples/grace_hopper_512x512.jpg" \
    --out "$out"
