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
  wanted: false,         // the user pressed start and not stop: a lost connection is made again
  want: null,            // {identity, person, channel}: what every session of this stream asks for
  generation: 0,         // bumped whenever a connection is dropped: late answers of an older one are ignored
  failures: 0,           // tries since the connection was last stable (the backoff's step)
  recovering: false,     // a connection was lost: the next one to come up is a reconnection
  everLive: false,       // this stream was live at least once
  timers: {},            // grace, connect, stable, retry, countdown
};

window.swapcast = {
  state: "idle",         // idle, starting, live, reconnecting, stopped, failed
  error: null,           // why it failed, or why the last connection was lost
  sessionUrl: null,
  identity: null,
  person: null,          // with "only this person": the identity whose photo shows the person swapped
  channel: null,
  attempt: 0,            // the reconnection try under way or waited for (0: none)
  reconnects: 0,         // connections made again after one was lost
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

// `askKey: false` hands a 401 back instead of asking (what runs unattended must not wait for someone to type).
async function api(url, options = {}) {
  const { askKey = true, ...init } = options;
  for (;;) {
    const headers = new Headers(init.headers || {});
    headers.set("X-Swapcast", "1");
    const key = storedKey();
    if (key) headers.set("Authorization", `Bearer ${key}`);
    const response = await fetch(url, { ...init, headers });
    if (response.status !== 401 || !askKey) return response;
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
  const mouth = page.server.mouth_mask;
  showStage("mouth", mouth.default, mouth.available, mouth.reason);
  const hands = page.server.occlusion;
  showStage("occlusion", hands.default, hands.available, hands.reason);
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
  renderPersonChoice();
  updateButtons();
}

// "Only this person": any identity can name the person (its photo shows them); the others stay as they are.
function renderPersonChoice() {
  const select = $("person-select");
  const previous = select.value;
  select.replaceChildren(...page.identities.map((identity) => new Option(identity.name, identity.id)));
  if (page.identities.some((identity) => identity.id === previous)) select.value = previous;
  select.disabled = !$("swap-person").checked || page.identities.length === 0;
}

function chosenPerson() {
  return $("swap-person").checked && $("person-select").value ? $("person-select").value : null;
}

// What a session is asked to swap: every face with the identity, or only the person's (an identity map).
function swapChoice(identity, person) {
  return person ? { map: [{ person, identity }] } : { identity };
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
  await switchLive();
}

// The live session follows the page's choice (identity, whose face) from its next frame on.
async function switchLive() {
  const id = page.selected;
  const person = chosenPerson();
  if (page.wanted && !page.sessionUrl) {  // between connections: the next one asks for it
    Object.assign(page.want, { identity: id, person });
    Object.assign(window.swapcast, { identity: id, person });
    return;
  }
  if (!page.sessionUrl || !id) return;
  const response = await api(page.sessionUrl, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(swapChoice(id, person)),
  });
  if (response.ok) {
    if (page.want) Object.assign(page.want, { identity: id, person });
    Object.assign(window.swapcast, { identity: id, person });
    setStatus($("session-status"), person ? "now swapping only the chosen person" : "identity switched");
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
  const files = [...$("upload-file").files];
  if (!files.length) return;
  const form = new FormData();
  for (const file of files) form.append("image", file);
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
    const photos = identity.photos > 1 ? ` from ${identity.photos} photos` : "";
    setStatus($("upload-status"), `added ${identity.name}${photos}`);
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

// ------------------------------------------------------------------------------------------------ options

// The session's own options (the server's settings are their defaults); every new session of the stream gets
// them. A session starts with hands kept in front where the server has the stage: the box is only sent to turn
// that off, and then shows what the server does. The mouth box starts as the server's default and is sent as it
// stands wherever the server can keep the mouth.
function chosenOptions() {
  const options = {};
  const faceLost = $("face-lost-select").value;
  if (faceLost) options.on_face_lost = faceLost;
  const box = $("occlusion-toggle");
  if (!box.checked && !box.disabled) options.occlusion = false;  // disabled: the server has no such stage
  const mouth = $("mouth-toggle");
  if (!mouth.disabled) options.mouth_mask = mouth.checked;  // disabled: the server cannot keep the mouth
  return options;
}

// What a stage's note says where the server gives no reason of its own.
const STAGE_MISSING = {
  occlusion: "the server cannot keep hands in front",
  mouth: "the server cannot keep the mouth",
};

// A stage's box (`occlusion`: the hands, `mouth`) as the server has it, before a session starts too: where the
// server lacks the stage (for the hands: the hand model is not imported, or SWAPCAST_OCCLUSION is off), unticked
// and disabled with the reason beside it.
function showStage(stage, kept, available, reason) {
  const box = $(`${stage}-toggle`);
  box.checked = kept;
  box.disabled = !available;
  const note = $(`${stage}-note`);
  note.textContent = available ? "" : (reason || STAGE_MISSING[stage]);
  note.hidden = available;
}

// `announce`: say what changed (the user changed it), rather than quietly carrying the options over to a new
// session, whose own status ("live", "Reconnected") must stay.
async function applyOptions(sessionUrl, options = chosenOptions(), announce = false) {
  if (!sessionUrl) return;
  const response = await api(`${sessionUrl}/options`, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(options),
    askKey: false,
  });
  if (!response.ok) {
    setStatus($("session-status"), `options not applied: ${await errorText(response)}`, true);
    return;
  }
  const applied = (await response.json()).options;
  showStage("occlusion", applied.occlusion, applied.occlusion_available, page.server && page.server.occlusion.reason);
  showStage("mouth", applied.mouth_mask, applied.mouth_mask_available, page.server && page.server.mouth_mask.reason);
  if (announce && "occlusion" in options) {
    setStatus($("session-status"), applied.occlusion ? "hands kept in front" : "faces pasted whole");
  }
  if (announce && "mouth_mask" in options) {
    setStatus($("session-status"), applied.mouth_mask ? "your own mouth kept" : "mouth swapped too");
  }
}

// ------------------------------------------------------------------------------------------------ session

// A stream is one camera and, while it lasts, a peer connection and a server session. When the connection is
// lost while the user still wants to stream (the network drops, the laptop sleeps, the server ends the session),
// the page opens a new session with the same identity, channel and camera, waiting longer after each failed try.
// aiortc (the server's WebRTC stack) applies a peer's ICE credentials once and cannot restart ICE: hence a new session.
const DISCONNECT_GRACE_MS = 2500; // "disconnected" often recovers by itself; this long, and it counts as lost
const CONNECT_TIMEOUT_MS = 30000; // answered, but not connected this long after: lost
const STABLE_MS = 10000;          // connected this long: the next loss starts the backoff from its first step
const BACKOFF_MS = [1000, 2000, 4000, 8000, 10000];
const RETRY_AFTER_MAX_S = 300;

// A refused request: 4xx answers other than 408, 425 and 429 will not change by asking again.
class Refusal extends Error {
  constructor(status, detail, retryAfterS) {
    super(`${detail} (${status})`);
    this.status = status;
    this.retryAfterS = retryAfterS;
  }

  get permanent() {
    return this.status >= 400 && this.status < 500 && ![408, 425, 429].includes(this.status);
  }
}

async function refusal(response) {
  const header = response.headers.get("Retry-After");
  let seconds = null;
  if (header) {
    seconds = /^\d+$/.test(header.trim()) ? Number(header) : (Date.parse(header) - Date.now()) / 1000;
    if (!Number.isFinite(seconds) || seconds < 0) seconds = null;
  }
  return new Refusal(response.status, await errorText(response), seconds);
}

function updateButtons() {
  const ready = Boolean(page.server && page.server.ready);
  $("start-button").disabled = !ready || !page.selected || page.wanted;
  $("stop-button").disabled = !page.wanted;
  $("channel-input").disabled = page.wanted;
  if (typeof renderChannels === "function") renderChannels();  // "Use for live" only between streams
}

function clearTimers() {
  for (const timer of Object.values(page.timers)) {
    clearTimeout(timer);
    clearInterval(timer);
  }
  page.timers = {};
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
    const response = await api("/v1/ice-servers", { askKey: false });
    if (response.ok) return (await response.json()).iceServers;
  } catch (_) { /* no ICE servers: host candidates only */ }
  return [];
}

// The channel, from the field or the page's `?channel=`, is kept in the page's URL so a reload keeps it too.
function keepChannelInUrl(channel) {
  const url = new URL(location.href);
  if (channel) url.searchParams.set("channel", channel);
  else url.searchParams.delete("channel");
  if (url.href !== location.href) history.replaceState(history.state, "", url);
}

function sessionsPath() {
  const { identity, person } = page.want;
  const query = new URLSearchParams(person ? { map: `${person}:${identity}` } : { identity });
  if (page.want.channel) query.set("channel", page.want.channel);
  return `/v1/sessions?${query}`;
}

async function start() {
  if (page.wanted || !page.selected) return;
  const status = $("session-status");
  const channel = $("channel-input").value.trim();
  page.wanted = true;
  page.want = { identity: page.selected, person: chosenPerson(), channel };
  page.failures = 0;
  page.recovering = false;
  page.everLive = false;
  Object.assign(window.swapcast, {
    state: "starting", error: null, identity: page.selected, person: page.want.person, channel: channel || null,
    attempt: 0, reconnects: 0,
  });
  keepChannelInUrl(channel);
  updateButtons();
  setStatus(status, "starting the camera…");
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 30 } },
      audio: $("mic-toggle").checked,
    });
  } catch (error) {
    if (page.wanted) fail(`the camera did not start: ${error.message || error}`);
    return;
  }
  if (!page.wanted) {  // stopped while the camera started
    stream.getTracks().forEach((track) => track.stop());
    return;
  }
  page.stream = stream;
  $("local-video").srcObject = stream;
  await connect();
}

