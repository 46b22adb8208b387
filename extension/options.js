// The options page: checks the settings, asks Chrome for the server's and the sites' origins (and nothing
// else), keeps the settings, drops the origins no longer needed, and has the service worker register the content
// scripts for the sites.
"use strict";

(() => {
  const S = self.SwapcastSettings;
  const form = document.getElementById("form");
  const status = document.getElementById("status");
  const FIELDS = ["server", "channel", "token", "sites", "sound"];

  document.getElementById("cors").textContent =
    `SWAPCAST_CORS_ORIGINS='["${new URL(chrome.runtime.getURL("")).origin}"]'`;

  function read() {
    return {
      server: form.server.value,
      channel: form.channel.value,
      token: form.token.value,
      sites: form.sites.value,
      always: form.always.checked,
      sound: form.sound.value,
    };
  }

  function showErrors(errors) {
    for (const field of FIELDS) document.getElementById(`${field}-error`).textContent = errors[field] || "";
  }

  function say(text) {
    status.textContent = text;
  }

  async function fill() {
    const settings = await S.load();
    if (!settings) return;
    form.server.value = settings.server;
    form.channel.value = settings.channel;
    form.token.value = settings.token;
    form.sites.value = settings.sites.join("\n");
    form.always.checked = settings.always;
    form.sound.value = settings.sound;
  }

  // Origins granted earlier and needed no longer (required ones, from the manifest, cannot be given back).
  async function dropUnused(needed) {
    const required = new Set(chrome.runtime.getManifest().host_permissions || []);
    const { origins = [] } = await chrome.permissions.getAll();
    const unused = origins.filter((origin) => !needed.includes(origin) && !required.has(origin));
    if (unused.length) await chrome.permissions.remove({ origins: unused });
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const { settings, errors } = S.validate(read());
    showErrors(errors || {});
    if (!settings) {
      say("Not saved: fix the fields marked above.");
      return;
    }
    const origins = [S.originPattern(settings.server), ...settings.sites.map(S.originPattern)];
    // Asked at once, inside the click: Chrome shows its prompt only in answer to the user's gesture.
    chrome.permissions.request({ origins }).then(
      async (granted) => {
        if (!granted) {
          say(`Not saved: Chrome did not grant access to ${origins.join(", ")}.`);
          return;
        }
        await chrome.storage.local.set({ [S.STORAGE_KEY]: settings });
        await dropUnused(origins);
        const { sites = [] } = (await chrome.runtime.sendMessage({ type: "sync" })) || {};
        say(`Saved. The swapcast camera is offered in ${sites.length} site(s); reload their tabs.`);
      },
      (error) => say(`Not saved: ${error.message}`),
    );
  });

  fill().catch((error) => say(`Could not read the settings: ${error.message}`));
})();
