#!/usr/bin/env bash
# A separate environment with NVIDIA's `tritonserver` (2.51, python backend only) from the nvidia-pytriton
# wheel, for the Triton backend tests. Separate because the wheel needs numpy<2, and from Debian's
# /usr/bin/python3.11 because the backend stub embeds Debian's libpython3.11 (a venv from another 3.11
# build fails at model load). About 450 MB; two minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=/usr/bin/python3.11
if [ ! -x "$PYTHON" ]; then
    echo "no $PYTHON: the Triton backend tests will be skipped" >&2
    exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PYTHON" -m venv .venv-triton
# Outside uv.lock (its numpy<2 conflicts with the project's), so pinned here.
.venv-triton/bin/pip install -q "nvidia-pytriton==0.7.0" "numpy==1.26.4" "onnxruntime==1.32.0"
echo "tritonserver is installed in .venv-triton"
