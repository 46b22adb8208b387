"""Occlusion: hands in front of a face stay in front of it.

MediaPipe's hand landmark model (engines.importers.hand_landmark) runs on a square region around each face (the
face box enlarged: a hand over the face reaches beyond it), not on a palm detector's box: the palm detector of
the same package does not convert, and a face's surroundings are the only place a hand matters here. The
model's hand-presence score says whether a hand is there; where it is, its 21 landmarks become a mask (their
convex hull plus each finger drawn as a thick line, and the wrist drawn on into the forearm, widened by a
fraction of the hand's size) that is taken out of the paste mask, feathered, so the original pixels show
through (app.pipeline.paste).

Cheap for live streams: a face's region is looked at again only when its state is stale: a hand was seen there
last time (hands move), `interval` frames went by, or the region's grey thumbnail changed by more than `change`
levels since the frame before (something came in); a look due only to `interval` searches one of the face's
squares, each in turn. The thumbnail is taken in the face's own frame (look_region), and compared with the frame
before rather than with the last look, so a moving camera or a moving head does not call for looks: on a moving
clip they called for a search of every square on most frames, four times the cost of a still face's. In
between, the last hand found is carried with the stream's tracker state.
"""

from dataclasses import dataclass, field

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.stage import ModelStage
from app.pipeline.types import Face, Image, Matrix
from app.runtime.model import Model

INPUT_SIZE = 224
THUMB = 16
THUMB_SAMPLES = 4  # samples per thumbnail pixel, each way
# Why a server has no occlusion stage: said to a session that asks for it and on the page before one starts.
UNAVAILABLE = (
    "occlusion is not available on this server: SWAPCAST_OCCLUSION is off, or the hand model is not imported "
    "(swapcast models import hand_landmark_lite; scripts/setup.sh does it)"
)
# Landmark chains of the hand model: the wrist (0), then four points per finger, thumb first.
FINGERS = tuple((0, *range(1 + 4 * f, 5 + 4 * f)) for f in range(5))

Points = npt.NDArray[np.float64]


@dataclass(frozen=True)
class OcclusionConfig:
    # The squares searched for a hand around a face: (shift down, side), both over the face box's height/larger
    # side. One on the face, one lower: a hand over a face mostly comes up from below (chin, mouth, a cup), and
    # the model finds a hand best when it is near its square's centre (measured on app.bench.hand_scene).
    regions: tuple[tuple[float, float], ...] = ((0.0, 1.4), (0.5, 1.6))
    look_side: float = 4.5  # side of the square whose change calls for a look, in eye distances (look_region)
    hand_scale: float = 2.0  # side of the square a found hand is looked at in, over its landmarks' extent
    min_score: float = 0.5  # hand-presence score from which a hand is taken as there
    interval: int = 3  # frames between looks at a face where no hand was seen (live streams)
    change: float = 6.0  # mean grey-level change of the thumbnail since the frame before that calls for a look
    alternate: bool = True  # a routine look (only `interval` went by) searches one of `regions` in turn, not all
    width: float = 0.12  # finger width, as a fraction of the hand's size (wrist to middle fingertip)
    grow: float = 0.02  # how far the mask reaches beyond the drawn hand, as a fraction of the hand's size
    feather: float = 0.04  # Gaussian sigma of the mask's edge, as a fraction of the hand's size
    forearm: float = 0.5  # how far the wrist is drawn on past the wrist landmark, as a fraction of the hand's size


def square_region(box: npt.ArrayLike, scale: float) -> Matrix:
    """The 2x3 affine taking frame pixels to the model's INPUT_SIZE square around `box` (x0, y0, x1, y1), its
    side `scale` times the box's larger side, upright."""
    x0, y0, x1, y1 = (float(v) for v in np.asarray(box, np.float64))
    side = max(x1 - x0, y1 - y0, 1.0) * scale
    k = INPUT_SIZE / side
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return np.array([[k, 0.0, INPUT_SIZE / 2 - k * cx], [0.0, k, INPUT_SIZE / 2 - k * cy]], np.float64)


def hand_region(hand: Points, scale: float) -> Matrix:
    """The model's square around a hand found before (its landmarks' box, enlarged): where it is looked for
    next, framed as the model likes a hand."""
    return square_region(np.concatenate([hand.min(axis=0), hand.max(axis=0)]), scale)


