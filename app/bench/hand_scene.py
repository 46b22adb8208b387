"""A real hand over a real face, with the hand's true region: test and benchmark material for occlusion.

No packaged photo shows a hand in front of a face, so one is composed: the right hand holding a poker chip in
insightface's ``t1.jpg`` (a real hand, photographed) is cut out with GrabCut from a fixed rectangle and seeds,
scaled, and pasted over the face of scikit-image's astronaut photo. The pasted pixels are the true hand region
by construction. Limits: the hand's lighting and focus are t1's, not the astronaut's, the cut-out edge is
GrabCut's (a few pixels of t1's background ride along at the rim), and the hand sits still in the photo;
motion is added by moving the cut-out along a path (`hand_crossing`).
"""

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from app.media.clips import load_sample
from app.pipeline.types import Image

# The hand in t1.jpg (1280x886): its rectangle, and the part of it that is surely hand (GrabCut's seed).
HAND_BOX = (656, 464, 800, 608)
HAND_SEED = (25, 30, 110, 140)
GRABCUT_ROUNDS = 8
HAND_CUT_ROW = 118  # rows of the rectangle from here down are left out

Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class HandCutout:
    pixels: Image  # BGR, the hand's rectangle
    mask: Mask  # True on the hand


@dataclass(frozen=True)
class HandScene:
    image: Image  # the face with the hand pasted over it
    face: Image  # the same face without the hand
    hand: Mask  # the true hand region in `image`


def hand_cutout() -> HandCutout:
    """The hand out of t1.jpg (deterministic: OpenCV's random generator is seeded first)."""
    photo = load_sample("t1")
    x0, y0, x1, y1 = HAND_BOX
    crop = np.ascontiguousarray(photo[y0:y1, x0:x1])
    labels = np.full(crop.shape[:2], cv2.GC_PR_BGD, np.uint8)
    sx0, sy0, sx1, sy1 = HAND_SEED
    labels[sy0:sy1, sx0:sx1] = cv2.GC_PR_FGD
    cv2.setRNGSeed(0)
    background, foreground = np.zeros((1, 65)), np.zeros((1, 65))
    cv2.grabCut(crop, labels, (0, 0, 0, 0), background, foreground, GRABCUT_ROUNDS, cv2.GC_INIT_WITH_MASK)
    mask = np.isin(labels, (cv2.GC_FGD, cv2.GC_PR_FGD)).astype(np.uint8)
    mask[HAND_CUT_ROW:] = 0  # below the wrist: the forearm and the table
    count, parts, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=4)
    largest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA])) if count > 1 else 0
    return HandCutout(crop, parts == largest)


def paste_hand(face: Image, cutout: HandCutout, centre: tuple[float, float], width: float) -> HandScene:
    """`face` with the hand scaled to `width` pixels wide and centred at `centre` (x, y in pixels)."""
    scale = width / cutout.pixels.shape[1]
    matrix = np.array(
        [
            [scale, 0.0, centre[0] - scale * cutout.pixels.shape[1] / 2],
            [0.0, scale, centre[1] - scale * cutout.pixels.shape[0] / 2],
        ]
    )
    size = (face.shape[1], face.shape[0])
    pixels = cv2.warpAffine(cutout.pixels, matrix, size, flags=cv2.INTER_LINEAR)
    hand = cv2.warpAffine(cutout.mask.astype(np.uint8) * 255, matrix, size, flags=cv2.INTER_LINEAR) >= 128
    image = face.copy()
    image[hand] = pixels[hand]
    return HandScene(image, face, hand)


def hand_over_face(centre: tuple[float, float] = (215.0, 150.0), width: float = 150.0) -> HandScene:
    """The astronaut photo (512x512, face about 110 px wide) with the hand over her right cheek and mouth."""
    return paste_hand(load_sample("astronaut"), hand_cutout(), centre, width)
