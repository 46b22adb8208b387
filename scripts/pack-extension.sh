#!/usr/bin/env bash
# The browser extension as a zip in dist/, reproducibly (the same bytes on every run): scripts/pack_extension.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/pack_extension.py "$@"
