// swapcast web page: pick or upload an identity, send the camera over WebRTC, watch the swapped video come back.
// Plain browser JavaScript, no build step. `window.swapcast` holds the live state (also read by automated tests).
"use strict";

const $ = (id) => document.getElementById(id);

const page = {
  server: null,          // GET /v1/server
  identities: [],
  selected: null,        // identity id
  pc: null,
  stream: null,
  sessionUrl: null,
  rtspUrl: null,
  statsTimer: null,
  lastBrowser: null,     // previous getStats sample, for rates
};

window.swapcast = {
  state: "idle",         // idle, starting, live, stopped, failed
  error: null,
  sessionUrl: null,
  identity: null,
  server: null,          // last GET /v1/sessions/{id}
  browser: null,         // from RTCPeerConnection.getStats()
};

function setStatus(element, text, isError = false) {
  element.textContent = text;
  element.classList.toggle("error", isError);
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    if (Array.isArray(body.detail)) return body.detail.map((d) => d.msg).join("; ");
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

// ------------------------------------------------------------------------------------------------ access

// When the server asks for credentials (401), the page asks for an API key once and keeps it in this tab's
// session storage (never in the URL, never in local storage). Every request carries `X-Swapcast: 1`, which a
// form on another site cannot send: the server refuses state changes without it or a key.
const KEY_STORAGE = "swapcast.key";
let keyWaiters = [];

function storedKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

function askForKey(message) {
  $("key-form").hidden = false;
  setStatus($("key-status"), message, Boolean(storedKey()));
  $("key-input").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

function submitKey(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  $("key-form").hidden = true;
  setStatus($("key-status"), "");
  const waiters = keyWaiters;
  keyWaiters = [];
  waiters.forEach((resolve) => resolve());
}

async function api(url, options = {}) {
  for (;;) {
    const headers = new Headers(options.headers || {});
    headers.set("X-Swapcast", "1");
    const key = storedKey();
    if (key) headers.set("Authorization", `Bearer ${key}`);
    const response = await fetch(url, { ...options, headers });
    if (response.status !== 401) return response;
    const hadKey = Boolean(key);
    sessionStorage.removeItem(KEY_STORAGE);
    await askForKey(hadKey ? "that key was not accepted; enter another" : "this server needs an API key");
  }
}

// ------------------------------------------------------------------------------------------------ server

async function loadServer() {
  const status = $("server-status");
  for (;;) {
    try {
      const response = await api("/v1/server");
      page.server = await response.json();
      if (page.server.ready) break;
      setStatus(status, `server is starting: ${page.server.reason || "…"}`);
    } catch (error) {
      setStatus(status, `server unreachable: ${error}`, true);
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  const rtsp = page.server.rtsp.available ? "RTSP on" : `RTSP off (${page.server.rtsp.reason})`;
  setStatus(status, `ready · engine ${page.server.engine} · ${rtsp}`);
  updateButtons();
}

// ------------------------------------------------------------------------------------------------ identities

async function loadIdentities() {
  const response = await api("/v1/identities");
  if (!response.ok) return;
  page.identities = (await response.json()).identities;
  if (page.selected && !page.identities.some((i) => i.id === page.selected)) page.selected = null;
  if (!page.selected && page.identities.length) page.selected = page.identities[page.identities.length - 1].id;
  renderIdentities();
}

function renderIdentities() {
  const list = $("identity-list");
  list.replaceChildren();
  for (const identity of page.identities) {
    const item = document.createElement("li");
    item.dataset.id = identity.id;
    item.classList.toggle("selected", identity.id === page.selected);

    const radio = document.createElement("input");
    radio.type = "radio";
    radio.name = "identity";
    radio.id = `identity-${identity.id}`;
    radio.value = identity.id;
    radio.checked = identity.id === page.selected;
    radio.addEventListener("change", () => selectIdentity(identity.id));

    const thumb = document.createElement("img");
    thumb.alt = "";
    loadThumbnail(thumb, identity.id);

    const label = document.createElement("label");
    label.htmlFor = radio.id;
    label.textContent = identity.name;
    label.title = consentText(identity.consent);

    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "Delete";
    remove.addEventListener("click", () => deleteIdentity(identity.id));

    item.append(radio, thumb, label, remove);
    list.append(item);
  }
  $("identity-empty").hidden = page.identities.length > 0;
  updateButtons();
}

function consentText(consent) {
  if (!consent) return "no consent recorded (stored before uploads asked for it)";
  const when = `${consent.owner || "unknown"}, ${consent.time}`;
  if (consent.statement === "self") return `consent: the photo shows its uploader (${when})`;
  return `consent obtained (${when}): ${consent.attestation}`;
}

// Thumbnails come through `api` (an <img src> cannot carry the key) and are shown from a blob URL.
async function loadThumbnail(img, id) {
  try {
    const response = await api(`/v1/identities/${id}/thumbnail`);
    if (!response.ok) return;
    const url = URL.createObjectURL(await response.blob());
    img.addEventListener("load", () => URL.revokeObjectURL(url), { once: true });
    img.src = url;
  } catch (_) { /* no thumbnail: the name is still shown */ }
}

async function selectIdentity(id) {
  page.selected = id;
  renderIdentities();
  if (!page.sessionUrl) return;
  const response = await api(page.sessionUrl, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ identity: id }),
  });
  if (response.ok) {
    window.swapcast.identity = id;
    setStatus($("session-status"), "identity switched");
  } else {
    setStatus($("session-status"), `switch failed: ${await errorText(response)}`, true);
  }
}

async function deleteIdentity(id) {
  const response = await api(`/v1/identities/${id}`, { method: "DELETE" });
  if (!response.ok && response.status !== 404) {
    setStatus($("upload-status"), `delete failed: ${await errorText(response)}`, true);
  }
  await loadIdentities();
}

// The attestation is asked for (and required) only when the photo shows someone other than the uploader.
function updateAttestation() {
  const obtained = $("consent-obtained").checked;
  $("upload-attestation").disabled = !obtained;
  $("upload-attestation").required = obtained;
}

async function upload(event) {
  event.preventDefault();
  const file = $("upload-file").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("image", file);
  if ($("upload-name").value.trim()) form.append("name", $("upload-name").value.trim());
  if ($("upload-face").value !== "") form.append("face_index", $("upload-face").value);
  const consent = document.querySelector("#upload-consent input[name=consent]:checked");
  form.append("consent", consent ? consent.value : "");
  if (consent && consent.value === "obtained") form.append("attestation", $("upload-attestation").value.trim());
  setStatus($("upload-status"), "uploading…");
  $("upload-button").disabled = true;
  try {
    const response = await api("/v1/identities", { method: "POST", body: form });
    if (!response.ok) {
      setStatus($("upload-status"), await errorText(response), true);
      return;
    }
    const identity = await response.json();
    page.selected = identity.id;
    setStatus($("upload-status"), `added ${identity.name}`);
    $("upload-form").reset();
    updateAttestation();
    await loadIdentities();
    if (page.sessionUrl) await selectIdentity(identity.id);
  } catch (error) {
    setStatus($("upload-status"), `upload failed: ${error}`, true);
  } finally {
    $("upload-button").disabled = false;
  }
}

// ------------------------------------------------------------------------------------------------ session

function updateButtons() {
  const ready = Boolean(page.server && page.server.ready);
  $("start-button").disabled = !ready || !page.selected || Boolean(page.pc);
  $("stop-button").disabled = !page.pc;
}

// aiortc does not trickle ICE: the offer must carry every candidate, so wait for gathering to finish.
function iceGatheringComplete(pc, timeoutMs = 5000) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(done, timeoutMs);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    }
    function check() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", check);
  });
}