def look_region(face: Face, side: float) -> Matrix:
    """The 2x3 affine taking frame pixels to the THUMB square whose change calls for a look: centred on the face's
    five points, turned with its eyes, its side `side` eye distances. It moves, turns and scales with the face, so
    the camera moving does not read as something coming in; the face box would not do: live, it is the last
    detection's (app.pipeline.live) and jumps when a new one lands."""
    points = np.asarray(face.landmarks, np.float64)
    eyes = points[1] - points[0]
    distance = max(float(np.hypot(*eyes)), 1.0)
    k = THUMB / (side * distance)
    cos, sin = eyes / distance * k
    matrix = np.array([[cos, sin, 0.0], [-sin, cos, 0.0]], np.float64)
    matrix[:, 2] = THUMB / 2 - matrix[:, :2] @ points.mean(axis=0)
    return matrix


def _thumbnail(frame: Image, region: Matrix) -> npt.NDArray[np.float32]:
    """The region's grey thumbnail, each pixel the mean of 4x4 samples: warpAffine has no area filter (INTER_AREA
    acts as bilinear there), and one sample per pixel read video compression noise and sub-pixel motion as
    change (on a moving 480p stream, half the mean change from one frame to the next)."""
    fine = THUMB * THUMB_SAMPLES
    sampled = cv2.warpAffine(frame, region * THUMB_SAMPLES, (fine, fine), flags=cv2.INTER_LINEAR)
    small = cv2.resize(sampled, (THUMB, THUMB), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(small, cv2.COLOR_BGR2GRAY).astype(np.float32)


class HandFinder(ModelStage):
    """Stage: (frame, faces) -> each face's hand landmarks in frame pixels [21,2], or None where no hand is.
    All regions of a call run as one batch."""

    name = "hands"

    def __init__(self, model: Model, config: OcclusionConfig | None = None) -> None:
        super().__init__(model)
        self.config = config or OcclusionConfig()

    def find(self, frame: Image, regions: list[Matrix]) -> list[tuple[float, Points]]:
        """Per region: the hand-presence score and the 21 landmarks in frame pixels [21,2]."""
        if not regions:
            return []
        crops = [cv2.warpAffine(frame, region, (INPUT_SIZE, INPUT_SIZE), flags=cv2.INTER_LINEAR) for region in regions]
        # RGB, 0..1, NCHW in one pass (half the time of flipping, scaling and transposing in numpy)
        batch = cv2.dnn.blobFromImages(crops, 1.0 / 255.0, swapRB=True)
        points, scores, _side = self.model.run({"image": batch})
        found: list[tuple[float, Points]] = []
        for region, hand, score in zip(regions, points, scores, strict=True):
            inverse = cv2.invertAffineTransform(region)
            xy = np.asarray(hand[:, :2], np.float64)
            found.append((float(score[0]), xy @ inverse[:, :2].T + inverse[:, 2]))
        return found

    def _best(self, frame: Image, regions: list[list[Matrix]]) -> list[tuple[float, Points] | None]:
        """Per face, the best-scoring hand over its regions (all run as one batch), or None below `min_score`."""
        flat = [region for face_regions in regions for region in face_regions]
        found = iter(self.find(frame, flat))
        best: list[tuple[float, Points] | None] = []
        for face_regions in regions:
            scored = [next(found) for _ in face_regions]
            top = max(scored, key=lambda item: item[0], default=None)
            best.append(top if top is not None and top[0] >= self.config.min_score else None)
        return best

    def hands(
        self,
        frame: Image,
        faces: list[Face],
        known: list[Points | None],
        squares: list[tuple[int, ...] | None] | None = None,
    ) -> list[Points | None]:
        """Each face's hand in `frame`, or None: looked for around the hand `known` for it (a hand found in an
        earlier frame), else (or when it is gone from there) in the squares around the face (`squares`: per face,
        which of `config.regions` a first search looks in; None: all of them); a hand just found is looked at once
        more in the square around it, where the model places its landmarks best."""
        config = self.config

        def around_face(face: Face, which: tuple[int, ...] | None = None) -> list[Matrix]:
            box = np.asarray(face.box, np.float64)
            height = float(box[3] - box[1])
            chosen = config.regions if which is None else [config.regions[k] for k in which]
            return [square_region(box + np.array([0, down, 0, down]) * height, side) for down, side in chosen]

        which = squares if squares is not None else [None] * len(faces)
        first = [
            [hand_region(h, config.hand_scale)] if h is not None else around_face(f, w)
            for f, h, w in zip(faces, known, which, strict=True)
        ]
        best = self._best(frame, first)
        lost = [i for i, hand in enumerate(known) if hand is not None and best[i] is None]
        for i, found in zip(lost, self._best(frame, [around_face(faces[i]) for i in lost]), strict=True):
            best[i] = found
        new = [(i, found) for i, found in enumerate(best) if found is not None and (known[i] is None or i in lost)]
        again = self._best(frame, [[hand_region(found[1], config.hand_scale)] for _, found in new])
        for (i, _), found in zip(new, again, strict=True):
            if found is not None:
                best[i] = found
        return [None if found is None else found[1] for found in best]


def hand_mask(hands: list[Points], matrix: Matrix, size: int, config: OcclusionConfig) -> npt.NDArray[np.float32]:
    """How much of each pixel of a size x size crop (placed by `matrix`, frame -> crop) is hand: float32 0..1,
    the hands drawn, widened and feathered."""
    mask = np.zeros((size, size), np.float32)
    for hand in hands:
        xy = hand @ matrix[:, :2].T + matrix[:, 2]
        reach = float(np.linalg.norm(xy[12] - xy[0]))  # wrist to middle fingertip
        reach = max(reach, float(np.ptp(xy, axis=0).max()), 1.0)
        thick = max(1, round(reach * config.width))
        layer = np.zeros((size, size), np.uint8)
        pts = np.round(xy * 4).astype(np.int32)  # drawn with 2 fractional bits
        for chain in FINGERS:
            cv2.polylines(layer, [pts[list(chain)]], False, 255, thick, cv2.LINE_AA, shift=2)
        if config.forearm > 0:
            # The wrist goes on into the forearm, away from the middle finger's knuckle, as wide as the palm.
            away = xy[0] - xy[9]
            away /= max(float(np.linalg.norm(away)), 1e-6)
            palm = max(1, round(float(np.linalg.norm(xy[5] - xy[17]))))
            end = np.round((xy[0] + away * reach * config.forearm) * 4).astype(np.int32)
            cv2.line(layer, tuple(int(v) for v in pts[0]), tuple(int(v) for v in end), 255, palm, cv2.LINE_AA, shift=2)
        hull = cv2.convexHull(pts)
        cv2.fillConvexPoly(layer, hull, 255, cv2.LINE_AA, shift=2)
        grow = max(1, round(reach * config.grow))
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * grow + 1, 2 * grow + 1))
        grown = np.asarray(cv2.dilate(layer, kernel), np.float32) * (1.0 / 255.0)
        sigma = max(0.5, reach * config.feather)
        # Feathered outward only: the drawn hand itself stays wholly kept.
        soft = np.maximum(cv2.GaussianBlur(grown, (0, 0), sigmaX=sigma, sigmaY=sigma), grown)
        np.maximum(mask, soft, out=mask)
    return mask


