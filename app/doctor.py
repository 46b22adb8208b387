"""What works on this machine, one line per capability, with the fix where something is missing (`swapcast
doctor`). Only a `fail` stops `swapcast serve` from starting; `missing` and `warn` name features that are off or
degraded (the server says the same at start-up, where it applies)."""

import importlib.util
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from app.errors import ModelError
from app.model_store import hand_model_in_store
from app.server.settings import ServerSettings
from engines.store import ModelStore

State = Literal["ok", "missing", "warn", "fail"]
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
SERVING_SETUP = "bash scripts/setup.sh"


@dataclass(frozen=True)
class Check:
    name: str
    state: State
    detail: str
    fix: str = ""


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_rtsp(settings: ServerSettings, unavailable_reason: Callable[[], str | None]) -> Check:
    if not settings.rtsp_enabled:
        return Check("RTSP output", "ok", "off (SWAPCAST_RTSP_ENABLED=false)")
    reason = unavailable_reason()
    if reason is None:
        return Check("RTSP output", "ok", f"GStreamer's gst-rtsp-server (PyGObject {_version('PyGObject') or '?'})")
    return Check("RTSP output", "missing", reason, f"{SERVING_SETUP} (Debian's GStreamer and the rtsp extra)")


def check_srt(settings: ServerSettings, unavailable_reason: Callable[[], str | None]) -> Check:
    if settings.srt_port is None:
        return Check("SRT output", "ok", "off (SWAPCAST_SRT_PORT is not set)")
    reason = unavailable_reason()
    if reason is None:
        return Check("SRT output", "ok", f"libsrt, channels on UDP port {settings.srt_port}")
    return Check("SRT output", "missing", reason, f"{SERVING_SETUP} (libsrt)")


def check_tools() -> list[Check]:
    checks = []
    for tool, use in (("ffmpeg", "media checks and demos"), ("ffprobe", "checks of produced media")):
        path = shutil.which(tool)
        if path:
            checks.append(Check(tool, "ok", path))
        else:
            checks.append(
                Check(tool, "missing", f"not on PATH ({use}; serving does not need it)", "apt-get install ffmpeg")
            )
    return checks


def _model_check(store: ModelStore, label: str, name: str, importer: str, fix: str) -> Check:
    try:
        status = store.status(name)
    except ModelError as exc:
        return Check(label, "fail", str(exc), "swapcast config (check the model settings)")
    if status in ("verified", "present"):
        return Check(label, "ok", f"{name} {status} in {store.root}")
    if status == "corrupt":
        return Check(label, "warn", f"{name} is corrupt in {store.root}", f"swapcast models import {name}")
    if importlib.util.find_spec(importer) is not None:
        return Check(label, "ok", f"{name} not imported yet; imported from installed packages on first use")
    return Check(label, "missing", f"{name} is not imported and cannot be ({importer} is not installed)", fix)


def _hand_check(settings: ServerSettings, store: ModelStore) -> Check:
    """The occlusion stage's hand model, as SWAPCAST_OCCLUSION uses it (app.pipeline.factory.build_hand_finder)."""
    label, mode, name = "hand model (occlusion)", settings.pipeline.occlusion, settings.pipeline.hand_model
    fix = (
        f"bash scripts/setup.sh (npm, then the import), or: pip install 'swapcast[mesh-import]' and npm, then "
        f"swapcast models import {name}"
    )
    if mode == "off":
        return Check(label, "ok", "occlusion is off (SWAPCAST_OCCLUSION=off)")
    if store.status(name) == "verified":
        return Check(label, "ok", f"{name} verified in {store.root}: hands are kept in front of faces")
    if mode == "auto" and (other := hand_model_in_store(settings.pipeline, store)) is not None:
        return Check(label, "ok", f"{other} verified in {store.root} ({name} is not): hands are kept in front of faces")
    if mode == "auto":
        return Check(
            label, "warn", f"{name} is not imported: hands in front of faces are painted over (the page says so)", fix
        )
    return _model_check(store, label, name, "tflite2onnx", fix)


def check_models(settings: ServerSettings, store: ModelStore) -> list[Check]:
    pipeline = settings.pipeline
    mesh_fix = "pip install 'swapcast[mesh-import]', then swapcast models import face_mesh_468 iris_landmark"
    checks = [
        _model_check(
            store,
            "face detector",
            pipeline.detector_model,
            "retinaface",
            "pip install 'swapcast[assets]', then swapcast models import " + pipeline.detector_model,
        ),
        _model_check(store, "mesh landmarks", pipeline.landmark_model, "tflite2onnx", mesh_fix),
        _model_check(store, "iris model (closed-eye check)", "iris_landmark", "tflite2onnx", mesh_fix),
        _hand_check(settings, store),
    ]
    try:
        present = [
            name for name in (pipeline.swapper_model, pipeline.recognizer_model) if store.file_path(name).is_file()
        ]
    except ModelError as exc:
        checks.append(Check("swap weights", "fail", str(exc), "swapcast config (check the model settings)"))
        return checks
    if len(present) == 2:
        checks.append(
            Check("swap weights", "ok", f"{pipeline.swapper_model} and {pipeline.recognizer_model}: inswapper")
        )
    else:
        checks.append(
            Check(
                "swap weights",
                "missing",
                "no inswapper weights: the weightless mesh engine serves (their licence is non-commercial)",
                f"swapcast models fetch {pipeline.swapper_model} {pipeline.recognizer_model}",
            )
        )
    return checks