// STUN, and TURN with credentials minted for this session, as the server is configured; none on a LAN.
async function iceServers() {
  try {
    const response = await api("/v1/ice-servers");
    if (response.ok) return (await response.json()).iceServers;
  } catch (_) { /* no ICE servers: host candidates only */ }
  return [];
}

async function start() {
  const status = $("session-status");
  window.swapcast.state = "starting";
  window.swapcast.error = null;
  setStatus(status, "starting the camera…");
  try {
    page.stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 30 } },
      audio: $("mic-toggle").checked,
    });
    $("local-video").srcObject = page.stream;

    const pc = new RTCPeerConnection({ iceServers: await iceServers() });
    page.pc = pc;
    updateButtons();
    pc.addTransceiver(page.stream.getVideoTracks()[0], { direction: "sendrecv", streams: [page.stream] });
    for (const track of page.stream.getAudioTracks()) {
      pc.addTransceiver(track, { direction: "sendrecv", streams: [page.stream] });
    }
    pc.addEventListener("track", (event) => {
      const element = event.track.kind === "audio" ? $("remote-audio") : $("remote-video");
      element.srcObject = new MediaStream([event.track]);
    });
    pc.addEventListener("connectionstatechange", () => {
      if (pc !== page.pc) return;
      if (pc.connectionState === "connected") {
        window.swapcast.state = "live";
        setStatus(status, "live");
      } else if (pc.connectionState === "failed") {
        fail("the connection failed");
      }
    });

    setStatus(status, "connecting…");
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc);
    const response = await api(`/v1/sessions?identity=${encodeURIComponent(page.selected)}`, {
      method: "POST",
      headers: { "Content-Type": "application/sdp" },
      body: pc.localDescription.sdp,
    });
    if (!response.ok) throw new Error(await errorText(response));
    page.sessionUrl = response.headers.get("Location");
    page.rtspUrl = response.headers.get("X-RTSP-URL");
    window.swapcast.sessionUrl = page.sessionUrl;
    window.swapcast.identity = page.selected;
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    showRtsp();
    page.statsTimer = setInterval(updateStats, 1000);
  } catch (error) {
    fail(error.message || String(error));
  }
}

