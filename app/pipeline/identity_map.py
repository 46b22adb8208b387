"""Per-person identities: which face of a frame becomes whom, by who each face is.

An `IdentityMap` pairs people (each known by the mean embedding of a reference identity's photos) with the
identity swapped onto them; a face that matches nobody (similarity below the threshold) is left as it is. This
gives "swap only me" (one entry: the streamer's reference photo) and several people each with their own look.

`MappedFaces` is one stream's state: it embeds each face once, when its track starts (tracks are what
`app.pipeline.track` follows between frames), and keeps that embedding for the track's life, so matching costs a
few dot products per frame. A new map (a live `PATCH`) re-matches the tracks already embedded: no face is
embedded again. A face without a track (still photos, untracked frames) is embedded every time it is seen.
A track that matches nobody is embedded again now and then (`RECHECK_FRAMES`, one face per frame at most), so a
person who came into view turned away or half hidden is still found once they face the camera; a matched track
keeps its match.

Live streams embed in the background (`MappedFaces(..., executor=...)`): embedding costs ~0.1 s per face on a CPU
core, so six people coming into view at once would stall one frame by half a second. At most one embedding runs
per stream; the faces of new tracks seen while it runs wait for the next. Until its track's embedding arrives a
face is `PENDING`, and the pipeline covers it (pixelates it, as it covers a lost face): it may be a mapped person
who must not be shown as themselves, and no identity may be swapped onto it before it is known whose face it is.
Once known it is swapped or, matching nobody, left as it is. A track that is looked at again keeps its current
match while that look runs. Files (`swapcast swap --map`) embed inline, so every frame is exact.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.pipeline.swap import PreparedSource
from app.pipeline.types import Face, Image

log = logging.getLogger(__name__)

# Tracks unseen for this many frames are forgotten (the tracker ends a covered track after 150 frames).
FORGET_AFTER_FRAMES = 300
# A track that matched nobody is embedded again after this many frames (1.5 s at 30 fps): at ~0.1 s per face on
# a CPU core, one unmatched bystander costs a few percent of a core.
RECHECK_FRAMES = 45


class FaceEmbedder(Protocol):
    """Unit-length embeddings of faces of one image (`app.identity.embedder`)."""

    name: str
    same_person: float  # cosine similarity at and above which two faces are the same person

    @property
    def key(self) -> str: ...

    def embed(self, image: Image, faces: list[Face]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


def mean_embedding(embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """The normalised mean of unit embeddings: one reference for a person enrolled from several photos."""
    if not embeddings:
        raise ValueError("a mean embedding needs at least one embedding")
    mean = np.mean(np.stack([np.asarray(e, np.float32).reshape(-1) for e in embeddings]), axis=0)
    return (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)


@dataclass(frozen=True)
class MapEntry:
    person: str  # the reference identity: whose face this entry looks for
    identity: str  # the identity swapped onto that face
    reference: np.ndarray  # the person's unit embedding (the mean of their photos')
    source: PreparedSource  # the identity prepared for the engine


@dataclass(frozen=True)
class IdentityMap:
    entries: tuple[MapEntry, ...]
    threshold: float  # cosine similarity a face needs to its person's reference
    embedder_key: str  # references and faces must come from the same embedder

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("an identity map needs at least one entry")
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"the match threshold is a cosine similarity in [-1, 1], got {self.threshold}")

    @property
    def identities(self) -> set[str]:
        """Every identity the map uses, references included (deleting any of them ends the map's users)."""
        return {e.person for e in self.entries} | {e.identity for e in self.entries}

    def match(self, embedding: np.ndarray) -> tuple[int | None, float]:
        """The entry whose person is most similar to `embedding` if at or above the threshold (else None), and
        that similarity. Each face is matched on its own: two faces alike enough to one person are both swapped,
        so the person is never shown unswapped because someone similar is in the frame."""
        similarities = np.stack([e.reference for e in self.entries]) @ np.asarray(embedding, np.float32)
        best = int(np.argmax(similarities))
        score = float(similarities[best])
        return (best if score >= self.threshold else None), score

    def describe(self) -> dict[str, object]:
        return {
            "entries": [{"person": e.person, "identity": e.identity} for e in self.entries],
            "match_threshold": self.threshold,
            "embedder": self.embedder_key,
        }


class Pending:
    """What a face gets while its track's embedding is computed in the background: covered, neither swapped nor
    shown as it is (see the module's notes)."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING = Pending()
FaceSource = PreparedSource | Pending | None  # what to swap onto a face; None: leave it as it is


@dataclass
class _Track:
    embedding: np.ndarray
    last_frame: int  # the latest frame it was in
    embedded_at: int  # the frame its embedding comes from


class MappedFaces:
    """One stream's faces matched against its (replaceable) map. Thread-safe: frames of one stream may be
    processed while the map is replaced from the event loop. With `executor`, tracked faces are embedded there
    (one job at a time) instead of on the frame's path, and a face waiting for its embedding is `PENDING`."""

    def __init__(self, identity_map: IdentityMap, embedder: FaceEmbedder, executor: Executor | None = None) -> None:
        if identity_map.embedder_key != embedder.key:
            raise ValueError(f"the map's references come from {identity_map.embedder_key}, not {embedder.key}")
        self._map = identity_map
        self._embedder = embedder
        self._executor = executor
        self._tracks: dict[int, _Track] = {}
        self._frame = 0
        self._lock = threading.Lock()
        self._job: Future[list[tuple[int, np.ndarray]]] | None = None  # the background embedding in flight
        self._job_frame = 0  # the frame the job's faces come from
        self._failures = 0
        self.embedded = 0  # faces embedded so far (once per track, and unmatched ones again now and then)

    @property
    def identity_map(self) -> IdentityMap:
        return self._map

    def use_map(self, identity_map: IdentityMap) -> None:
        """Use another map from the next frame on; faces already embedded are matched again, not embedded."""
        if identity_map.embedder_key != self._embedder.key:
            raise ValueError(f"the map's references come from {identity_map.embedder_key}, not {self._embedder.key}")
        self._map = identity_map

    def sources(self, frames: list[Image], faces: list[list[Face]]) -> list[list[FaceSource]]:
        """For each face of each frame, what to swap onto it, None to leave it as it is, or `PENDING` while its
        embedding is being computed in the background."""
        identity_map = self._map
        with self._lock:
            self._frame += 1
            self._collect()
            chosen: list[list[FaceSource]] = []
            for frame, frame_faces in zip(frames, faces, strict=True):
                row: list[FaceSource] = []
                for embedding in self._embeddings(frame, frame_faces, identity_map):
                    if embedding is None:
                        row.append(PENDING)
                        continue
                    index, _ = identity_map.match(embedding)
                    row.append(identity_map.entries[index].source if index is not None else None)
                chosen.append(row)
            self._forget_old()
        return chosen

    def _embeddings(self, frame: Image, faces: list[Face], identity_map: IdentityMap) -> list[np.ndarray | None]:
        """Each face's embedding: its track's when it has one, else computed now (for the new ones at once; with
        an executor, tracked ones there, None until they arrive), and again for the longest-unmatched track seen
        in this frame once it is due."""
        known: dict[int, np.ndarray] = {}
        new = []
        due: list[tuple[int, int]] = []  # (embedded_at, position) of unmatched tracks due a new look
        for position, face in enumerate(faces):
            track = self._tracks.get(face.track_id) if face.track_id >= 0 else None
            if track is None:
                new.append(position)
                continue
            track.last_frame = self._frame
            known[position] = track.embedding
            stale = self._frame - track.embedded_at >= RECHECK_FRAMES
            if stale and face.status == "seen" and identity_map.match(track.embedding)[0] is None:
                due.append((track.embedded_at, position))
        if due:
            new.append(min(due)[1])
        if self._executor is not None:  # untracked faces cannot wait for a later frame: they stay inline
            tracked = [p for p in new if faces[p].track_id >= 0]
            if tracked and self._job is None:
                self._job = self._executor.submit(self._embed_tracks, frame, [faces[p] for p in tracked])
                self._job_frame = self._frame
            new = [p for p in new if faces[p].track_id < 0]
        if new:
            computed = self._embedder.embed(frame, [faces[p] for p in new])
            self.embedded += len(new)
            for position, embedding in zip(new, computed, strict=True):
                known[position] = embedding
                if faces[position].track_id >= 0:
                    self._tracks[faces[position].track_id] = _Track(embedding, self._frame, self._frame)
        return [known.get(p) for p in range(len(faces))]

    def _embed_tracks(self, frame: Image, faces: list[Face]) -> list[tuple[int, np.ndarray]]:
        return list(zip((f.track_id for f in faces), self._embedder.embed(frame, faces), strict=True))

    def _collect(self) -> None:
        """Take in the background job's embeddings once it has finished (a failed job is retried by the next
        frame that still needs it)."""
        if self._job is None or not self._job.done():
            return
        job, self._job = self._job, None
        try:
            results = job.result()
        except Exception:
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("background face embedding failed (%d so far)", self._failures, exc_info=True)
            return
        self.embedded += len(results)
        for track_id, embedding in results:
            self._tracks[track_id] = _Track(embedding, self._frame, self._job_frame)

    def _forget_old(self) -> None:
        stale = [tid for tid, t in self._tracks.items() if self._frame - t.last_frame > FORGET_AFTER_FRAMES]
        for track_id in stale:
            del self._tracks[track_id]


FaceSources = PreparedSource | MappedFaces
"""What a stream swaps in: one identity onto every face, or identities by person (`MappedFaces`)."""


def identities_of(source: FaceSources) -> set[str]:
    """The identities a map uses (empty for a plain source: its identity is known to the caller)."""
    return source.identity_map.identities if isinstance(source, MappedFaces) else set()


def describe_sources(source: FaceSources) -> dict[str, object] | None:
    """A map's entries and threshold for a session's or stream's stats; None for one identity on every face."""
    return source.identity_map.describe() if isinstance(source, MappedFaces) else None