def check_maps() -> Check:
    if importlib.util.find_spec("dlib") and importlib.util.find_spec("face_recognition_models"):
        return Check("identity maps (dlib)", "ok", f"dlib {_version('dlib-bin') or _version('dlib') or '?'}")
    return Check(
        "identity maps (dlib)",
        "missing",
        "dlib is not installed: maps need it unless the ArcFace recognizer is in the model store",
        "pip install 'swapcast[match]'",
    )


def check_gpu(driver: Path = NVIDIA_DRIVER) -> list[Check]:
    from engines.tensorrt.versions import installed_stack, stack_problems

    providers: list[str] = []
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
    stack = installed_stack()
    if not driver.exists():
        checks = [
            Check("NVIDIA GPU", "missing", "no NVIDIA driver: models run on the CPU", "an NVIDIA GPU with driver R580+")
        ]
    else:
        lines = driver.read_text(errors="replace").splitlines()
        checks = [Check("NVIDIA GPU", "ok", lines[0].strip() if lines else "driver loaded")]
    checks.append(Check("ONNX Runtime providers", "ok", ", ".join(providers) or "none (onnxruntime is not installed)"))
    versions = f"TensorRT {stack.tensorrt or '-'}, cuda-bindings {stack.cuda_bindings or '-'}"
    if stack.tensorrt is None and driver.exists():
        checks.append(Check("TensorRT", "missing", versions, "pip install 'swapcast[gpu]' (or gpu-trt10)"))
    else:
        checks.append(Check("TensorRT", "ok", versions if stack.tensorrt else "not installed (not needed on a CPU)"))
    problems = stack_problems(stack)
    if problems:
        checks.append(Check("GPU stack mix", "warn", "; ".join(problems), "pip install 'swapcast[gpu]'"))
    return checks


def check_nvenc(driver: Path = NVIDIA_DRIVER) -> Check:
    if not driver.exists():
        return Check("NVENC", "missing", "no NVIDIA driver: live video is encoded with libx264", "an NVIDIA GPU")
    import av

    try:
        context = av.CodecContext.create("h264_nvenc", "w")
        context.width, context.height, context.pix_fmt = 256, 256, "yuv420p"
        context.open()
    except Exception as exc:  # FFmpeg without NVENC, or a driver that refuses: any error means no NVENC
        return Check("NVENC", "missing", f"h264_nvenc does not open ({exc}): libx264 encodes", "FFmpeg with NVENC")
    return Check("NVENC", "ok", "h264_nvenc opens")


def _port_free(host: str, port: int) -> str | None:
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_ports(settings: ServerSettings) -> list[Check]:
    checks = []
    wanted = [("HTTP port", settings.port, "fail", "--port N or SWAPCAST_PORT")]
    if settings.rtsp_enabled:
        wanted.append(("RTSP port", settings.rtsp_port, "warn", "SWAPCAST_RTSP_PORT"))
    for label, port, severity, fix in wanted:
        error = _port_free(settings.host, port)
        if error is None:
            checks.append(Check(label, "ok", f"{settings.host}:{port} is free"))
        else:
            state: State = "fail" if severity == "fail" else "warn"
            checks.append(Check(label, state, f"cannot listen on {settings.host}:{port}: {error}", fix))
    return checks


def check_identity_dir(directory: Path) -> Check:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check(
            "identity dir",
            "fail",
            f"{directory} is not writable ({exc.strerror or exc})",
            "SWAPCAST_IDENTITY_DIR or --identity-dir",
        )
    return Check("identity dir", "ok", f"{directory} is writable")


def check_access(settings: ServerSettings) -> Check:
    from app.auth.access import refusal_to_serve
    from app.auth.keys import KeyStore, KeyStoreError
    from app.auth.settings import is_loopback

    access = settings.access
    keys = KeyStore(access.keys_file)
    try:
        refusal = refusal_to_serve(access, settings.host, keys)
        active = keys.has_active()
    except KeyStoreError as exc:
        return Check("access", "fail", str(exc), f"fix or remove {access.keys_file}")
    if refusal is not None:
        return Check("access", "fail", f"{settings.host} is not loopback and no key or JWT is configured", refusal)
    if access.jwt_configured or active:
        kinds = [k for k, on in (("API keys", active), ("JWT", access.jwt_configured)) if on]
        return Check("access", "ok", " and ".join(kinds))
    if is_loopback(settings.host):
        return Check("access", "ok", f"local mode on {settings.host}: no credentials needed")
    return Check("access", "warn", "SWAPCAST_ALLOW_ANONYMOUS=true: anyone who can reach the server can use it")


def run_checks(settings: ServerSettings, store: ModelStore) -> list[Check]:
    from app.egress.rtsp.bindings import rtsp_unavailable_reason
    from app.egress.srt import unavailable_reason as srt_unavailable_reason

    return [
        check_rtsp(settings, rtsp_unavailable_reason),
        check_srt(settings, srt_unavailable_reason),
        *check_tools(),
        *check_models(settings, store),
        check_maps(),
        *check_gpu(),
        check_nvenc(),
        *check_ports(settings),
        check_identity_dir(settings.identity_dir),
        check_access(settings),
    ]


def can_serve(checks: list[Check]) -> bool:
    return all(check.state != "fail" for check in checks)