function showRtsp() {
  let text = page.rtspUrl;
  if (!text && page.server) {
    text = page.server.rtsp.available ? "starting…" : `off: ${page.server.rtsp.reason}`;
  }
  $("rtsp-url").textContent = text || "—";
  $("copy-rtsp").disabled = !page.rtspUrl;
  $("make-view-url").disabled = !page.sessionUrl;
  if (!page.sessionUrl) $("view-url").textContent = "—";
}

// A viewer token opens this session's video and nothing else, so its URL can go into OBS.
async function makeViewUrl() {
  if (!page.sessionUrl) return;
  const response = await api(`${page.sessionUrl}/viewer-tokens`, { method: "POST" });
  if (!response.ok) {
    $("view-url").textContent = await errorText(response);
    return;
  }
  const url = new URL((await response.json()).view_url, location.href).href;
  $("view-url").textContent = url;
  navigator.clipboard.writeText(url).catch(() => {});
}

function fail(message) {
  window.swapcast.state = "failed";
  window.swapcast.error = message;
  setStatus($("session-status"), message, true);
  teardown(false);
}

async function stop() {
  await teardown(true);
  window.swapcast.state = "stopped";
  setStatus($("session-status"), "stopped");
}

async function teardown(tellServer) {
  clearInterval(page.statsTimer);
  page.statsTimer = null;
  const url = page.sessionUrl;
  page.sessionUrl = null;
  window.swapcast.sessionUrl = null;
  if (url && tellServer) {
    try { await api(url, { method: "DELETE" }); } catch (_) { /* the server ends it on its own */ }
  }
  if (page.pc) page.pc.close();
  page.pc = null;
  if (page.stream) page.stream.getTracks().forEach((track) => track.stop());
  page.stream = null;
  page.lastBrowser = null;
  page.rtspUrl = null;
  showRtsp();
  updateButtons();
}

// ------------------------------------------------------------------------------------------------ stats

