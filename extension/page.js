// Runs in the page's own world at document_start, before the page's scripts: adds a camera named "swapcast" to
// navigator.mediaDevices. getUserMedia for it (or for any camera, with "always" on) returns a stream whose video
// is the swapcast channel's, pulled over WHEP by an RTCPeerConnection in this page; the offer and answer go
// through bridge.js to the service worker, which holds the server's address and the viewer token.
//
// The track handed to the page comes from a MediaStreamTrackGenerator fed with the receiver's frames: when the
// link drops and a new peer connection takes over, the page keeps the same track and sees the picture resume.
"use strict";

(() => {
  const PATCHED = Symbol.for("swapcast.camera");
  if (typeof MediaDevices === "undefined" || window[PATCHED]) return; // no cameras here (insecure), or done
  Object.defineProperty(window, PATCHED, { value: true });

  const FROM_PAGE = "swapcast:page";
  const FROM_BRIDGE = "swapcast:bridge";
  const DEVICE = { deviceId: "swapcast-camera", kind: "videoinput", label: "swapcast", groupId: "swapcast" };
  const CONFIG_WAIT_MS = 3000; // the bridge reads the settings from the service worker (waking it if asleep)
  const ASK_TIMEOUT_MS = 15000; // the service worker's own request times out at 10 s
  const FIRST_FRAME_MS = 20000; // getUserMedia gives up (and says why) after this long without a picture
  const GATHER_MS = 2000; // ICE candidates gathered by then are enough for a server on the network
  const STALL_MS = 4000; // no new frame for this long: connect again
  const RETRY_MS = [500, 1000, 2000, 4000, 8000, 10000];

  // ---- talking to bridge.js -------------------------------------------------------------------------------
  let config = null;
  const configWaiters = [];
  const pending = new Map();
  let nextId = 1;

  window.addEventListener("message", (event) => {
    const data = event.data;
    if (event.source !== window || !data || data.source !== FROM_BRIDGE) return;
    if (data.kind === "config" && data.config) {
      config = data.config;
      configWaiters.splice(0).forEach((resolve) => resolve(config));
    } else if (data.kind === "response" && pending.has(data.id)) {
      pending.get(data.id)(data.body || { ok: false, status: 0, reason: "an empty answer" });
      pending.delete(data.id);
    }
  });
  window.postMessage({ source: FROM_PAGE, kind: "hello" }, "*");

  function currentConfig() {
    if (config) return Promise.resolve(config);
    return new Promise((resolve) => {
      configWaiters.push(resolve);
      setTimeout(() => resolve(config || { configured: false }), CONFIG_WAIT_MS);
    });
  }

  // Fire and forget, synchronously: a DOM event reaches bridge.js at once, even from a page that is going away
  // (a posted message would wait for a task that never runs).
  function tell(body) {
    window.dispatchEvent(new CustomEvent(FROM_PAGE, { detail: JSON.stringify(body) }));
  }

  function ask(body) {
    const id = nextId++;
    return new Promise((resolve) => {
      pending.set(id, resolve);
      window.postMessage({ source: FROM_PAGE, kind: "request", id, body }, "*");
      setTimeout(() => {
        if (pending.delete(id)) resolve({ ok: false, status: 0, reason: "the extension did not answer" });
      }, ASK_TIMEOUT_MS);
    });
  }

  // ---- errors as getUserMedia's own -------------------------------------------------------------------------
  function refusal(name, message) {
    return new DOMException(`swapcast: ${message}`, name);
  }

  function errorFor(result) {
    const where = result.server ? ` (${result.server}, channel "${result.channel}")` : "";
    const reason = result.reason || "";
    if (result.status === 401) {
      const fix = "check the token in the extension's options";
      return refusal("NotAllowedError", `the server refused the viewer token${where}: 401 ${reason}; ${fix}`);
    }
    if (result.status === 403) {
      return refusal("NotAllowedError", `the server refused the request${where}: 403 ${reason}`);
    }
    if (result.status === 404) return refusal("NotFoundError", `no such channel${where}: 404 ${reason}`);
    if (result.status) return refusal("NotReadableError", `the server answered ${result.status}${where}: ${reason}`);
    return refusal("NotReadableError", `cannot reach the server${where}: ${reason}`);
  }

  // ---- one kind of media: the receiver's frames into a track that outlives peer connections ----------------
  class Relay {
    constructor(kind, onFrame) {
      this.generator = new MediaStreamTrackGenerator({ kind });
      this.writer = this.generator.writable.getWriter();
      this.reader = null;
      this.onFrame = onFrame;
    }

    async follow(track) {
      if (this.reader) this.reader.cancel().catch(() => {});
      const reader = (this.reader = new MediaStreamTrackProcessor({ track }).readable.getReader());
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) return;
          if (this.reader !== reader) {
            value.close();
            return;
          }
          this.onFrame();
          await this.writer.write(value); // the generator takes the frame (and closes it)
        }
      } catch {
        // the track or the generator ended: the link's stall check decides what comes next
      }
    }

    stop() {
      if (this.reader) this.reader.cancel().catch(() => {});
      this.reader = null;
      this.writer.close().catch(() => {});
    }
  }

  function gathered(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
      setTimeout(resolve, GATHER_MS);
    });
  }

  // ---- the WHEP viewer of the channel, reconnecting on its own ----------------------------------------------
  class Link {
    constructor(withAudio) {
      this.video = new Relay("video", () => this.framed());
      this.audio = withAudio ? new Relay("audio", () => {}) : null;
      this.pc = null;
      this.resource = null;
      this.closed = false;
      this.failures = 0;
      this.retrying = null;
      this.connecting = false;
      this.lastFrameAt = 0;
      this.firstFrame = null;
      this.live = new Set(); // the tracks the page holds: the link ends when the last one stops
      this.stats = { connects: 0, frames: 0, reconnecting: false, lastError: null };
    }

    framed() {
      this.lastFrameAt = performance.now();
      this.stats.frames += 1;
      if (this.failures) this.failures = 0; // frames flow again: the next failure starts the backoff over
      this.stats.reconnecting = false;
      if (this.firstFrame) this.firstFrame();
    }

    async start() {
      const picture = new Promise((resolve) => (this.firstFrame = resolve));
      let timer = null;
      const late = new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(refusal("NotReadableError", `no picture from the channel within ${FIRST_FRAME_MS / 1000} s`)),
          FIRST_FRAME_MS,
        );
      });
      try {
        await Promise.race([this.connect().then(() => picture), late]);
      } catch (error) {
        this.close();
        throw error;
      } finally {
        clearTimeout(timer);
        this.firstFrame = null;
      }
      this.watch = setInterval(() => this.check(), 500);
    }

    async connect() {
      this.release();
      const pc = (this.pc = new RTCPeerConnection());
      pc.addTransceiver("video", { direction: "recvonly" });
      if (this.audio) pc.addTransceiver("audio", { direction: "recvonly" });
      pc.ontrack = (event) => {
        if (pc !== this.pc) return;
        const relay = event.track.kind === "video" ? this.video : this.audio;
        if (relay) relay.follow(event.track);
      };
      pc.onconnectionstatechange = () => {
        if (pc === this.pc && ["failed", "closed"].includes(pc.connectionState)) {
          this.retry(`the connection ${pc.connectionState}`);
        }
      };
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      if (pc !== this.pc) return;
      const result = await ask({ type: "offer", sdp: pc.localDescription.sdp });
      if (pc !== this.pc) {
        if (result.ok && result.resource) tell({ type: "close", resource: result.resource });
        return;
      }
      if (!result.ok) throw errorFor(result);
      this.resource = result.resource;
      await pc.setRemoteDescription({ type: "answer", sdp: result.answer });
      this.stats.connects += 1;
      this.lastFrameAt = performance.now();
    }

    check() {
      if (this.closed || this.retrying || this.connecting) return;
      if (performance.now() - this.lastFrameAt > STALL_MS) this.retry(`no picture for ${STALL_MS / 1000} s`);
    }

    retry(reason) {
      if (this.closed || this.retrying) return;
      this.stats.lastError = reason;
      this.stats.reconnecting = true;
      const base = RETRY_MS[Math.min(this.failures, RETRY_MS.length - 1)];
      this.failures += 1;
      this.retrying = setTimeout(async () => {
        this.retrying = null;
        this.connecting = true;
        try {
          await this.connect();
        } catch (error) {
          this.connecting = false;
          this.retry(error.message);
        } finally {
          this.connecting = false;
        }
      }, base * (1 + 0.25 * Math.random()));
    }

    // Ends the current peer connection and its viewer on the server.
    release() {
      const pc = this.pc;
      const resource = this.resource;
      this.pc = null;
      this.resource = null;
      if (pc) pc.close();
      if (resource) tell({ type: "close", resource });
    }

    close() {
      if (this.closed) return;
      this.closed = true;
      clearInterval(this.watch);
      clearTimeout(this.retrying);
      this.release();
      this.video.stop();
      if (this.audio) this.audio.stop();
      links.delete(this);
    }

    // Hands `track` to the page, dressed as the camera's, and notices when the page stops it (or a clone).
    adopt(track) {
      this.live.add(track);
      const link = this;
      const stop = track.stop;
      const clone = track.clone;
      const getSettings = track.getSettings;
      Object.defineProperties(track, {
        label: { value: track.kind === "video" ? DEVICE.label : "swapcast (channel sound)", configurable: true },
        stop: {
          configurable: true,
          value: function () {
            stop.call(this);
            link.live.delete(this);
            if (!link.live.size) link.close();
          },
        },
        clone: {
          configurable: true,
          value: function () {
            return link.adopt(clone.call(this));
          },
        },
        getSettings: {
          configurable: true,
          value: function () {
            const settings = getSettings.call(this);
            if (track.kind !== "video") return settings;
            return { ...settings, deviceId: DEVICE.deviceId, groupId: DEVICE.groupId };
          },
        },
      });
      return track;
    }
  }

  const links = new Set();
  window.addEventListener("pagehide", () => [...links].forEach((link) => link.close()));
  // For whoever wants to know how the camera is doing (the tests, a curious developer in the console).
  Object.defineProperty(window, "swapcastCamera", {
    value: Object.freeze({ links: () => [...links].map((link) => ({ ...link.stats })) }),
  });

  // ---- navigator.mediaDevices -------------------------------------------------------------------------------
  function deviceInfo() {
    const proto = (window.InputDeviceInfo || window.MediaDeviceInfo).prototype;
    const device = Object.create(proto);
    for (const [key, value] of Object.entries(DEVICE)) {
      Object.defineProperty(device, key, { value, enumerable: true });
    }
    Object.defineProperties(device, {
      toJSON: { value: () => ({ ...DEVICE }) },
      getCapabilities: { value: () => ({ deviceId: DEVICE.deviceId, groupId: DEVICE.groupId }) },
    });
    return device;
  }

  // Whether a deviceId constraint (a string, a list, {exact}, {ideal}) names the swapcast camera.
  function names(value) {
    if (!value) return false;
    if (typeof value === "string") return value === DEVICE.deviceId;
    if (Array.isArray(value)) return value.includes(DEVICE.deviceId);
    return names(value.exact) || names(value.ideal);
  }

  function wantsSwapcast(constraints, cfg) {
    const video = constraints && constraints.video;
    if (!video) return false;
    if (cfg.always) return true;
    if (typeof video !== "object") return false;
    return names(video.deviceId) || (Array.isArray(video.advanced) && video.advanced.some((c) => names(c.deviceId)));
  }

  async function swapcastStream(mediaDevices, constraints, cfg) {
    if (typeof MediaStreamTrackGenerator === "undefined") {
      throw refusal("NotSupportedError", "this browser has no MediaStreamTrackGenerator (Chrome or Edge 94+ has)");
    }
    const channelSound = Boolean(constraints.audio) && cfg.sound === "channel";
    const link = new Link(channelSound);
    links.add(link);
    await link.start();
    const tracks = [link.adopt(link.video.generator)];
    if (channelSound) tracks.push(link.adopt(link.audio.generator));
    else if (constraints.audio) {
      try {
        const mic = await originalGetUserMedia.call(mediaDevices, { audio: constraints.audio });
        tracks.push(...mic.getAudioTracks());
      } catch (error) {
        link.close();
        throw error;
      }
    }
    return new MediaStream(tracks);
  }

  const proto = MediaDevices.prototype;
  const originalEnumerate = proto.enumerateDevices;
  const originalGetUserMedia = proto.getUserMedia;

  Object.defineProperty(proto, "enumerateDevices", {
    configurable: true,
    writable: true,
    value: async function enumerateDevices() {
      const devices = await originalEnumerate.call(this);
      const cfg = await currentConfig();
      if (!cfg.configured) return devices;
      return cfg.always ? [deviceInfo(), ...devices] : [...devices, deviceInfo()];
    },
  });

  Object.defineProperty(proto, "getUserMedia", {
    configurable: true,
    writable: true,
    value: async function getUserMedia(constraints) {
      const cfg = await currentConfig();
      if (!cfg.configured || !wantsSwapcast(constraints, cfg)) return originalGetUserMedia.call(this, constraints);
      return swapcastStream(this, constraints, cfg);
    },
  });
})();