@dataclass
class _Seen:
    frame: int  # the last look's
    thumb: npt.NDArray[np.float32]  # the region's thumbnail on the face's latest frame
    hand: Points | None
    turn: int = 0  # routine searches of this face so far (which square the next one looks in)


@dataclass
class HandTracking:
    """One stream's hands, per tracked face: what was last found and when (carried between looks)."""

    config: OcclusionConfig
    frame: int = 0
    seen: dict[int, _Seen] = field(default_factory=dict)
    looks: int = 0  # model runs so far, for measurements

    def hands(self, finder: HandFinder, frame: Image, faces: list[Face]) -> list[Points | None]:
        """Each face's hand in `frame` (None: none), looked for again where the carried state is stale."""
        self.frame += 1
        thumbs = [_thumbnail(frame, look_region(face, self.config.look_side)) for face in faces]
        stale: list[int] = []
        squares: list[tuple[int, ...] | None] = []
        turns: list[int] = []
        regions = len(self.config.regions)
        for i, (face, thumb) in enumerate(zip(faces, thumbs, strict=True)):
            seen = self.seen.get(face.track_id) if face.track_id >= 0 else None
            if seen is None or seen.hand is not None or float(np.abs(thumb - seen.thumb).mean()) > self.config.change:
                stale.append(i)  # new, a hand to follow, or something came in: every square
                squares.append(None)
                turns.append(0 if seen is None else seen.turn)
            elif self.frame - seen.frame >= self.config.interval:
                stale.append(i)  # a routine look at a face with nothing in front: one square in turn, or all
                squares.append((seen.turn % regions,) if self.config.alternate else None)
                turns.append(seen.turn + 1)
        known = [self.seen[faces[i].track_id].hand if faces[i].track_id in self.seen else None for i in stale]
        found = finder.hands(frame, [faces[i] for i in stale], known, squares) if stale else []
        self.looks += len(stale)
        fresh = dict(zip(stale, found, strict=True))
        for i, face in enumerate(faces):
            if i not in fresh and face.track_id in self.seen:
                self.seen[face.track_id].thumb = thumbs[i]
        for (i, hand), turn in zip(fresh.items(), turns, strict=True):
            if faces[i].track_id >= 0:
                self.seen[faces[i].track_id] = _Seen(self.frame, thumbs[i], hand, turn)
        live = {face.track_id for face in faces}
        for track_id in [t for t in self.seen if t not in live]:
            del self.seen[track_id]
        return [fresh[i] if i in fresh else self.seen[face.track_id].hand for i, face in enumerate(faces)]
