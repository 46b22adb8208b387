// The viewer page for OBS's Browser Source: pulls one session's (or stream's) swapped video over WHEP, full
// window, no controls, transparent around the video, and reconnects on its own (the session restarting, the
// network dropping, the server restarting). `?token=...` (a viewer token of that output) is sent as a bearer
// token; `&audio=1` plays the session's audio too (for OBS with "Control audio via OBS"; off by default, since
// a browser may refuse to start unmuted playback on its own). It waits longer after each failed try (with
// jitter, and at least a 429's or 503's Retry-After) and never gives up: nobody is at an OBS source to press a
// button, and a stream's output may come back. What it is doing is in the page's title and `swapcastViewer`,
// never drawn over the video.
"use strict";

(() => {
  const video = document.getElementById("video");
  const parts = location.pathname.split("/").filter(Boolean); // view/ID, view/stream/ID or view/channel/NAME
  const outputId = decodeURIComponent(parts.pop() || "");
  const kinds = { stream: "streams", channel: "channels" };
  const kind = (parts.length > 1 && kinds[parts[1]]) || "sessions";
  const token = new URLSearchParams(location.search).get("token");
  const withAudio = new URLSearchParams(location.search).get("audio") === "1";
  const endpoint = `/v1/${kind}/${encodeURIComponent(outputId)}/whep`;
  const STALL_MS = 3000; // no new frame for this long: connect again
  const RETRY_MS = [500, 1000, 2000, 4000, 8000, 10000];
  const RETRY_AFTER_MAX_S = 300;
  const TITLE = document.title;

  const status = (window.swapcastViewer = {
    state: "starting",
    error: null,
    connects: 0,
    framesDecoded: 0,
    resource: null,
    attempt: 0, // tries since frames last flowed (0: none)
    message: "connecting…",
  });

  function show(message) {
    status.message = message;
    document.title = `${TITLE} · ${message}`;
  }

  let pc = null;
  let connecting = false; // an offer is out: the stall check waits for its answer
  let failures = 0;
  let lastFrameAt = 0;
  let lastFrames = 0;

  function headers(extra) {
    const h = Object.assign({}, extra);
    if (token) h.Authorization = `Bearer ${token}`;
    return h;
  }

  function gathered(peer) {
    if (peer.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => peer.iceGatheringState === "complete" && resolve();
      peer.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, 2000); // what was gathered by then is enough on a LAN
    });
  }

  function release() {
    const old = pc;
    const resource = status.resource;
    pc = null;
    status.resource = null;
    if (old) old.close();
    if (resource) fetch(resource, { method: "DELETE", headers: headers(), keepalive: true }).catch(() => {});
  }

  async function connect() {
    connecting = true;
    try {
      await offer();
    } finally {
      connecting = false;
    }
  }

  async function offer() {
    release();
    status.state = "connecting";
    const peer = (pc = new RTCPeerConnection());
    peer.addTransceiver("video", { direction: "recvonly" });
    if (withAudio) peer.addTransceiver("audio", { direction: "recvonly" });
    const media = new MediaStream(); // video and audio may come as tracks of different streams
    peer.ontrack = (event) => {
      media.addTrack(event.track);
      if (video.srcObject !== media) video.srcObject = media;
      video.muted = !withAudio;
      video.play().catch(() => {});
    };
    peer.onconnectionstatechange = () => {
      if (peer !== pc) return;
      if (peer.connectionState === "connected") {
        status.state = "live";
        show(status.connects > 1 ? "reconnected · live" : "live");
      }
      if (peer.connectionState === "failed" || peer.connectionState === "closed") retry("connection " + peer.connectionState);
    };
    await peer.setLocalDescription(await peer.createOffer());
    await gathered(peer);
    const response = await fetch(endpoint, {
      method: "POST",
      headers: headers({ "Content-Type": "application/sdp" }),
      body: peer.localDescription.sdp,
      signal: AbortSignal.timeout(20000), // an answer that never comes must not hold up the next try
    });
    if (response.status !== 201) throw await refused(response);
    if (peer !== pc) return;
    status.resource = new URL(response.headers.get("Location"), location.href).href;
    await peer.setRemoteDescription({ type: "answer", sdp: await response.text() });
    status.connects += 1;
    lastFrameAt = performance.now();
  }

  // An error for a refused WHEP request: its status, what the server said, and how long it asked to wait.
  async function refused(response) {
    const error = new Error(`${response.status} ${await response.text()}`);
    error.status = response.status;
    const header = response.headers.get("Retry-After");
    if (header && /^\d+$/.test(header.trim())) error.retryAfterS = Math.min(Number(header), RETRY_AFTER_MAX_S);
    return error;
  }

  let retrying = null;
  function retry(reason, error) {
    status.error = reason;
    status.state = "waiting";
    if (retrying) return;
    // Gone or not allowed (401, 403, 404) will not pass soon: wait as long as the backoff ever does.
    if (error && [401, 403, 404].includes(error.status)) failures = Math.max(failures, RETRY_MS.length - 1);
    const base = RETRY_MS[Math.min(failures, RETRY_MS.length - 1)];
    let delay = base * (1 + 0.25 * Math.random());
    if (error && error.retryAfterS) delay = Math.max(delay, error.retryAfterS * 1000);
    failures += 1;
    status.attempt += 1;
    const due = performance.now() + delay;
    const countdown = () => {
      const seconds = Math.max(1, Math.ceil((due - performance.now()) / 1000));
      show(`reconnecting (attempt ${status.attempt}) in ${seconds} s… (${reason})`);
    };
    countdown();
    const ticking = setInterval(countdown, 1000);
    retrying = setTimeout(() => {
      clearInterval(ticking);
      retrying = null;
      show(`reconnecting (attempt ${status.attempt})…`);
      connect().catch((err) => retry(String(err.message || err), err));
    }, delay);
  }

  // Frames decoded, from the receiver's stats: a stall means the session or the network went away.
  setInterval(async () => {
    const peer = pc;
    if (!peer || retrying || connecting) return;
    let frames = 0;
    (await peer.getStats()).forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "video") frames = s.framesDecoded || 0;
    });
    if (peer !== pc) return;
    status.framesDecoded = frames;
    const now = performance.now();
    if (frames !== lastFrames) {
      lastFrames = frames;
      lastFrameAt = now;
      if (frames > 0 && failures) {  // frames flow again: the next failure starts the backoff over
        failures = 0;
        status.attempt = 0;
      }
    } else if (now - lastFrameAt > STALL_MS) {
      lastFrames = 0;
      retry("no frames for " + STALL_MS / 1000 + " s");
    }
  }, 500);

  window.addEventListener("pagehide", release);
  show("connecting…");
  connect().catch((err) => retry(String(err.message || err), err));
})();
