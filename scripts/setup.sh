#!/usr/bin/env bash
# Set up a machine to serve swapcast: Debian's GStreamer and ffmpeg (when apt is there and we may use it), then
# .venv from the lock (uv.lock) with the project and the assets (the face detector), rtsp, mesh-import and match
# extras. Nothing for tests:
# scripts/setup-dev.sh installs those.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-common.sh
source scripts/setup-common.sh

apt_install "${SERVING_APT[@]}"
"$(find_uv)" sync --frozen --python "$(command -v python3)" --no-dev \
    --extra assets --extra rtsp --extra mesh-import --extra match
echo "swapcast is installed in .venv: .venv/bin/swapcast serve"
