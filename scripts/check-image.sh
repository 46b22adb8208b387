#!/usr/bin/env bash
# Build the CPU image and bring it up with compose as deployed, beside Prometheus: the image must turn healthy
# on /readyz with the mesh engine (its imported landmark model), run as a non-root user on a read-only root
# file system with only opencv-python-headless, be scraped by Prometheus (the swapcast target `up` in
# Prometheus's API), and stop cleanly on SIGTERM. Run by .ci/run.
#
# No Docker Hub here: the base image is built from Debian's archive with mmdebstrap, and Prometheus from
# Debian's package (deploy/prometheus/Dockerfile); compose takes both from variables. Grafana has no package
# in any reachable registry, so its service is not started (its dashboard is checked by check-deploy.sh and
# tests/deploy). Uses its own Docker daemon with host networking only, so it touches no network set-up, and
# stops it at the end; its data root persists in $SWAPCAST_IMAGE_WORK, so later runs reuse the base image
# and BuildKit's layer and pip caches.
#
# Exit status: non-zero with an `image check failed: ...` line when a build or check fails. Where the Docker
# daemon cannot start at all (not root, no kernel support), one `image check skipped: ...` line and 0.
#   bash scripts/check-image.sh        # ~6 min cold on 2 busy cores (~4 of them the build), ~1 min warm
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${SWAPCAST_IMAGE_WORK:-/tmp/swapcast-image}"
export DOCKER_HOST="unix://$WORK/docker.sock" DOCKER_BUILDKIT=1
DOCKER=/usr/bin/docker  # Debian's client: BuildKit built in (a newer client without buildx fails)
COMPOSE=/usr/bin/docker-compose  # Debian's Compose 1.29
CA="${SWAPCAST_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
BASE=local/debian:bookworm
PROMETHEUS=local/prometheus:bookworm

fail() { echo "image check failed: $*" >&2; exit 1; }
skip() { echo "image check skipped: $*"; exit 0; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

[ "$(id -u)" = 0 ] || skip "its own Docker daemon needs root (running as uid $(id -u))"
command -v dockerd >/dev/null || skip "no Docker engine on this machine (scripts/setup-dev.sh installs docker.io with apt)"
KUBECTL="$(command -v kubectl || echo "${VENV:-.venv}/bin/kubectl")"
for tool in "$DOCKER" "$COMPOSE" mmdebstrap "$KUBECTL"; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/setup-dev.sh installs it)"
done
mkdir -p "$WORK"

started_daemon=""
compose_up=""
cleanup() {
    if [ -n "$compose_up" ]; then "$COMPOSE" down -v --remove-orphans >/dev/null 2>&1 || true; fi
    if [ -n "$started_daemon" ]; then kill "$started_daemon" 2>/dev/null || true; wait "$started_daemon" 2>/dev/null || true; fi
}
trap cleanup EXIT

total=$(date +%s)
if ! "$DOCKER" info >/dev/null 2>&1; then
    dockerd --data-root "$WORK/data" --exec-root "$WORK/exec" --pidfile "$WORK/dockerd.pid" -H "$DOCKER_HOST" \
        --bridge=none --iptables=false --ip-masq=false --ip-forward=false >"$WORK/dockerd.log" 2>&1 &
    started_daemon=$!
    for _ in $(seq 1 100); do
        "$DOCKER" info >/dev/null 2>&1 && break
        kill -0 "$started_daemon" 2>/dev/null || break
        sleep 0.2
    done
    if ! "$DOCKER" info >/dev/null 2>&1; then
        reason=$(grep -iE "level=(fatal|error)|failed|denied|not permitted" "$WORK/dockerd.log" | tail -n 1 | cut -c1-200)
        started_daemon=""
        skip "the Docker daemon cannot start here: ${reason:-see $WORK/dockerd.log}"
    fi
fi

step=$(date +%s)
if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
    mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$WORK/rootfs.tar" \
        || fail "mmdebstrap could not build the Debian base image"
    "$DOCKER" import "$WORK/rootfs.tar" "$BASE" >/dev/null
    rm -f "$WORK/rootfs.tar"
    echo "base image $BASE built from Debian's archive in $(seconds_since "$step") s"
fi

# Prometheus builds beside swapcast (a few apt packages against pip's long install).
"$DOCKER" build --network host --build-arg BASE_IMAGE="$BASE" -t "$PROMETHEUS" deploy/prometheus \
    >"$WORK/prometheus-build.log" 2>&1 &
prometheus_build=$!

step=$(date +%s)
nice -n 10 "$DOCKER" build --network host --build-arg BASE_IMAGE="$BASE" \
    --secret id=pip_ca,src="$CA" -t swapcast:cpu . \
    || fail "docker build of the CPU image (Dockerfile) failed: see the build output above"
echo "image swapcast:cpu built in $(seconds_since "$step") s: $("$DOCKER" image inspect swapcast:cpu --format '{{.Size}}') bytes"
wait "$prometheus_build" || { cat "$WORK/prometheus-build.log" >&2; fail "docker build of deploy/prometheus/Dockerfile failed"; }
echo "image $PROMETHEUS built from Debian's prometheus package"

# The CA bundle was a build secret: nothing in the image's settings points at it.
if "$DOCKER" image inspect swapcast:cpu --format '{{.Config.Env}}' | grep -q "pip_ca\|PIP_CERT"; then
    fail "the build CA is referenced by the image"
fi

