// The extension's settings: what the options page checks before saving, where they are kept, and the content
// scripts they imply. Shared by the options page (a <script> before options.js) and the service worker
// (importScripts); no chrome.* call runs at load, so `node` can load it to test the checks.
"use strict";

(function (root) {
  const STORAGE_KEY = "settings";
  const SOUNDS = ["microphone", "channel"];
  const CHANNEL_NAME = /^[a-z0-9_-]{1,63}$/; // the server's rule for channel names
  const LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"];
  // The ids of the two scripts registered per site: the patch in the page's world, the bridge beside it.
  const SCRIPT_IDS = ["swapcast-page", "swapcast-bridge"];

  function parseUrl(text) {
    try {
      return new URL(text);
    } catch {
      return null;
    }
  }

  function isLoopback(url) {
    return LOOPBACK_HOSTS.includes(url.hostname) || url.hostname.startsWith("127.");
  }

  // The server's base URL (origin plus an optional path prefix, no trailing slash), or an error message.
  function checkServer(text) {
    const value = (text || "").trim();
    if (!value) return { error: "Enter the server's address, e.g. https://swap.example.com" };
    const url = parseUrl(value);
    if (!url || !["https:", "http:"].includes(url.protocol)) {
      return { error: "The server's address must start with https:// (or http://), e.g. https://swap.example.com" };
    }
    if (url.username || url.password) return { error: "Leave the login out of the server's address" };
    if (url.search || url.hash) return { error: "The server's address takes no ?query or #fragment" };
    return { value: url.origin + url.pathname.replace(/\/+$/, "") };
  }

  // A site to offer the camera in: an origin (https, or http on this computer), or an error message.
  function checkSite(text) {
    const url = parseUrl(text);
    if (!url || !["https:", "http:"].includes(url.protocol)) {
      return { error: `"${text}" is not a site: write it as https://meet.google.com` };
    }
    if (url.protocol === "http:" && !isLoopback(url)) {
      return { error: `"${text}": browsers give cameras only to https:// sites (or http:// on this computer)` };
    }
    if (url.pathname !== "/" || url.search || url.hash || url.username) {
      return { error: `"${text}": give the site alone, without a path (https://${url.host})` };
    }
    return { value: url.origin };
  }

  // Checks what the options form holds; returns {settings} or {errors: {field: message}}.
  function validate(input) {
    const errors = {};
    const server = checkServer(input.server);
    if (server.error) errors.server = server.error;
    const channel = (input.channel || "").trim();
    if (!CHANNEL_NAME.test(channel)) {
      errors.channel = "The channel's name: 1-63 lowercase letters, digits, - and _ (as made on the server)";
    }
    const token = (input.token || "").trim();
    if (!token) errors.token = "Paste the channel's viewer token: vt_..., the token= part of its Browser Source URL";
    else if (/\s/.test(token) || token.length > 4096) errors.token = "The viewer token has spaces in it or is too long";
    const sites = [];
    for (const line of String(input.sites || "").split(/[\s,]+/).filter(Boolean)) {
      const site = checkSite(line);
      if (site.error) {
        errors.sites = site.error;
        break;
      }
      if (!sites.includes(site.value)) sites.push(site.value);
    }
    if (!errors.sites && sites.length === 0) {
      errors.sites = "Add at least one site to offer the camera in, e.g. https://meet.google.com";
    }
    const sound = input.sound || "microphone";
    if (!SOUNDS.includes(sound)) errors.sound = `Sound is one of: ${SOUNDS.join(", ")}`;
    if (Object.keys(errors).length) return { errors };
    return {
      settings: { server: server.value, channel, token, sites, always: Boolean(input.always), sound },
    };
  }

  // The match pattern granting access to an origin (with its port: nothing else on that host).
  function originPattern(urlText) {
    const url = new URL(urlText);
    return `${url.protocol}//${url.host}/*`;
  }

  function whepUrl(settings) {
    return `${settings.server}/v1/channels/${encodeURIComponent(settings.channel)}/whep`;
  }

  // What a page may know: whether the camera is there and how it behaves, never the server or the token.
  function pageView(settings) {
    if (!settings) return { configured: false };
    return { configured: true, always: settings.always, sound: settings.sound };
  }

  async function load() {
    const stored = await chrome.storage.local.get(STORAGE_KEY);
    return stored[STORAGE_KEY] || null;
  }

  // The content scripts for `sites` (those the extension holds a permission for), replacing any before.
  async function syncContentScripts(sites) {
    const registered = await chrome.scripting.getRegisteredContentScripts({ ids: SCRIPT_IDS });
    if (registered.length) await chrome.scripting.unregisterContentScripts({ ids: registered.map((s) => s.id) });
    const granted = [];
    for (const site of sites) {
      if (await chrome.permissions.contains({ origins: [originPattern(site)] })) granted.push(originPattern(site));
    }
    if (!granted.length) return [];
    const common = { matches: granted, runAt: "document_start", allFrames: true, persistAcrossSessions: true };
    await chrome.scripting.registerContentScripts([
      { ...common, id: SCRIPT_IDS[0], js: ["page.js"], world: "MAIN" },
      { ...common, id: SCRIPT_IDS[1], js: ["bridge.js"], world: "ISOLATED" },
    ]);
    return granted;
  }

  root.SwapcastSettings = {
    STORAGE_KEY,
    SOUNDS,
    validate,
    originPattern,
    whepUrl,
    pageView,
    load,
    syncContentScripts,
  };
})(typeof self !== "undefined" ? self : globalThis);
