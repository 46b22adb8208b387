#!/usr/bin/env bash
# Build the CPU image and prove it runs as deployed: healthy on /readyz, as a non-root user, with a read-only
# root file system, and stopping cleanly on SIGTERM. Needs root and Debian's docker.io and mmdebstrap (no
# Docker Hub: the base image is built from Debian's archive). Uses its own Docker daemon with host networking
# only, so it touches no network set-up, and stops it at the end.
#   bash scripts/check-image.sh            # ~10 min cold on 2 cores, most of it pip inside the build
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${SWAPCAST_IMAGE_WORK:-/tmp/swapcast-image}"
export DOCKER_HOST="unix://$WORK/docker.sock" DOCKER_BUILDKIT=1
DOCKER=/usr/bin/docker  # Debian's client: BuildKit built in (a newer client without buildx fails)
CA="${SWAPCAST_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
PORT="${SWAPCAST_IMAGE_PORT:-18080}"
mkdir -p "$WORK"

started_daemon=""
container=""
cleanup() {
    if [ -n "$container" ]; then "$DOCKER" rm -f "$container" >/dev/null 2>&1 || true; fi
    if [ -n "$started_daemon" ]; then kill "$started_daemon" 2>/dev/null || true; wait "$started_daemon" 2>/dev/null || true; fi
}
trap cleanup EXIT

if ! "$DOCKER" info >/dev/null 2>&1; then
    dockerd --data-root "$WORK/data" --exec-root "$WORK/exec" --pidfile "$WORK/dockerd.pid" -H "$DOCKER_HOST" \
        --bridge=none --iptables=false --ip-masq=false --ip-forward=false >"$WORK/dockerd.log" 2>&1 &
    started_daemon=$!
    for _ in $(seq 1 50); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 0.2; done
fi

if ! "$DOCKER" image inspect local/debian:bookworm >/dev/null 2>&1; then
    mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$WORK/rootfs.tar"
    "$DOCKER" import "$WORK/rootfs.tar" local/debian:bookworm >/dev/null
    rm -f "$WORK/rootfs.tar"
fi

start=$(date +%s)
nice -n 10 "$DOCKER" build --network host --build-arg BASE_IMAGE=local/debian:bookworm \
    --secret id=pip_ca,src="$CA" -t swapcast:cpu .
echo "image built in $(( $(date +%s) - start )) s: $("$DOCKER" image inspect swapcast:cpu --format '{{.Size}}') bytes"

# The CA bundle was a build secret: nothing in the image's settings points at it.
if "$DOCKER" image inspect swapcast:cpu --format '{{.Config.Env}}' | grep -q "pip_ca\|PIP_CERT"; then
    echo "the build CA is referenced by the image" >&2; exit 1
fi

container=$("$DOCKER" run -d --network host --read-only --tmpfs /tmp -e SWAPCAST_HOST=127.0.0.1 \
    -e SWAPCAST_PORT="$PORT" -e SWAPCAST_RTSP_PORT="$((PORT + 1))" swapcast:cpu)
started=$(date +%s)
for _ in $(seq 1 120); do
    status=$("$DOCKER" inspect "$container" --format '{{.State.Health.Status}}')
    [ "$status" = healthy ] && break
    [ "$("$DOCKER" inspect "$container" --format '{{.State.Running}}')" = true ] || { "$DOCKER" logs "$container"; exit 1; }
    sleep 1
done
[ "$status" = healthy ] || { "$DOCKER" logs "$container"; echo "not healthy: $status" >&2; exit 1; }
echo "healthy after $(( $(date +%s) - started )) s"
python3 - "$PORT" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
ready = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5))
assert ready["status"] == "ready", ready
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
assert "swapcast_session_capacity" in metrics
page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
assert "swapcast" in page
server = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/server", timeout=5))
assert server["rtsp"]["available"], server["rtsp"]
print("readyz, metrics, the page and the RTSP output are up")
PY
user=$("$DOCKER" exec "$container" id -u)
[ "$user" != 0 ] || { echo "the server runs as root" >&2; exit 1; }
if "$DOCKER" exec "$container" sh -c 'touch /opt/swapcast/x' 2>/dev/null; then
    echo "the root file system is writable" >&2; exit 1
fi
"$DOCKER" exec "$container" python3 -c "import importlib.util as u; assert u.find_spec('cv2'); import cv2; print('cv2', cv2.__version__)"
"$DOCKER" exec "$container" sh -c '! /opt/swapcast/bin/pip show opencv-python >/dev/null 2>&1' \
    || { echo "the GUI opencv-python is in the image" >&2; exit 1; }
echo "runs as uid $user with a read-only root file system; only opencv-python-headless"
stop_start=$(date +%s)
"$DOCKER" stop -t 30 "$container" >/dev/null
code=$("$DOCKER" inspect "$container" --format '{{.State.ExitCode}}')
echo "stopped on SIGTERM in $(( $(date +%s) - stop_start )) s with exit code $code"
[ "$code" = 0 ]