# The Kubernetes models Job's script (rendered from the cpu overlay), run in the image as that Job runs it:
# non-root, read-only root, an empty directory as the models volume. It must leave the face mesh verified,
# a Triton repository and the ready mark.
step=$(date +%s)
job_script=$("$KUBECTL" kustomize deploy/k8s/overlays/cpu | python3 -c '
import sys, yaml
(job,) = [d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "Job"]
print(job["spec"]["template"]["spec"]["containers"][0]["args"][0])') || fail "cannot render the models Job"
rm -rf "$WORK/job-models" && mkdir -p "$WORK/job-models" && chown 10001:10001 "$WORK/job-models"
"$DOCKER" run --rm --network host --read-only --tmpfs /tmp -v "$WORK/job-models:/models" --entrypoint sh \
    swapcast:cpu -c "$job_script" >"$WORK/job.log" 2>&1 || { cat "$WORK/job.log" >&2; fail "the models Job's script failed in the image"; }
[ -f "$WORK/job-models/.ready" ] && [ -f "$WORK/job-models/face_mesh_468.onnx" ] \
    && ls "$WORK"/job-models/triton/*/config.pbtxt >/dev/null 2>&1 \
    || { cat "$WORK/job.log" >&2; fail "the models Job left no ready mark, face mesh or Triton repository"; }
echo "the models Job's script filled a models volume in $(seconds_since "$step") s (face mesh, Triton repository, ready mark)"
rm -rf "$WORK/job-models"

# Compose as a user runs it (host networking), on free ports so that nothing else on the host is in the way.
read -r PORT RTSP_PORT PROMETHEUS_PORT < <(python3 -c "
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))")
sed -e "s/127.0.0.1:8000/127.0.0.1:$PORT/; s/127.0.0.1:9090/127.0.0.1:$PROMETHEUS_PORT/" \
    deploy/prometheus/prometheus.yml >"$WORK/prometheus.yml"
chmod 644 "$WORK/prometheus.yml"
export COMPOSE_PROJECT_NAME=swapcast-check COMPOSE_PROFILES=cpu SWAPCAST_IMAGE=swapcast:cpu \
    PROMETHEUS_IMAGE="$PROMETHEUS" PROMETHEUS_CONFIG="$WORK/prometheus.yml" PROMETHEUS_PORT \
    SWAPCAST_PORT="$PORT" SWAPCAST_RTSP_PORT="$RTSP_PORT"
step=$(date +%s)
compose_up=1
"$COMPOSE" up -d --no-build swapcast prometheus || fail "docker-compose up failed"
container=$("$COMPOSE" ps -q swapcast)
status=starting
for _ in $(seq 1 120); do
    status=$("$DOCKER" inspect "$container" --format '{{.State.Health.Status}}')
    [ "$status" = healthy ] && break
    if [ "$("$DOCKER" inspect "$container" --format '{{.State.Running}} {{.RestartCount}}')" != "true 0" ]; then
        "$COMPOSE" logs swapcast >&2; fail "the swapcast container exited before it was healthy (its log is above)"
    fi
    sleep 1
done
[ "$status" = healthy ] || { "$COMPOSE" logs swapcast >&2; fail "the swapcast container is not healthy: $status"; }
echo "swapcast healthy $(seconds_since "$step") s after docker-compose up"

python3 - "$PORT" "$PROMETHEUS_PORT" <<'PY' || fail "the running image or Prometheus is not as deployed (see above)"
import json
import sys
import time
import urllib.request

port, prometheus = sys.argv[1:]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


ready = json.loads(get(f"http://127.0.0.1:{port}/readyz"))
assert ready == {"status": "ready", "engine": "mesh"}, f"/readyz: {ready} (the image must serve the mesh engine)"
assert b"swapcast_session_capacity" in get(f"http://127.0.0.1:{port}/metrics"), "no swapcast metrics"
assert b"swapcast" in get(f"http://127.0.0.1:{port}/"), "no page"
server = json.loads(get(f"http://127.0.0.1:{port}/v1/server"))
assert server["rtsp"]["available"], server["rtsp"]
print(f"/readyz: {ready}; metrics, the page and the RTSP output are up")
deadline = time.monotonic() + 90
health = None
while time.monotonic() < deadline:
    try:
        targets = json.loads(get(f"http://127.0.0.1:{prometheus}/api/v1/targets?state=active"))["data"]
    except OSError:
        targets = {"activeTargets": []}
    swapcast = [t for t in targets["activeTargets"] if t["labels"].get("job") == "swapcast"]
    health = swapcast[0]["health"] if swapcast else None
    if health == "up":
        print(f"Prometheus scrapes swapcast: target {swapcast[0]['scrapeUrl']} is up")
        break
    time.sleep(1)
else:
    sys.exit(f"Prometheus never showed the swapcast target up (last: {health})")
PY

user=$("$DOCKER" exec "$container" id -u)
[ "$user" != 0 ] || fail "the server runs as root"
if "$DOCKER" exec "$container" sh -c 'touch /opt/swapcast/x' 2>/dev/null; then
    fail "the root file system is writable"
fi
"$DOCKER" exec "$container" python3 -c "import cv2; print('cv2', cv2.__version__)" >/dev/null \
    || fail "cv2 does not import in the image"
"$DOCKER" exec "$container" sh -c '! /opt/swapcast/bin/pip show opencv-python >/dev/null 2>&1' \
    || fail "the GUI opencv-python is in the image"
echo "runs as uid $user with a read-only root file system; only opencv-python-headless"

step=$(date +%s)
"$COMPOSE" stop -t 30 swapcast >/dev/null 2>&1
code=$("$DOCKER" inspect "$container" --format '{{.State.ExitCode}}')
echo "swapcast stopped on SIGTERM in $(seconds_since "$step") s with exit code $code"
[ "$code" = 0 ] || fail "swapcast exited with $code on SIGTERM"
"$COMPOSE" down -v --remove-orphans >/dev/null 2>&1
compose_up=""
echo "image check passed in $(seconds_since "$total") s"
