#!/usr/bin/env bash
# Static checks of everything under deploy/ and the images, all offline: hadolint on every Dockerfile,
# the compose files against the Compose Specification, every kustomize overlay rendered and validated
# strictly against the Kubernetes schemas, every Triton config.pbtxt parsed against Triton's model-config
# protobuf, the HAProxy routing config, the Prometheus configs and every dashboard query (promtool), and the
# systemd unit (systemd-analyze verify).
# Takes about 5-10 s once the tools are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${VENV:-.venv}/bin"
KUBECTL="$(command -v kubectl || echo "$BIN/kubectl")"

echo "hadolint: Dockerfile Dockerfile.gpu deploy/prometheus/Dockerfile"
"$BIN/hadolint" Dockerfile Dockerfile.gpu deploy/prometheus/Dockerfile

for file in docker-compose.yml docker-compose.bridge.yml; do
    "$BIN/check-jsonschema" --builtin-schema vendor.compose-spec "$file" >/dev/null
    echo "compose schema: $file ok"
done

if command -v docker-compose >/dev/null 2>&1; then  # Debian's Compose 1.29, where installed
    for file in docker-compose.yml docker-compose.bridge.yml; do
        docker-compose -f "$file" config -q
        echo "docker-compose config: $file ok"
    done
fi

for overlay in deploy/k8s/overlays/*/; do
    "$KUBECTL" kustomize "$overlay" | "$BIN/kubernetes-validate" --strict --quiet -
    echo "kustomize + kubernetes-validate --strict: $overlay ok"
done

"$BIN/python" - deploy/triton <<'PY'
import sys
from pathlib import Path

from engines.triton.config import parse_config

configs = sorted(Path(sys.argv[1]).glob("*/config.pbtxt"))
if not configs:
    sys.exit("no config.pbtxt under deploy/triton")
for path in configs:
    config = parse_config(path.read_text())
    if config.name != path.parent.name:
        sys.exit(f"{path}: name {config.name!r} is not its directory's")
    print(f"triton model config: {path} ok")
PY

for file in deploy/prometheus/*.yml; do
    promtool check config --syntax-only "$file" >/dev/null
    echo "promtool check config: $file ok"
done
# Every dashboard query is valid PromQL: written out as recording rules (Grafana's variables filled in).
rules="$(mktemp --suffix=.yml)"
trap 'rm -f "$rules"' EXIT
"$BIN/python" - deploy/grafana/dashboards/swapcast.json "$rules" <<'PY'
import json
import sys

dashboard = json.load(open(sys.argv[1]))
queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
rules = [
    {"record": f"dashboard:query_{i}", "expr": q.replace("$__rate_interval", "1m").replace("$instance", ".*")}
    for i, q in enumerate(queries)
]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
PY
promtool check rules "$rules" >/dev/null
echo "promtool check rules: every query of deploy/grafana/dashboards/swapcast.json ok"

haproxy -c -q -f deploy/haproxy/haproxy.cfg
echo "haproxy -c: deploy/haproxy/haproxy.cfg ok"

# The systemd unit. systemd-analyze only warns (exit 0) about an unknown key or a bad value, so any output fails;
# the copy checked runs /bin/true, as the install prefix ExecStart names is not on this machine.
if command -v systemd-analyze >/dev/null 2>&1; then
    unit_dir="$(mktemp -d)"
    sed 's|^ExecStart=[^ ]*|ExecStart=/bin/true|' deploy/systemd/swapcast.service >"$unit_dir/swapcast.service"
    if ! verified="$(systemd-analyze verify --man=no "$unit_dir/swapcast.service" 2>&1)" || [ -n "$verified" ]; then
        echo "$verified" >&2
        rm -rf "$unit_dir"
        exit 1
    fi
    rm -rf "$unit_dir"
    echo "systemd-analyze verify: deploy/systemd/swapcast.service ok"
else
    echo "systemd-analyze verify: skipped (systemd-analyze is not installed)"
fi
