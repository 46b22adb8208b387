# Shared by scripts/setup.sh and scripts/setup-dev.sh (sourced, not run): system packages through apt where it is
# there and may be used, and uv at the version the lock was made with.

export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
# uv makes the environment from the lock with the machine's python3; it never downloads an interpreter.
export UV_PYTHON_DOWNLOADS=never
UV_VERSION=0.13.8

# GStreamer + gst-rtsp-server + introspection: the embedded RTSP server (PyGObject builds against
# libgirepository and cairo). ffmpeg: ffprobe checks of produced media and the doctor's codec check.
SERVING_APT=(
    ffmpeg
    gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
    gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-rtsp
    gir1.2-gst-rtsp-server-1.0 gir1.2-gst-plugins-base-1.0
    libsrt1.5-openssl  # the channels' SRT output (SWAPCAST_SRT_PORT), through ctypes
    libjemalloc2  # the allocator `swapcast serve` re-executes itself with (SWAPCAST_ALLOCATOR)
    libgirepository1.0-dev libcairo2-dev pkg-config gcc python3-dev
    python3-venv  # the small environment uv itself is installed into
)
# npm: `npm pack` of MediaPipe's hand models (SWAPCAST_OCCLUSION=auto keeps hands in front where one is imported).
# Debian's npm only where no npm is on PATH: its package needs Debian's nodejs, which apt cannot put beside a
# Node.js installed from another repository (apt stops with "held broken packages").
if ! command -v npm >/dev/null 2>&1; then SERVING_APT+=(npm); fi

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
can_apt() { command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; }
apt_updated=""
apt_install() {
    can_apt || return 0
    if [ -z "$apt_updated" ]; then $SUDO apt-get update -qq; apt_updated=1; fi
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# uv from PATH when it is the lock's version, else installed once into a small environment of its own (outside
# the project's .venv, which `uv sync` keeps exactly as the lock says).
find_uv() {
    if command -v uv >/dev/null 2>&1 && [ "$(uv --version | cut -d' ' -f2)" = "$UV_VERSION" ]; then
        command -v uv
        return
    fi
    local home="${XDG_CACHE_HOME:-$HOME/.cache}/swapcast/uv-$UV_VERSION"
    if [ ! -x "$home/bin/uv" ]; then
        python3 -m venv "$home" >&2
        "$home/bin/pip" install -q "uv==$UV_VERSION" >&2
    fi
    echo "$home/bin/uv"
}
