"""The channels' pushes while the server runs: each stored push (`app.channels.pushes`) as a `Push`, a reader of
its channel's one `SharedEncode` (shared with the channel's other readers); started with the channel and stopped
with it. Every method here blocks (the store's file, a push's thread ending): run them off
the event loop.

A push runs under the credential that added it, as sessions do: revoking that key ends it and removes it from
the store (`end_credentials`), and a stored push whose key was revoked while the server was down is removed
when its channel starts instead of starting. A record from before credentials were kept is given its owner's
credential where that is certain (a JWT subject, local mode, or a key name with one key ever, still active);
otherwise it is removed, not run. Adding, removing and ending a push are audited.

The server runs at most `max_workers` pushes (each one child process while it connects or sends): beyond it a
new push is refused, and stored ones started beyond it wait their turn, "queued"."""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from app.auth.audit import Audit, no_audit
from app.channels.pushes import PushRecord, PushStore
from app.egress.push import Push, WorkerSlots
from app.egress.push_destination import Destination
from app.egress.push_policy import PushPolicy
from app.egress.push_sinks import srt_unavailable_reason
from app.egress.push_worker import ProcessSink
from app.media.encoder import EncoderPolicy
from app.server.resource_errors import Conflict, NotFound, Unavailable

if TYPE_CHECKING:
    from app.server.channels import Channel

log = logging.getLogger(__name__)

KEY_REVOKED = "key revoked"
NO_CREDENTIAL = "added before pushes kept their credential, and whose it is cannot be told: add it again"


class PushNotFound(NotFound):
    what = "push"


@dataclass(frozen=True)
class PushOptions:
    enabled: bool  # run the pushes in this process
    max_per_channel: int
    backoff_s: float
    backoff_max_s: float
    max_workers: int = 16  # pushes running at once on this server
    policy: PushPolicy | None = None  # where pushes may connect, checked again at each connection


class Credentials(Protocol):
    """What the server knows of the credentials stored pushes were added with (`app.server.revocation`)."""

    def valid(self, credential: str) -> bool:
        """Whether a push added with `credential` may run (False once its key is revoked or gone)."""
        ...

    def of_owner(self, owner: str) -> str | None:
        """The credential a record from before credentials were kept must have been added with, where that is
        certain and still valid; None otherwise."""
        ...


class AnyCredential:
    """Every credential valid (a server without keys: there is nothing to revoke)."""

    def valid(self, credential: str) -> bool:
        return True

    def of_owner(self, owner: str) -> str | None:
        return owner