// One connection: a peer connection carrying the camera's tracks (the same ones every time) and a new session.
async function connect() {
  const generation = ++page.generation;
  const current = () => generation === page.generation && page.wanted;
  const again = page.recovering;
  const status = $("session-status");
  setStatus(status, again ? `reconnecting (attempt ${window.swapcast.attempt})…` : "connecting…");
  try {
    const servers = await iceServers();
    if (!current()) return;
    const pc = new RTCPeerConnection({ iceServers: servers });
    page.pc = pc;
    pc.addTransceiver(page.stream.getVideoTracks()[0], { direction: "sendrecv", streams: [page.stream] });
    for (const track of page.stream.getAudioTracks()) {
      pc.addTransceiver(track, { direction: "sendrecv", streams: [page.stream] });
    }
    pc.addEventListener("track", (event) => {
      const element = event.track.kind === "audio" ? $("remote-audio") : $("remote-video");
      element.srcObject = new MediaStream([event.track]);
    });
    pc.addEventListener("connectionstatechange", () => connectionChanged(pc, generation));

    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc);
    if (!current()) return;
    const response = await api(sessionsPath(), {
      method: "POST",
      headers: { "Content-Type": "application/sdp" },
      body: pc.localDescription.sdp,
      askKey: !again,
      signal: AbortSignal.timeout(CONNECT_TIMEOUT_MS),  // a server that never answers is one to try again
    });
    if (!response.ok) throw await refusal(response);
    const sessionUrl = response.headers.get("Location");
    if (!current()) {  // stopped, or given up on, while the server answered
      api(sessionUrl, { method: "DELETE", askKey: false }).catch(() => {});
      return;
    }
    page.sessionUrl = sessionUrl;
    page.rtspUrl = response.headers.get("X-RTSP-URL");
    window.swapcast.sessionUrl = sessionUrl;
    window.swapcast.identity = page.want.identity;
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    if (!current()) return;
    await applyOptions(sessionUrl);
    showRtsp();
    page.statsTimer = setInterval(updateStats, 1000);
    page.timers.connect = setTimeout(() => {
      if (current() && pc.connectionState !== "connected") lost("the connection did not come up");
    }, CONNECT_TIMEOUT_MS);
  } catch (error) {
    if (!current()) return;
    const message = error.message || String(error);
    if (error instanceof Refusal && error.permanent) {
      fail(again ? `stopped reconnecting: ${message}` : message);
    } else {
      lost(message, error instanceof Refusal ? error.retryAfterS : null);
    }
  }
}

