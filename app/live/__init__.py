"""The live core: one stream's processing between "decoded frame in" and "processed frame out", whatever
transport brings the frames (a WebRTC session, an RTSP ingest stream) and wherever the output goes (the WebRTC
return, WHEP viewers, RTSP). Transports adapt to it; they carry signalling and transport only."""
