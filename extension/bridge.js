// The content script in the extension's isolated world, beside page.js in the page's own world: it carries
// page.js's requests (an SDP offer, the end of a viewer) to the service worker and the answers back. Both
// worlds share the window, so they talk with window.postMessage (and a DOM event for what must go out while
// the page unloads); a request carries nothing secret, and the
// service worker only ever posts offers to, and ends viewers of, the configured channel.
"use strict";

(() => {
  const FROM_PAGE = "swapcast:page";
  const FROM_BRIDGE = "swapcast:bridge";

  function post(body) {
    window.postMessage({ source: FROM_BRIDGE, ...body }, "*"); // to this same window only
  }

  async function ask(request) {
    try {
      return await chrome.runtime.sendMessage(request);
    } catch (error) {
      // The extension was reloaded or removed under the page.
      return { ok: false, status: 0, reason: `the extension is not reachable (${error.message})` };
    }
  }

  async function sendConfig() {
    const config = await ask({ type: "config" });
    post({ kind: "config", config: config && "configured" in config ? config : { configured: false } });
  }

  window.addEventListener("message", async (event) => {
    const data = event.data;
    if (event.source !== window || !data || data.source !== FROM_PAGE) return;
    if (data.kind === "hello") {
      await sendConfig();
    } else if (data.kind === "request" && typeof data.id === "number") {
      const { type, sdp, resource } = data.body || {};
      post({ kind: "response", id: data.id, body: await ask({ type, sdp, resource }) });
    }
  });
  // The end of a viewer, told synchronously (page.js's `tell`): sent on even while the page unloads.
  window.addEventListener(FROM_PAGE, (event) => {
    let body = null;
    try {
      body = JSON.parse(event.detail);
    } catch {
      return;
    }
    if (body && body.type === "close") ask({ type: "close", resource: body.resource });
  });
  sendConfig(); // page.js may have said hello before this script ran, or may say it after: both are answered
})();
