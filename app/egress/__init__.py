"""Egress: what leaves the server. A live output's frames (`app.live`) go out through one shared encode per
rendition (`encode`), whose packets every reader that does not adapt per peer takes as they are: the RTSP server
(`rtsp`), WHEP viewers (`whep`), SRT callers (`srt`) and pushes to platforms (`push`)."""
