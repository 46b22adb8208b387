// swapcast web page, the channels panel: create, list, rotate and delete the streamer's channels, copy their OBS
// addresses, and pick one for the live stream. Uses `$`, `api`, `errorText`, `setStatus` and `page` from app.js.
"use strict";

const CHANNEL_REFRESH_MS = 5000;

const channelsPanel = {
  list: [],
  timer: null,
};

window.swapcast.channels = [];  // GET /v1/channels, as last read

async function loadChannels() {
  let response;
  try {
    response = await api("/v1/channels", { askKey: false });
  } catch (_) {
    return;  // unreachable: the next refresh tries again
  }
  if (response.status === 503 || response.status === 403) {
    $("channels-off").hidden = false;
    setStatus($("channels-off"), `channels are not available: ${await errorText(response)}`, true);
    $("channel-form").hidden = true;
    return;
  }
  if (!response.ok) return;
  $("channels-off").hidden = true;
  $("channel-form").hidden = false;
  channelsPanel.list = (await response.json()).channels;
  window.swapcast.channels = channelsPanel.list;
  renderChannels();
}

// What OBS shows now: the publisher's frames, its last frame held after it left, or the slate.
function channelState(channel) {
  const watching = Object.values(channel.consumers || {}).reduce((sum, n) => sum + n, 0);
  const audience = watching ? ` · ${watching} watching` : "";
  if (channel.publisher && channel.showing === "published") return `live from a ${channel.publisher.split("/")[0]}${audience}`;
  return `${channel.showing === "held" ? "last frame held" : "slate"}, nobody publishing${audience}`;
}

function channelButton(text, label, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = text;
  button.setAttribute("aria-label", label);
  button.addEventListener("click", onClick);
  return button;
}

function renderChannels() {
  const list = $("channel-list");
  const focused = document.activeElement && document.activeElement.dataset.action;
  const focusedChannel = document.activeElement && document.activeElement.closest("#channel-list li");
  list.replaceChildren();
  const picked = $("channel-input").value.trim();
  for (const channel of channelsPanel.list) {
    const item = document.createElement("li");
    item.dataset.name = channel.name;
    item.classList.toggle("picked", channel.name === picked);

    const title = document.createElement("strong");
    title.textContent = channel.name;
    const state = document.createElement("span");
    state.className = "status";
    state.textContent = channelState(channel);
    const url = document.createElement("code");
    url.textContent = channel.rtsp_url || "RTSP is off on this server";

    const actions = document.createElement("div");
    actions.className = "actions";
    const use = channelButton("Use for live", `stream into channel ${channel.name}`, () => pickChannel(channel.name));
    use.disabled = page.wanted;
    const copy = channelButton("Copy RTSP URL", `copy the OBS RTSP URL of channel ${channel.name}`, () =>
      copyText(channel.rtsp_url || "", `RTSP URL of ${channel.name} copied`));
    copy.disabled = !channel.rtsp_url;
    const rotate = channelButton("Rotate", `new RTSP password and Browser Source URL for ${channel.name}`, () =>
      rotateChannel(channel.name));
    const remove = channelButton("Delete", `delete channel ${channel.name}`, () => deleteChannel(channel.name));
    for (const [button, action] of [[use, "use"], [copy, "copy"], [rotate, "rotate"], [remove, "delete"]]) {
      button.dataset.action = action;
    }
    actions.append(use, copy, rotate, remove);
    item.append(title, state, url, actions);
    list.append(item);
    // A refresh keeps keyboard focus where it was.
    if (focusedChannel && focusedChannel.dataset.name === channel.name && focused) {
      actions.querySelector(`[data-action="${focused}"]`)?.focus();
    }
  }
  $("channel-empty").hidden = channelsPanel.list.length > 0;
}

function pickChannel(name) {
  if (page.wanted) return;  // the channel is fixed while a stream runs
  $("channel-input").value = name;
  setStatus($("channel-status"), `the next stream goes to channel ${name}`);
  renderChannels();
  $("start-button").focus();
}

function copyText(text, done) {
  navigator.clipboard.writeText(text).then(
    () => setStatus($("channel-status"), done),
    () => setStatus($("channel-status"), "copying was refused by the browser: select the text instead", true),
  );
}

// The viewer token comes back only when a channel is made or rotated (the server keeps its hash), so its
// Browser Source URL is shown then, once.
function showSecret(channel) {
  $("channel-secret").hidden = false;
  $("channel-secret-name").textContent = channel.name;
  $("channel-view-url").textContent = new URL(channel.view_url, location.href).href;
}

async function createChannel(event) {
  event.preventDefault();
  const name = $("channel-name").value.trim();
  if (!name) return;
  setStatus($("channel-status"), "creating…");
  const response = await api("/v1/channels", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name }),
  });
  if (!response.ok) {
    setStatus($("channel-status"), `not created: ${await errorText(response)}`, true);
    return;
  }
  const channel = await response.json();
  $("channel-form").reset();
  showSecret(channel);
  setStatus($("channel-status"), `created ${channel.name}`);
  await loadChannels();
}

async function rotateChannel(name) {
  const sure = window.confirm(
    `Rotate ${name}? Its RTSP URL and Browser Source URL change: OBS must be given the new ones.`);
  if (!sure) return;
  const response = await api(`/v1/channels/${encodeURIComponent(name)}/rotate`, { method: "POST" });
  if (!response.ok) {
    setStatus($("channel-status"), `not rotated: ${await errorText(response)}`, true);
    return;
  }
  showSecret(await response.json());
  setStatus($("channel-status"), `${name} has new addresses: update OBS`);
  await loadChannels();
}

async function deleteChannel(name) {
  if (!window.confirm(`Delete ${name}? OBS loses it and whatever streams into it stops.`)) return;
  const response = await api(`/v1/channels/${encodeURIComponent(name)}`, { method: "DELETE" });
  if (!response.ok && response.status !== 404) {
    setStatus($("channel-status"), `not deleted: ${await errorText(response)}`, true);
    return;
  }
  if ($("channel-secret-name").textContent === name) $("channel-secret").hidden = true;
  if ($("channel-input").value.trim() === name && !page.wanted) $("channel-input").value = "";
  setStatus($("channel-status"), `deleted ${name}`);
  await loadChannels();
}

$("channel-form").addEventListener("submit", createChannel);
$("copy-channel-view").addEventListener("click", () =>
  copyText($("channel-view-url").textContent, "Browser Source URL copied"));
$("channel-input").addEventListener("input", renderChannels);
loadChannels();
channelsPanel.timer = setInterval(() => { if (!document.hidden) loadChannels(); }, CHANNEL_REFRESH_MS);
