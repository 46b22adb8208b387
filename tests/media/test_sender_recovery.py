"""A return stream's sender bounds a plain aiortc receiver's freeze by itself (app.media.sender_recovery): two
aiortc peers on loopback, the receiving one as aiortc makes it, and scripted drops between them."""

import asyncio
import re
import time

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtcpeerconnection import RTCRtpTransceiver
from aiortc.rtp import RTCP_RTPFB_NACK, HeaderExtensionsMap, RtcpRtpfbPacket, RtpPacket, is_rtcp

from app.media.encoder import configure_encoders, install_timed_encoders
from app.media.peer import codec_preferences, use_host_addresses
from app.media.sender_feedback import tap_sender
from app.media.sender_recovery import PROBE_INTERVAL_S, PROBE_WHILE_S, SenderRecovery, recover_sender
from app.settings import EncoderSettings
from tests.helpers import wait_for_async
from tests.media.return_drops import WATCH_S, Drops, close_pair, filter_sent, longest_gap, watch_frames
from tests.media.test_sender_feedback import NoiseTrack


async def _return_through_drops(enabled: bool) -> tuple[float, Drops, SenderRecovery]:
    """The longest time the receiver went without a frame in the `WATCH_S` after the first drop."""
    use_host_addresses(["127.0.0.1"])
    configure_encoders(EncoderSettings(backend="x264", x264_preset="ultrafast"))
    install_timed_encoders()
    sender_pc, receiver_pc = RTCPeerConnection(), RTCPeerConnection()
    arrivals: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    receiver_pc.on("track", lambda track: tasks.append(asyncio.ensure_future(watch_frames(track, arrivals))))
    try:
        transceiver: RTCRtpTransceiver = sender_pc.addTransceiver(NoiseTrack(), direction="sendonly")
        transceiver.setCodecPreferences(codec_preferences(["H264"]))  # H.264 and RTX, as a session's return
        recovery = recover_sender(transceiver.sender, enabled)
        assert recovery is not None
        await sender_pc.setLocalDescription(await sender_pc.createOffer())
        await receiver_pc.setRemoteDescription(sender_pc.localDescription)
        await receiver_pc.setLocalDescription(await receiver_pc.createAnswer())
        await sender_pc.setRemoteDescription(receiver_pc.localDescription)
        assert await wait_for_async(lambda: len(arrivals) >= 10, 30.0), "no frames on a clean link"

        drops = Drops(transceiver.sender)
        filter_sent(transceiver.sender.transport, drops.server_keeps)
        filter_sent(receiver_pc.getReceivers()[0].transport, drops.client_keeps)
        drops.armed = True
        assert await wait_for_async(lambda: drops.x is not None, 5.0)
        start = time.monotonic()
        await asyncio.sleep(WATCH_S)
        return longest_gap(arrivals, start, time.monotonic()), drops, recovery
    finally:
        await close_pair(tasks, sender_pc, receiver_pc)


def test_a_lost_retransmission_and_a_lost_nack_freeze_a_plain_aiortc_receiver_under_half_a_second() -> None:
    longest, drops, recovery = asyncio.run(_return_through_drops(enabled=True))
    assert drops.dropped == ["media X", "rtx X", "media Y", "nack Y"], drops.dropped
    assert recovery.peer_nacks is True, "aiortc's receiver asks for packets: no extra keyframes for it"
    counts = recovery.counts
    assert counts.probes >= 1, counts
    assert counts.resent >= 3, counts  # X twice (the first was lost), Y once its NACK came again
    assert longest <= 0.5, f"the receiver went {longest:.2f} s without a frame; {counts}"


def test_without_the_recovery_the_same_losses_freeze_a_plain_aiortc_receiver_for_seconds() -> None:
    """aiortc's sender alone: X's request is answered once, its answer lost, and nothing asks again."""
    longest, drops, _ = asyncio.run(_return_through_drops(enabled=False))
    assert drops.dropped[:2] == ["media X", "rtx X"], drops.dropped
    assert longest > 2.0, f"longest gap {longest:.2f} s"


def test_probes_leave_a_gap_and_fill_it_with_an_empty_packet_sent_after_the_next_one() -> None:
    asyncio.run(_probe_order())


