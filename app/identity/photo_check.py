"""Warnings about a source photo that will swap badly: an open mouth (its teeth land on closed mouths) or
closed eyes (the lids are laid over open ones). The photo is still accepted; the reasons go back to the user.

Measured from the dense landmarks the mesh engine prepares a source with. MediaPipe's 468-point model tracks
lids and inner lips loosely (on the sample photos: open eyes 0.25-0.46, eyes looking down or squinting still
0.25-0.34; lips closed up to 0.11, a toothy smile 0.14), so only clear cases are flagged.
"""

import numpy as np

from app.pipeline.mesh import openness
from app.pipeline.swap import PreparedSource

MOUTH_OPEN = 0.12  # inner-lip gap over inner mouth width
EYES_CLOSED = 0.15  # lid gap over eye width, both eyes


def source_warnings(prepared: PreparedSource) -> list[str]:
    """Reasons the prepared source may swap badly; empty when fine or when the engine keeps no landmarks."""
    names = prepared.data.dtype.names or ()
    if "mesh" not in names:
        return []
    measured = openness(np.asarray(prepared.data["mesh"][0]))
    warnings = []
    if measured["mouth"] >= MOUTH_OPEN:
        warnings.append(
            f"the mouth is open in this photo (opening {measured['mouth']:.2f}): its teeth may show on faces "
            "with a closed mouth; a photo with the lips closed swaps better"
        )
    if max(measured["left_eye"], measured["right_eye"]) <= EYES_CLOSED:
        warnings.append(
            "the eyes are closed in this photo: closed lids may show over open eyes; a photo with open eyes "
            "swaps better"
        )
    return warnings
