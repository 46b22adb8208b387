#!/usr/bin/env bash
# Set up a machine to test and develop swapcast: the serving set-up's system packages and those of the browser,
# routing, TURN, metrics and image tests, then .venv from the lock with every extra the tests exercise and the
# test and dev dependency groups, and tritonserver in .venv-triton.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-common.sh
source scripts/setup-common.sh

# chromium: the real-browser WebRTC test. haproxy: `haproxy -c` on the session-routing config and the
# two-replica routing test. coturn: the TURN test of time-limited credentials. prometheus: promtool checks and a
# real scrape of the server. docker.io, docker-compose and mmdebstrap: the CPU image built and brought up with
# compose (scripts/check-image.sh; the base image comes from Debian's archive). nginx-light with
# libnginx-mod-rtmp and srt-tools: the RTMP server and the SRT listener/caller that the push tests push to.
# obs-studio, xvfb and libgl1-mesa-dri: OBS 29 itself, under a virtual display with software OpenGL, pulling
# a channel in its test.
apt_install "${SERVING_APT[@]}" chromium haproxy coturn prometheus docker.io docker-compose mmdebstrap \
    nginx-light libnginx-mod-rtmp srt-tools obs-studio xvfb xauth libgl1-mesa-dri

"$(find_uv)" sync --frozen --python "$(command -v python3)" --group test --group dev \
    --extra rtsp --extra mesh-import --extra match --extra assets --extra quality --extra torch --extra triton
bash scripts/setup-triton.sh
echo "swapcast and its test tools are installed in .venv: .venv/bin/python -m pytest -q"
