// The service worker: the only part that talks to the swapcast server. It holds the host permission for the
// server's origin (granted at run time), so its requests need no CORS from the server, and it keeps the viewer
// token out of the pages: a page hands it an SDP offer and gets the answer back, nothing more.
"use strict";

importScripts("settings.js");

const S = self.SwapcastSettings;
const REQUEST_TIMEOUT_MS = 10000; // an answer that never comes must not hold getUserMedia up
const DETAIL_MAX = 300;

// The server's reason for a refusal: FastAPI's {"detail": ...} or the start of the body.
async function reasonOf(response) {
  const text = await response.text().catch(() => "");
  try {
    const detail = JSON.parse(text).detail;
    if (detail) return (typeof detail === "string" ? detail : JSON.stringify(detail)).slice(0, DETAIL_MAX);
  } catch {
    // not JSON: the text itself
  }
  return text.slice(0, DETAIL_MAX) || response.statusText;
}

// A request that got no answer: timed out, or the network's reason ("Failed to fetch": refused, no route, DNS).
function failure(error) {
  if (error && error.name === "TimeoutError") {
    return { ok: false, status: 0, reason: `no answer within ${REQUEST_TIMEOUT_MS / 1000} s` };
  }
  return { ok: false, status: 0, reason: String((error && error.message) || error) };
}

async function offer(sdp) {
  const settings = await S.load();
  if (!settings) return { ok: false, status: 0, reason: "not set up: open the extension's options" };
  if (typeof sdp !== "string" || !sdp.startsWith("v=0")) return { ok: false, status: 0, reason: "not an SDP offer" };
  const url = S.whepUrl(settings);
  const base = { server: settings.server, channel: settings.channel };
  try {
    const response = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${settings.token}` },
      body: sdp,
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    if (response.status !== 201) {
      return { ...base, ok: false, status: response.status, reason: await reasonOf(response) };
    }
    const location = response.headers.get("Location");
    const answer = await response.text();
    return { ...base, ok: true, status: 201, answer, resource: location ? new URL(location, url).href : null };
  } catch (error) {
    return { ...base, ...failure(error) };
  }
}

// Ends a viewer: only a resource under the configured channel's WHEP URL, whatever the page asks.
async function close(resource) {
  const settings = await S.load();
  if (!settings || typeof resource !== "string" || !resource.startsWith(`${S.whepUrl(settings)}/`)) {
    return { ok: false, status: 0, reason: "not this channel's viewer" };
  }
  try {
    const response = await fetch(resource, {
      method: "DELETE",
      headers: { Authorization: `Bearer ${settings.token}` },
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    return { ok: response.ok, status: response.status };
  } catch (error) {
    return failure(error);
  }
}

// Content scripts follow the settings and the granted origins; one change at a time (each replaces them all).
let syncing = Promise.resolve([]);
function sync() {
  syncing = syncing
    .catch(() => [])
    .then(async () => {
      const settings = await S.load();
      return S.syncContentScripts(settings ? settings.sites : []);
    });
  return syncing;
}

async function handle(message) {
  switch (message && message.type) {
    case "sync":
      return { ok: true, sites: await sync() };
    case "config":
      return S.pageView(await S.load());
    case "offer":
      return offer(message.sdp);
    case "close":
      return close(message.resource);
    default:
      return { ok: false, status: 0, reason: "unknown request" };
  }
}

chrome.runtime.onMessage.addListener((message, sender, reply) => {
  if (sender.id !== chrome.runtime.id) return false;
  handle(message).then(reply, (error) => reply(failure(error)));
  return true; // the reply comes later
});

// A site's permission taken away (chrome://extensions, or the options page): its scripts go with it.
chrome.permissions.onRemoved.addListener(() => sync());

chrome.action.onClicked.addListener(() => chrome.runtime.openOptionsPage());
