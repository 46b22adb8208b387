"""The content gate of `swapcast swap`: the source photo, the target and the swapped output checked (an image
once, a video one frame every `interval_s` of its time) and the file refused, with nothing written, when any is
flagged. Off unless SWAPCAST_CONTENT_POLICY is set (the command runs on its operator's own machine)."""

from collections.abc import Sequence

from app.content.check import ContentCheck, load_content_check
from app.content.settings import ContentSettings, resolve_policy
from app.errors import UserError
from app.pipeline.types import Image
from engines.store import ModelStore


class FileScreen:
    """Checks one file's frames as they pass; `UserError` on the first flagged one (the caller writes nothing)."""

    def __init__(self, check: ContentCheck, interval_s: float, fps: float) -> None:
        self.check = check
        self.every = max(1, round(interval_s * fps)) if fps > 0 else 1
        self.fps = fps
        self.seen = 0
        self.checks = 0

    def photo(self, image: Image, what: str) -> None:
        """One still checked now (the source photo); `what` names it in the refusal."""
        (score,) = self.check.scores([image])
        self.checks += 1
        if self.check.flagged(float(score)):
            raise UserError(
                f"refused by the content policy: the {what} was flagged as sexually explicit "
                f"(score {float(score):.3f}, threshold {self.check.threshold}); nothing was written"
            )

    def frames(self, targets: Sequence[Image], outputs: Sequence[Image]) -> None:
        """The next frames of the file, before and after the swap: every `every`-th pair is checked."""
        due = [i for i in range(len(targets)) if (self.seen + i) % self.every == 0]
        start = self.seen
        self.seen += len(targets)
        if not due:
            return
        scores = self.check.scores([targets[i] for i in due] + [outputs[i] for i in due])
        self.checks += len(scores)
        for n, score in enumerate(scores):
            if self.check.flagged(float(score)):
                index = start + due[n % len(due)]
                side = "target" if n < len(due) else "swapped output"
                where = f" at {index / self.fps:.1f} s (frame {index})" if self.fps > 0 else ""
                raise UserError(
                    f"refused by the content policy: the {side}{where} was flagged as sexually explicit "
                    f"(score {float(score):.3f}, threshold {self.check.threshold}); nothing was written"
                )

    def close(self) -> None:
        self.check.close()


def file_screen(settings: ContentSettings, store: ModelStore, fps: float = 0.0) -> FileScreen | None:
    """The screen `swapcast swap` applies, or None where the policy is off."""
    if resolve_policy(settings, served_to_others=False) == "off":
        return None
    check = load_content_check(store, settings.threshold, settings.threads, settings.model_file)
    return FileScreen(check, settings.interval_s, fps)
