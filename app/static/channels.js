// swapcast web page, the channels panel: create, list, rotate and delete the streamer's channels, copy their OBS
// addresses, pick one for the live stream, and push a channel to platforms (RTMP/RTMPS, SRT, WHIP).
// Uses `$`, `api`, `errorText`, `setStatus` and `page` from app.js.
"use strict";

const CHANNEL_REFRESH_MS = 5000;

const channelsPanel = {
  list: [],
  pushes: {},            // channel name -> its pushes (GET /v1/channels/NAME/pushes), or null where not offered
  open: new Set(),       // channels whose pushes are unfolded
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
  await Promise.all(channelsPanel.list.map((channel) => loadPushes(channel.name)));
  if (!editingPush()) renderChannels();  // a refresh never wipes what someone is typing
}

async function loadPushes(name) {
  try {
    const response = await api(`/v1/channels/${encodeURIComponent(name)}/pushes`, { askKey: false });
    channelsPanel.pushes[name] = response.ok ? (await response.json()).pushes : null;
  } catch (_) { /* kept as it was: the next refresh tries again */ }
}

function editingPush() {
  const inputs = [...document.querySelectorAll("#channel-list .push-form input")];
  return inputs.some((input) => input === document.activeElement || input.value !== "");
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
    // The SRT URL (OBS Media Source, input format mpegts) where the server has an SRT port.
    const copySrt = channelButton("Copy SRT URL", `copy the OBS SRT URL of channel ${channel.name}`, () =>
      copyText(channel.srt_url || "", `SRT URL of ${channel.name} copied`));
    copySrt.hidden = !channel.srt_url;
    const rotate = channelButton("Rotate", `new RTSP/SRT password and Browser Source URL for ${channel.name}`, () =>
      rotateChannel(channel.name));
    const remove = channelButton("Delete", `delete channel ${channel.name}`, () => deleteChannel(channel.name));
    const buttons = [[use, "use"], [copy, "copy"], [copySrt, "copy-srt"], [rotate, "rotate"], [remove, "delete"]];
    for (const [button, action] of buttons) {
      button.dataset.action = action;
    }
    actions.append(use, copy, copySrt, rotate, remove);
    item.append(title, state, url, actions);
    if (channelsPanel.pushes[channel.name]) item.append(pushesOf(channel.name, channelsPanel.pushes[channel.name]));
    list.append(item);
    // A refresh keeps keyboard focus where it was.
    if (focusedChannel && focusedChannel.dataset.name === channel.name && focused) {
      actions.querySelector(`[data-action="${focused}"]`)?.focus();
    }
  }
  $("channel-empty").hidden = channelsPanel.list.length > 0;
}

// ------------------------------------------------------------------------------------------------ pushes

function pushLine(push) {
  const parts = [push.state];
  if (push.state === "live") parts.push(`${Math.round(push.bitrate_kbps)} kbit/s`);
  if (push.reconnects) parts.push(`${push.reconnects} reconnects`);
  if (push.last_error && push.state !== "live") parts.push(push.last_error);
  return parts.join(" · ");
}

// A channel's pushes, folded: each destination (its secrets shown as ***) with its state, and a form to add one.
function pushesOf(name, pushes) {
  const details = document.createElement("details");
  details.className = "pushes";
  details.open = channelsPanel.open.has(name);
  details.addEventListener("toggle", () => {
    if (details.open) channelsPanel.open.add(name);
    else channelsPanel.open.delete(name);
  });
  const summary = document.createElement("summary");
  const live = pushes.filter((push) => push.state === "live").length;
  summary.textContent = `Pushes to platforms (${pushes.length}${pushes.length ? `, ${live} live` : ""})`;
  const list = document.createElement("ul");
  for (const push of pushes) {
    const entry = document.createElement("li");
    entry.dataset.push = push.id;
    const where = document.createElement("code");
    where.textContent = push.url;
    const state = document.createElement("span");
    state.className = push.state === "live" ? "status" : "status error";
    state.classList.toggle("error", push.state !== "live" && Boolean(push.last_error));
    state.textContent = pushLine(push);
    const remove = channelButton("Remove", `stop pushing ${name} to ${push.url}`, () => removePush(name, push.id));
    entry.append(where, state, remove);
    list.append(entry);
  }
  const form = document.createElement("form");
  form.className = "push-form";
  const url = document.createElement("input");
  url.type = "text";
  url.name = "url";
  url.required = true;
  url.placeholder = "rtmp://live.twitch.tv/app, srt://host:port or a WHIP URL";
  url.setAttribute("aria-label", `where to push channel ${name}: an rtmp://, rtmps://, srt:// or WHIP https:// URL`);
  const key = document.createElement("input");
  key.type = "password";
  key.name = "key";
  key.autocomplete = "off";
  key.placeholder = "stream key or WHIP token";
  key.setAttribute("aria-label", `stream key (RTMP) or Bearer token (WHIP) for channel ${name}; kept, never shown`);
  const add = document.createElement("button");
  add.type = "submit";
  add.textContent = "Add push";
  add.setAttribute("aria-label", `add a push of channel ${name}`);
  form.append(url, key, add);
  form.addEventListener("submit", (event) => addPush(event, name, form));
  details.append(summary, list, form);
  return details;
}

async function addPush(event, name, form) {
  event.preventDefault();
  const url = form.elements.url.value.trim();
  const key = form.elements.key.value;
  const body = key ? { url, key } : { url };
  setStatus($("channel-status"), `adding a push of ${name}…`);
  const response = await api(`/v1/channels/${encodeURIComponent(name)}/pushes`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!response.ok) {
    setStatus($("channel-status"), `push not added: ${await errorText(response)}`, true);
    return;
  }
  const push = await response.json();
  form.reset();  // the key leaves the page: the server keeps it and never shows it again
  setStatus($("channel-status"), `${name} now pushes to ${push.url}`);
  await loadChannels();
}

async function removePush(name, id) {
  const response = await api(`/v1/channels/${encodeURIComponent(name)}/pushes/${id}`, { method: "DELETE" });
  if (!response.ok && response.status !== 404) {
    setStatus($("channel-status"), `push not removed: ${await errorText(response)}`, true);
    return;
  }
  setStatus($("channel-status"), `push of ${name} removed`);
  await loadChannels();
}

// ------------------------------------------------------------------------------------------------ picking

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
    `Rotate ${name}? Its RTSP URL, SRT URL and Browser Source URL change: OBS must be given the new ones.`);
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
