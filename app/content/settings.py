"""Content gate settings (SWAPCAST_CONTENT_*): the policy, the threshold and the live schedule."""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Policy = Literal["off", "blur", "stop"]

# Measured on every packaged face photo and sample video frame the project uses (docs/guides/content-gate.md):
# the highest score among them is far below this.
DEFAULT_THRESHOLD = 0.8


class ContentSettings(BaseSettings):
    """What happens to sexually explicit material (Yahoo's Open NSFW classifier, `swapcast models import
    open_nsfw`): uploads refused, live outputs blurred or stopped, file swaps refused."""

    model_config = SettingsConfigDict(env_prefix="SWAPCAST_CONTENT_", extra="ignore")

    policy: Policy | None = Field(
        None,
        description=(
            "off, blur (cover the whole live output until the content is clear again) or stop (end the session "
            "or stream); uploads and file swaps are refused under both. Unset: stop when serving off loopback "
            "with credentials, off in local mode and for `swapcast swap`."
        ),
    )
    threshold: float = Field(
        DEFAULT_THRESHOLD,
        gt=0.0,
        lt=1.0,
        description="Open NSFW score (probability the image is explicit) at or above which content is refused.",
    )
    interval_s: float = Field(
        1.0,
        gt=0.0,
        le=60.0,
        description="Seconds between checks of one live session's or stream's input and output (and a file's).",
    )
    unchanged_s: float = Field(
        5.0,
        ge=0.0,
        le=600.0,
        description=(
            "Longest time a live picture that has not changed since its last check, which scored below half the "
            "threshold, goes without a new check (its score could only repeat); 0 checks every interval."
        ),
    )
    model_file: Path | None = Field(
        None,
        description=(
            "An ONNX classifier to use instead of open_nsfw, with its inputs and outputs ([N,224,224,3] in, "
            "[N,2] softmax out, column 1 explicit)."
        ),
    )
    threads: int = Field(1, ge=1, le=16, description="Threads of the classifier's ONNX Runtime session.")


def resolve_policy(settings: ContentSettings, *, served_to_others: bool) -> Policy:
    """The policy in force: the one set, else stop for a server others reach (off loopback, with credentials),
    else off."""
    if settings.policy is not None:
        return settings.policy
    return "stop" if served_to_others else "off"