async def _probe_order() -> None:
    sent: list[RtpPacket] = []

    class Transport:
        async def _send_rtp(self, data: bytes) -> None:
            sent.append(RtpPacket.parse(data))

    class Sender:
        _ssrc, _rtx_ssrc = 1111, 2222
        transport = Transport()

    sender = Sender()
    setattr(sender, "_RTCRtpSender__rtp_header_extensions_map", HeaderExtensionsMap())  # noqa: B010
    setattr(sender, "_RTCRtpSender__rtx_payload_type", None)  # noqa: B010 (no RTX negotiated)
    now = [100.0]
    recovery = SenderRecovery(sender, clock=lambda: now[0])

    async def media(seq: int, timestamp: int, marker: int = 1) -> None:
        packet = RtpPacket(payload_type=96, sequence_number=seq, timestamp=timestamp, ssrc=1111, payload=b"x" * 10)
        packet.marker = marker  # the frame's last packet
        recovery.on_sent(packet)  # as aiortc's history write, just before the send
        await sender.transport._send_rtp(packet.serialize(HeaderExtensionsMap()))
        await asyncio.sleep(0)

    await media(10, 900, marker=0)
    await media(11, 900)
    assert [p.sequence_number for p in sent] == [10, 11], "no probe while nothing was lost"
    nack = RtcpRtpfbPacket(fmt=RTCP_RTPFB_NACK, ssrc=5, media_ssrc=1111)
    nack.lost = [10]
    recovery.on_rtcp(nack)
    await recovery.retransmit(10)
    await recovery.retransmit(10)  # asked again at once: the first is still on its way
    assert recovery.counts.resent == 1 and recovery.counts.resend_guarded == 1
    await media(12, 1800, marker=0)  # the first packet after the loss, a frame's first: a probe
    await media(13, 1800, marker=0)
    now[0] += PROBE_INTERVAL_S + 0.01
    await media(14, 1800)  # due, but inside a frame: not here
    await media(15, 2700)  # the next frame's first packet
    order = [(p.sequence_number, len(p.payload), p.timestamp) for p in sent[3:]]
    # 12 moved up to 13 (the gap), 12 sent empty after it, in the frame before; later packets shifted by one.
    expected = [(13, 10, 1800), (12, 0, 900), (14, 10, 1800), (15, 10, 1800), (17, 10, 2700), (16, 0, 1800)]
    assert order == expected, order
    assert recovery.counts.probes == 2
    await recovery.retransmit(12)  # the empty packet is resent like any other when asked for
    assert sent[-1].sequence_number == 12 and sent[-1].payload == b""


def test_a_receiver_that_negotiated_no_nack_gets_keyframes_every_half_second_while_it_reports_loss() -> None:
    asyncio.run(_without_nack())


async def _without_nack() -> None:
    use_host_addresses(["127.0.0.1"])
    configure_encoders(EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=10.0))
    install_timed_encoders()
    sender_pc, receiver_pc = RTCPeerConnection(), RTCPeerConnection()
    tasks: list[asyncio.Task[None]] = []
    receiver_pc.on("track", lambda track: tasks.append(asyncio.ensure_future(watch_frames(track, []))))
    try:
        transceiver = sender_pc.addTransceiver(NoiseTrack(), direction="sendonly")
        transceiver.setCodecPreferences(codec_preferences(["H264"]))
        sender = transceiver.sender
        tap = tap_sender(sender)  # the receiver's reports reach the encoder, as on a session
        recovery = recover_sender(sender)
        assert tap is not None and recovery is not None
        await sender_pc.setLocalDescription(await sender_pc.createOffer())
        await receiver_pc.setRemoteDescription(sender_pc.localDescription)
        answer = await receiver_pc.createAnswer()
        # A receiver that asks for keyframes (PLI) but not for packets, as GStreamer's webrtcbin by default.
        plain_nack = re.compile(r"a=rtcp-fb:\d+ nack\r\n")
        await receiver_pc.setLocalDescription(answer)
        stripped = RTCSessionDescription(plain_nack.sub("", receiver_pc.localDescription.sdp), "answer")
        await sender_pc.setRemoteDescription(stripped)
        assert await wait_for_async(lambda: tap.encoder() is not None, 30.0)
        assert recovery.peer_nacks is False

        lost = [0]

        def keeps(data: bytes) -> bool:  # every 20th media packet is lost
            if is_rtcp(data) or RtpPacket.parse(data).ssrc != sender._ssrc:
                return True
            lost[0] += 1
            return lost[0] % 20 != 0

        filter_sent(sender.transport, keeps)
        encoder = tap.encoder()
        assert await wait_for_async(lambda: encoder.loss_keyframe_interval_s == 0.5, 5.0), "told on its first packet"
        assert await wait_for_async(lambda: encoder.keyframes_for_loss >= 3, 10.0), encoder.keyframes_for_loss
        assert encoder.keyframes_forced == 0, "not one asked for: the receiver cannot know what it lost"
    finally:
        await close_pair(tasks, sender_pc, receiver_pc)


def test_a_probes_own_gap_is_not_loss_but_an_older_probes_packet_asked_for_again_is() -> None:
    asyncio.run(_probe_echo())


async def _probe_echo() -> None:
    class Transport:
        async def _send_rtp(self, data: bytes) -> None:
            pass

    class Sender:
        _ssrc, _rtx_ssrc = 1111, 2222
        transport = Transport()

    sender = Sender()
    setattr(sender, "_RTCRtpSender__rtp_header_extensions_map", HeaderExtensionsMap())  # noqa: B010
    setattr(sender, "_RTCRtpSender__rtx_payload_type", None)  # noqa: B010
    now = [100.0]
    recovery = SenderRecovery(sender, clock=lambda: now[0])
    seq = [0]

    def media() -> int:
        packet = RtpPacket(payload_type=96, sequence_number=seq[0], timestamp=seq[0], ssrc=1111, payload=b"x")
        packet.marker = 1  # a frame of one packet
        seq[0] += 1
        recovery.on_sent(packet)
        return recovery.counts.probes

    def nack(*lost: int) -> None:
        packet = RtcpRtpfbPacket(fmt=RTCP_RTPFB_NACK, ssrc=5, media_ssrc=1111)
        packet.lost = list(lost)
        recovery.on_rtcp(packet)

    media()
    nack(0)
    assert media() == 1  # the probe: packet 1 went out as 2, 1 is the empty one
    now[0] += PROBE_WHILE_S + 1.0
    nack(1)  # the probe's own gap, asked for as it opened
    assert media() == 1, "a probe's echo keeps no probing going"
    nack(1)  # the empty packet is still missing: it was lost
    assert media() == 2, "a lost probe packet is loss like any other"
    await asyncio.sleep(0)