function connectionChanged(pc, generation) {
  if (generation !== page.generation || !page.wanted) return;
  const status = $("session-status");
  const state = pc.connectionState;
  clearTimeout(page.timers.grace);
  if (state === "connected") {
    clearTimeout(page.timers.connect);
    window.swapcast.state = "live";
    window.swapcast.attempt = 0;
    page.everLive = true;
    if (page.recovering) {
      page.recovering = false;
      window.swapcast.reconnects += 1;
      setStatus(status, "Reconnected · live");
    } else {
      setStatus(status, "live");
    }
    clearTimeout(page.timers.stable);
    page.timers.stable = setTimeout(() => { page.failures = 0; }, STABLE_MS);
  } else if (state === "disconnected") {
    setStatus(status, "connection interrupted, waiting for it to come back…", true);
    page.timers.grace = setTimeout(() => {
      if (generation === page.generation && pc.connectionState === "disconnected") {
        lost("the connection was interrupted");
      }
    }, DISCONNECT_GRACE_MS);
  } else if (state === "failed" || state === "closed") {
    lost(`the connection ${state}`);
  }
}

// Drop the current connection (its server session too, if the server still holds it: that frees its slot).
function dropConnection() {
  page.generation += 1;
  clearInterval(page.statsTimer);
  page.statsTimer = null;
  clearTimers();
  const url = page.sessionUrl;
  page.sessionUrl = null;
  window.swapcast.sessionUrl = null;
  if (page.pc) page.pc.close();
  page.pc = null;
  page.lastBrowser = null;
  page.rtspUrl = null;
  window.swapcast.server = null;  // the next connection's stats start from nothing
  window.swapcast.browser = null;
  showRtsp();
  if (!url) return Promise.resolve();
  return api(url, { method: "DELETE", askKey: false }).catch(() => { /* the server ends it on its own */ });
}

