#!/usr/bin/env bash
# Set up a machine for swapcast: system packages (when apt is there and we may use it), then a virtual
# environment in .venv with the project and its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    $SUDO apt-get update -qq
    # ffmpeg: ffprobe checks of produced media. chromium: the real-browser WebRTC test.
    # GStreamer + gst-rtsp-server + introspection: the embedded RTSP server (PyGObject builds against
    # libgirepository and cairo).
    $SUDO apt-get install -y -qq --no-install-recommends \
        ffmpeg chromium \
        gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad \
        gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-rtsp \
        gir1.2-gst-rtsp-server-1.0 gir1.2-gst-plugins-base-1.0 \
        libgirepository1.0-dev libcairo2-dev pkg-config gcc >/dev/null
    # haproxy: `haproxy -c` on the session-routing config and the two-replica routing test. coturn: the
    # TURN test of time-limited credentials. prometheus: promtool checks and a real scrape of the server.
    $SUDO apt-get install -y -qq --no-install-recommends haproxy coturn prometheus >/dev/null
    # docker.io, docker-compose and mmdebstrap: the CPU image built and brought up with compose
    # (scripts/check-image.sh; the base image comes from Debian's archive).
    $SUDO apt-get install -y -qq --no-install-recommends docker.io docker-compose mmdebstrap >/dev/null
fi

python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
bash scripts/setup-triton.sh
echo "swapcast is installed in .venv"
