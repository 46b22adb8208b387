"""The HTTP and WebRTC server: identities, live sessions, RTSP streams, health and metrics."""
