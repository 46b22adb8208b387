#!/usr/bin/env bash
# Set up a machine to serve swapcast: Debian's GStreamer, ffmpeg and npm (when apt is there and we may use it),
# then .venv from the lock (uv.lock) with the project and the assets (the face detector), rtsp, mesh-import and
# match extras, then the models the defaults use. Nothing for tests:
# scripts/setup-dev.sh installs those.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-common.sh
source scripts/setup-common.sh

apt_install "${SERVING_APT[@]}"
"$(find_uv)" sync --frozen --python "$(command -v python3)" --no-dev \
    --extra assets --extra rtsp --extra mesh-import --extra match
# The models the defaults use, imported now rather than on the first session: the face detector, the mesh engine's
# landmark models and the hand model that keeps hands in front of faces (SWAPCAST_OCCLUSION=auto runs it only
# where it is imported). `models fetch` imports what is missing and leaves verified files as they are. One that
# cannot be imported here is said, and the server runs without it (`swapcast doctor` tells what is missing).
for model in retinaface_mnet025 face_mesh_468 iris_landmark "${SWAPCAST_HAND_MODEL:-hand_landmark_lite}"; do
    .venv/bin/swapcast models fetch "$model" >/dev/null || echo "setup: $model was not imported (above: why)" >&2
done
echo "swapcast is installed in .venv: .venv/bin/swapcast serve"