function ms(value) {
  return value === null || value === undefined ? "—" : `${Math.round(value)} ms`;
}

async function updateStats() {
  if (!page.pc || !page.sessionUrl) return;
  try {
    const response = await api(page.sessionUrl);
    if (response.ok) {
      const s = await response.json();
      window.swapcast.server = s;
      $("stat-server-fps").textContent = `${s.fps_in} / ${s.fps_out}`;
      $("stat-server-latency").textContent = `${ms(s.latency_ms.p50)} / ${ms(s.latency_ms.p95)}`;
      const hops = Object.entries(s.hops_ms || {}).map(([hop, v]) => `${hop} ${Math.round(v.p95)}`).join(" · ");
      $("stat-server-hops").textContent = hops ? `${hops} ms` : "—";
      const reasons = Object.entries(s.drops).map(([k, v]) => `${k} ${v}`).join(", ");
      $("stat-server-drops").textContent = `${s.dropped} of ${s.frames_in}${reasons ? ` (${reasons})` : ""}`;
      $("stat-codec").textContent = s.codec || "—";
      if (s.rtsp_url && !page.rtspUrl) { page.rtspUrl = s.rtsp_url; showRtsp(); }
    } else if (response.status === 404) {
      fail("the server ended the session");
      return;
    }
  } catch (_) { /* next tick */ }

  const report = await page.pc.getStats();
  const now = {};
  report.forEach((entry) => {
    if (entry.type === "inbound-rtp" && entry.kind === "video") {
      now.framesDecoded = entry.framesDecoded || 0;
      now.framesDropped = entry.framesDropped || 0;
      now.fpsIn = entry.framesPerSecond;
      now.width = entry.frameWidth;
      now.height = entry.frameHeight;
      now.jitterBufferMs = entry.jitterBufferEmittedCount
        ? (1000 * entry.jitterBufferDelay) / entry.jitterBufferEmittedCount : null;
    } else if (entry.type === "inbound-rtp" && entry.kind === "audio") {
      now.audioBytes = entry.bytesReceived || 0;
    } else if (entry.type === "outbound-rtp" && entry.kind === "video") {
      now.fpsOut = entry.framesPerSecond;
      now.framesSent = entry.framesSent || 0;
    } else if (entry.type === "candidate-pair" && entry.nominated && entry.state === "succeeded") {
      now.rttMs = entry.currentRoundTripTime !== undefined ? entry.currentRoundTripTime * 1000 : null;
    }
  });
  window.swapcast.browser = now;
  page.lastBrowser = now;
  const fps = (v) => (v === undefined || v === null ? "—" : Math.round(v));
  $("stat-browser-fps").textContent = `${fps(now.fpsOut)} / ${fps(now.fpsIn)}`;
  $("stat-browser-frames").textContent = `${now.framesDecoded ?? "—"} / ${now.framesDropped ?? "—"}`;
  $("stat-rtt").textContent = ms(now.rttMs);
  $("stat-jitter").textContent = ms(now.jitterBufferMs);
}

// ------------------------------------------------------------------------------------------------ wiring

$("key-form").addEventListener("submit", submitKey);
$("upload-form").addEventListener("submit", upload);
for (const choice of document.querySelectorAll("#upload-consent input[name=consent]")) {
  choice.addEventListener("change", updateAttestation);
}
$("start-button").addEventListener("click", start);
$("stop-button").addEventListener("click", stop);
$("copy-rtsp").addEventListener("click", () => navigator.clipboard.writeText(page.rtspUrl || ""));
$("make-view-url").addEventListener("click", () => makeViewUrl().catch(() => {}));
window.addEventListener("pagehide", () => {
  if (!page.sessionUrl) return;
  const headers = { "X-Swapcast": "1" };
  if (storedKey()) headers.Authorization = `Bearer ${storedKey()}`;
  fetch(page.sessionUrl, { method: "DELETE", keepalive: true, headers });
});

loadServer();
loadIdentities();
