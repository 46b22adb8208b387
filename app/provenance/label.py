"""The visible "AI-generated" label: white text on a dark box in the bottom-right corner, sized to the frame."""

from __future__ import annotations

import cv2

from app.pipeline.types import Image

LABEL_TEXT = "AI-generated"


def draw_label(image: Image, text: str = LABEL_TEXT) -> Image:
    """Draw the label into `image` (in place) and return it; its height is about 4% of the frame's."""
    h, w = image.shape[:2]
    scale = max(0.35, h / 720 * 0.8)
    thickness = max(1, round(scale * 2))
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
    pad = max(3, round(th * 0.4))
    x1, y1 = w - pad, h - pad
    x0, y0 = max(0, x1 - tw - 2 * pad), max(0, y1 - th - base - 2 * pad)
    roi = image[y0:y1, x0:x1]
    roi[:] = (roi * 0.35).astype(image.dtype)  # darken behind the text so it reads on any picture
    cv2.putText(
        image,
        text,
        (x0 + pad, y1 - pad - base),
        cv2.FONT_HERSHEY_SIMPLEX,
        scale,
        (255, 255, 255),
        thickness,
        cv2.LINE_AA,
    )
    return image
