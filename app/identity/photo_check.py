"""Warnings about a source photo that will swap badly: an open mouth (its teeth land on closed mouths) or
closed eyes (the lids are laid over open ones). The photo is still accepted; the reasons go back to the user.

Both are measured on what the mesh engine prepares a source with: its aligned texture and 468 landmarks.
The mouth comes from the landmarks (inner-lip gap over mouth width: lips closed up to 0.11 on the sample photos,
a toothy smile 0.14). The eyes need a closer look, since the 468-point model leaves shut lids apart (t1.jpg's
right-most face measures 0.25-0.30 there, as open as the astronaut's 0.25): MediaPipe's iris landmark model
traces the lid margins on each eye (app.identity.eye_state). Measured on the more open eye of each face, on
each sample photo and on copies rescaled 0.7-1.25x, shifted and turned 4 degrees: t1's shut eyes 0.057-0.068;
t1's face looking down with the lids lowered 0.080-0.096 (the closest open face); t1's laughing face, one eye
nearly shut, 0.127-0.143; every other face 0.169 and more (the astronaut 0.24-0.25, Grace Hopper 0.19-0.20).
The threshold sits midway between the first two.
"""

import numpy as np

from app.identity.eye_state import EyeOpenness
from app.pipeline.mesh import openness
from app.pipeline.swap import PreparedSource

MOUTH_OPEN = 0.12  # inner-lip gap over inner mouth width
EYES_CLOSED = 0.074  # lid gap over eye width (app.identity.eye_state), the more open of the two eyes


def source_warnings(prepared: PreparedSource, eyes: EyeOpenness | None = None) -> list[str]:
    """Reasons the prepared source may swap badly; empty when fine or when the engine keeps no landmarks.
    Without `eyes` (the iris model), the eyes are not judged."""
    names = prepared.data.dtype.names or ()
    if "mesh" not in names:
        return []
    mesh = np.asarray(prepared.data["mesh"][0])
    warnings = []
    mouth = openness(mesh)["mouth"]
    if mouth >= MOUTH_OPEN:
        warnings.append(
            f"the mouth is open in this photo (opening {mouth:.2f}): its teeth may show on faces "
            "with a closed mouth; a photo with the lips closed swaps better"
        )
    if eyes is not None and "texture" in names:
        lids = max(eyes.measure(np.asarray(prepared.data["texture"][0]), mesh))
        if lids <= EYES_CLOSED:
            warnings.append(
                f"the eyes are closed in this photo (lid opening {lids:.2f}): closed lids may show over open "
                "eyes; a photo with open eyes swaps better"
            )
    return warnings