// The connection is gone but the user still wants to stream: try again, later after each failure. Unless another
// session took our channel over (a second tab or device): taking it back would start the two taking it from each
// other for ever, so this page stops and says why.
function lost(reason, retryAfterS = null) {
  if (!page.wanted) return;
  const channel = page.want && page.want.channel;
  const mine = page.sessionUrl ? `session/${page.sessionUrl.split("/").pop()}` : null;
  if (!channel || !mine) {
    reconnectLater(reason, retryAfterS);
    return;
  }
  const generation = page.generation;
  channelPublisher(channel).then((publisher) => {
    if (!page.wanted || generation !== page.generation) return;
    if (publisher && publisher !== mine) {
      fail(`another session took channel ${channel} over; stopped here so that the two do not keep taking it back`);
    } else {
      reconnectLater(reason, retryAfterS);
    }
  });
}

// Who publishes into the channel now (`session/ID`, `stream/ID`), or null (nobody, or it cannot be read).
async function channelPublisher(channel) {
  try {
    const response = await api(`/v1/channels/${encodeURIComponent(channel)}`, { askKey: false });
    if (response.ok) return (await response.json()).publisher;
  } catch (_) { /* unreachable server: reconnecting is all there is to do */ }
  return null;
}

function reconnectLater(reason, retryAfterS) {
  if (!page.wanted) return;
  dropConnection();
  page.recovering = true;
  page.failures += 1;
  const attempt = page.failures;
  const base = BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length) - 1];
  let delay = base * (1 + 0.25 * Math.random());
  if (retryAfterS !== null && retryAfterS !== undefined) {
    delay = Math.max(delay, Math.min(retryAfterS, RETRY_AFTER_MAX_S) * 1000);
  }
  Object.assign(window.swapcast, { state: "reconnecting", error: reason, attempt });
  const due = Date.now() + delay;
  const what = page.everLive ? "Connection lost" : "Could not connect";
  const show = () => {
    const seconds = Math.max(1, Math.ceil((due - Date.now()) / 1000));
    const text = `${what} — reconnecting (attempt ${attempt}) in ${seconds} s… (${reason})`;
    setStatus($("session-status"), text, true);
  };
  show();
  page.timers.countdown = setInterval(show, 1000);
  page.timers.retry = setTimeout(() => {
    clearInterval(page.timers.countdown);
    if (page.wanted) connect();
  }, delay);
  updateButtons();
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

// Given up: what will not change by trying again (the identity gone, the key refused, the offer refused).
function fail(message) {
  teardown();
  Object.assign(window.swapcast, { state: "failed", error: message, attempt: 0 });
  setStatus($("session-status"), message, true);
}

async function stop() {
  await teardown();
  Object.assign(window.swapcast, { state: "stopped", attempt: 0 });
  setStatus($("session-status"), "stopped");
}

async function teardown() {
  page.wanted = false;
  page.recovering = false;
  const deleted = dropConnection();
  if (page.stream) page.stream.getTracks().forEach((track) => track.stop());
  page.stream = null;
  updateButtons();
  await deleted;
}

// ------------------------------------------------------------------------------------------------ stats

function ms(value) {
  return value === null || value === undefined ? "—" : `${Math.round(value)} ms`;
}

async function updateStats() {
  const pc = page.pc;
  const url = page.sessionUrl;
  if (!pc || !url) return;
  const still = () => pc === page.pc && url === page.sessionUrl;
  try {
    const response = await api(url, { askKey: false });
    if (!still()) return;
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
    } else if ([401, 403, 404].includes(response.status)) {
      // Gone, or no longer ours to see: a new session says why, if it is refused too.
      lost("the server ended the session");
      return;
    }
  } catch (_) { /* next tick */ }

  const report = await pc.getStats();
  if (!still()) return;
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
for (const choice of document.querySelectorAll("#whose input[name=whose]")) {
  choice.addEventListener("change", () => { renderPersonChoice(); switchLive(); });
}
$("person-select").addEventListener("change", switchLive);
$("face-lost-select").addEventListener("change", () =>
  applyOptions(page.sessionUrl, chosenOptions(), true).catch(() => {}));
$("start-button").addEventListener("click", start);
$("occlusion-toggle").addEventListener("change", () =>
  applyOptions(page.sessionUrl, { occlusion: $("occlusion-toggle").checked }, true).catch(() => {}));
$("mouth-toggle").addEventListener("change", () =>
  applyOptions(page.sessionUrl, { mouth_mask: $("mouth-toggle").checked }, true).catch(() => {}));
$("stop-button").addEventListener("click", stop);
$("channel-input").value = new URLSearchParams(location.search).get("channel") || "";
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