class PushManager:
    def __init__(
        self,
        store: PushStore,
        policy: EncoderPolicy,
        options: PushOptions,
        *,
        credentials: Credentials | None = None,
        audit: Audit = no_audit,
    ) -> None:
        self.store = store
        self._policy = policy
        self._options = options
        self._credentials = credentials or AnyCredential()
        self._audit = audit
        self._slots = WorkerSlots(options.max_workers)
        self._channels: weakref.WeakSet[Channel] = weakref.WeakSet()  # those whose pushes run here
        self._lock = threading.Lock()

    def start_channel(self, channel: Channel) -> None:
        """The channel's stored pushes start sending (when pushes run in this process), those whose credential
        may still run them."""
        if not self._options.enabled:
            return
        for record in self.store.records(channel.id):
            admitted = self._admitted(record)
            if admitted is not None:
                self._start(channel, admitted)

    def _admitted(self, record: PushRecord) -> PushRecord | None:
        """The stored push as it may run, under its credential; None when it may not (removed, unless its
        credential cannot be checked now)."""
        try:
            if record.credential is None:
                credential = self._credentials.of_owner(record.owner)
                if credential is not None:
                    adopted = replace(record, credential=credential)
                    self.store.update(adopted)
                    return adopted
                reason = NO_CREDENTIAL
            elif self._credentials.valid(record.credential):
                return record
            else:
                reason = KEY_REVOKED
        except Exception:  # the keys file cannot be read now: the push waits for the next start, kept
            log.warning(
                "push %s of channel %s not started: its credential cannot be checked",
                record.id,
                record.channel,
                exc_info=True,
            )
            return None
        self.store.remove(record.id)
        log.warning("push %s of channel %s removed, not started: %s", record.id, record.channel, reason)
        self._audit_ended(record, reason)
        return None

    def end_credentials(self, channels: list[Channel], credentials: set[str], reason: str = KEY_REVOKED) -> int:
        """Stop and forget every push added with one of `credentials` (`channels`: the live ones); how many."""
        for channel in channels:  # first, and without the store: they stop even when its file cannot be written
            for push_id, push in list(channel.pushes.items()):
                if push.credential in credentials:
                    self._stop(channel, push_id)
        gone = self.store.remove_where(lambda r: r.credential in credentials)
        for record in gone:
            log.info("channel %s: push %s ended: %s", record.channel, record.id, reason)
            self._audit_ended(record, reason)
        return len(gone)

    def _audit_ended(self, record: PushRecord, reason: str) -> None:
        self._audit("push_ended", **self._audited(record), reason=reason)

    @staticmethod
    def _audited(record: PushRecord) -> dict[str, Any]:
        return {
            "push": record.id,
            "channel": record.channel,
            "owner": record.owner,
            "credential": record.credential,
            "destination": record.destination.shown,
        }

    @staticmethod
    def frames_encoded(channel: Channel) -> int:
        """Video frames the channel's shared encode made so far: it encodes only while a reader (a push whose
        destination takes the stream, an RTSP or SRT client, a WHEP viewer) takes its packets."""
        return channel.encode.frames_encoded

    def running(self) -> int:
        """Pushes running in this process now."""
        return sum(len(channel.pushes) for channel in list(self._channels))

    def stop_channel(self, channel: Channel) -> None:
        """The channel's pushes stop (their records stay): all asked at once, then each waited for, so that a
        channel with several slow destinations stops in the time of one."""
        for push in list(channel.pushes.values()):
            push.stop()
        for push_id in list(channel.pushes):
            self._stop(channel, push_id)

    def forget_channel(self, name: str) -> None:
        """The deleted channel's pushes are deleted too."""
        self.store.remove_channel(name)

    def add(self, channel: Channel, owner: str, destination: Destination, credential: str) -> dict[str, Any]:
        """A new push of the channel, added with `credential`, started at once; its description."""
        if destination.kind == "srt":
            reason = srt_unavailable_reason()
            if reason is not None:
                raise Unavailable(reason)  # SRT cannot run here; the reason says what to install
        with self._lock:
            if len(self.store.records(channel.id)) >= self._options.max_per_channel:
                raise Conflict(f"the channel has {self._options.max_per_channel} pushes, the most it may have")
            if self._options.enabled and self.running() >= self._options.max_workers:
                raise Unavailable(
                    f"the server runs {self._options.max_workers} pushes, the most it may; try again when one ends"
                )
            record = self.store.add(channel.id, owner, destination, credential)
        self._start(channel, record)
        log.info("channel %s: push %s to %s added", channel.id, record.id, destination.shown)
        self._audit("push_added", **self._audited(record))
        return self.describe(channel, record)

    def remove(self, channel: Channel, push_id: str, by: str | None = None) -> None:
        """Stop the push and forget it; `by`: the principal that asked (audited)."""
        record = self._record(channel, push_id)
        self.store.remove(record.id)
        self._stop(channel, record.id)
        log.info("channel %s: push %s removed", channel.id, record.id)
        self._audit("push_removed", **self._audited(record), by=by)

    def get(self, channel: Channel, push_id: str) -> dict[str, Any]:
        return self.describe(channel, self._record(channel, push_id))

    def list(self, channel: Channel) -> list[dict[str, Any]]:
        return [self.describe(channel, record) for record in self.store.records(channel.id)]

    def describe(self, channel: Channel, record: PushRecord) -> dict[str, Any]:
        """The push as the API shows it: its destination with the secrets hidden, and how it is doing here."""
        push = channel.pushes.get(record.id)
        stats = push.stats() if push is not None else {"state": "off"}
        return {**record.public(), **stats}

    def _record(self, channel: Channel, push_id: str) -> PushRecord:
        record = next((r for r in self.store.records(channel.id) if r.id == push_id), None)
        if record is None:
            raise PushNotFound(push_id)
        return record

    def _start(self, channel: Channel, record: PushRecord) -> None:
        if not self._options.enabled or record.id in channel.pushes:
            return
        push = Push(
            record.id,
            record.destination,
            channel.encode,
            backoff_s=self._options.backoff_s,
            backoff_max_s=self._options.backoff_max_s,
            slots=self._slots,
            opener=functools.partial(ProcessSink, policy=self._options.policy),
        )
        push.credential = record.credential
        channel.pushes[record.id] = push
        self._channels.add(channel)
        if self.running() > self._options.max_workers:
            log.warning(
                "channel %s: push %s waits its turn: the server runs at most %d pushes at once",
                channel.id,
                record.id,
                self._options.max_workers,
            )
        push.start()

    def _stop(self, channel: Channel, push_id: str) -> None:
        push = channel.pushes.pop(push_id, None)
        if push is None:
            return
        push.close()
