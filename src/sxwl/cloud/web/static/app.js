// Console behaviour that needs script: accessKey reveal/copy/rotate, copy buttons on commands,
// confirmation dialogs, and the live parts of 算力详情 / 可用算力 that refresh without a reload.
(function () {
  "use strict";
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";

  async function api(method, path) {
    const response = await fetch(path, {
      method,
      credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, "Accept": "application/json" },
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error?.message || response.statusText);
    return body;
  }

  async function copyText(text, button) {
    await navigator.clipboard.writeText(text);
    // Remember the label once: a second click within the delay must not make "copied" the label.
    if (button.dataset.label === undefined) button.dataset.label = button.textContent;
    button.textContent = button.dataset.copied || "✓";
    clearTimeout(button._copiedTimer);
    button._copiedTimer = setTimeout(() => { button.textContent = button.dataset.label; }, 1500);
  }

  const keyBox = document.getElementById("access-key");
  if (keyBox) {
    const revealButton = document.getElementById("reveal-key");
    const errorBox = document.getElementById("key-error");
    const masked = keyBox.textContent;
    let key = null;
    const fail = (err) => { errorBox.textContent = err.message; errorBox.hidden = false; };
    const fetchKey = async () => key || (key = (await api("GET", "/api/v1/me/access-key")).access_key);

    revealButton.addEventListener("click", async () => {
      try {
        if (keyBox.dataset.masked === "true") {
          keyBox.textContent = await fetchKey();
          keyBox.dataset.masked = "false";
          revealButton.textContent = revealButton.dataset.hide;
        } else {
          keyBox.textContent = masked;
          keyBox.dataset.masked = "true";
          revealButton.textContent = revealButton.dataset.show;
        }
      } catch (err) { fail(err); }
    });

    document.getElementById("copy-key").addEventListener("click", async (event) => {
      try { await copyText(await fetchKey(), event.currentTarget); } catch (err) { fail(err); }
    });

    const dialog = document.getElementById("rotate-dialog");
    document.getElementById("rotate-key").addEventListener("click", () => {
      // The spec lets Escape close the dialog without touching returnValue (Chromium clears it, not every
      // browser need): never let a "confirm" left by a failed try rotate the key on Escape.
      dialog.returnValue = "";
      dialog.showModal();
    });
    dialog.addEventListener("close", async () => {
      if (dialog.returnValue !== "confirm") return;
      try {
        key = (await api("POST", "/api/v1/me/access-key/rotate")).access_key;
        // Reload so the masked hint and the history table show the new key.
        window.location.assign("/account?rotated=1");
      } catch (err) { fail(err); }
    });
    if (new URLSearchParams(window.location.search).has("rotated")) {
      document.getElementById("rotate-done").hidden = false;
    }
  }

  document.querySelectorAll(".copy-code").forEach((button) => {
    button.addEventListener("click", async () => {
      const pre = button.parentElement.querySelector("pre");
      await copyText(pre.textContent.trim(), button);
    });
  });
  // Buttons that open a confirmation <dialog>; the dialog's own form posts (with its CSRF field) or,
  // through formmethod="dialog" / Escape, just closes.
  document.addEventListener("click", (event) => {
    const opener = event.target.closest?.("[data-open-dialog]");
    if (!opener) return;
    const dialog = document.getElementById(opener.dataset.openDialog);
    if (dialog && !dialog.open) dialog.showModal();
  });

  // ---- live sections --------------------------------------------------------------------------
  // A [data-live-src] box holds a server-rendered fragment (one .live-root element). Every few
  // seconds the fragment is fetched again and merged in: items with data-key are matched by key,
  // and inside the root or an item only its [data-live] regions are replaced. So an open <details>,
  // an open dialog, focus, and a name being typed are left alone. "N s ago" (.ago[data-age]) ticks
  // every second in between.
  const ownerOf = (el) => el.parentElement?.closest("[data-key]") || null;
  const regionsOf = (scope) => {
    const owner = scope.matches("[data-key]") ? scope : null;
    return [...scope.querySelectorAll("[data-live]")].filter((el) => ownerOf(el) === owner);
  };

  function patchRegions(scope, fresh) {
    const freshRegions = new Map(regionsOf(fresh).map((el) => [el.dataset.live, el]));
    regionsOf(scope).forEach((region) => {
      const next = freshRegions.get(region.dataset.live);
      if (next && region.innerHTML !== next.innerHTML) {
        region.replaceChildren(...[...next.childNodes].map((n) => document.importNode(n, true)));
      }
    });
  }

  function busy(item) {
    const active = document.activeElement;
    if (active && item.contains(active) && active.matches("input, textarea, select")) return true;
    if (item.querySelector("dialog[open]")) return true;
    return [...item.querySelectorAll("input:not([type=hidden]), textarea")].some((i) => i.value !== i.defaultValue);
  }

  function syncInputs(item, fresh) {
    // A field the server fills in (the CPod's name) follows a change made elsewhere, unless someone is
    // typing in it, changed it, or it shows an error about what they typed.
    item.querySelectorAll("input[data-sync]").forEach((input) => {
      const next = fresh.querySelector(`#${CSS.escape(input.id)}`);
      if (!next || input === document.activeElement || input.value !== input.defaultValue) return;
      if (input.closest(".has-error") || input.defaultValue === next.defaultValue) return;
      input.defaultValue = next.defaultValue;
      input.value = next.defaultValue;
    });
  }

  function replaceItem(item, fresh) {
    const node = document.importNode(fresh, true);
    item.querySelectorAll("details[id]").forEach((old) => {
      const twin = node.querySelector(`#${CSS.escape(old.id)}`);
      if (twin) twin.open = old.open;
    });
    item.replaceWith(node);
    return node;
  }

  function syncList(list, freshList) {
    const current = new Map([...list.children].filter((el) => el.dataset.key).map((el) => [el.dataset.key, el]));
    let previous = null;
    [...freshList.children].filter((el) => el.dataset.key).forEach((fresh) => {
      let item = current.get(fresh.dataset.key);
      current.delete(fresh.dataset.key);
      if (!item) {
        item = document.importNode(fresh, true);
      } else if (item.dataset.version !== fresh.dataset.version && !busy(item)) {
        item = replaceItem(item, fresh);
      } else {
        patchRegions(item, fresh);
        syncInputs(item, fresh);
      }
      const expected = previous ? previous.nextElementSibling : list.firstElementChild;
      if (item !== expected) list.insertBefore(item, expected);
      previous = item;
    });
    current.forEach((gone) => gone.remove());
  }

  function merge(root, fresh) {
    patchRegions(root, fresh);
    fresh.querySelectorAll("[data-keyed-list]").forEach((freshList) => {
      const list = root.querySelector(`[data-keyed-list="${CSS.escape(freshList.dataset.keyedList)}"]`);
      if (list) syncList(list, freshList);
    });
  }

  function startLive(box) {
    const every = Number(box.dataset.liveEvery) || 5000;
    const shown = new WeakMap();  // .ago element -> when its data-age was true
    let inFlight = false;

    function formatAgo(seconds) {
      const d = box.dataset;
      const [pattern, n] =
        seconds >= 86400 ? [d.agoD, Math.floor(seconds / 86400)]
        : seconds >= 3600 ? [d.agoH, Math.floor(seconds / 3600)]
        : seconds >= 60 ? [d.agoM, Math.floor(seconds / 60)]
        : [d.agoS, seconds];
      return pattern ? pattern.replace("{n}", String(n)) : null;
    }

    function tick() {
      const now = performance.now();
      box.querySelectorAll(".ago[data-age]").forEach((el) => {
        if (!shown.has(el)) shown.set(el, now);
        const text = formatAgo(Number(el.dataset.age) + Math.floor((now - shown.get(el)) / 1000));
        if (text && el.textContent !== text) el.textContent = text;
      });
    }

    async function refresh() {
      if (inFlight || document.hidden) return;
      inFlight = true;
      try {
        const response = await fetch(box.dataset.liveSrc, {
          credentials: "same-origin",
          headers: { "Accept": "text/html" },
          cache: "no-store",
        });
        if (response.status === 401) { window.location.reload(); return; }  // signed out: to the login page
        if (!response.ok) return;  // try again next time
        const doc = new DOMParser().parseFromString(await response.text(), "text/html");
        const fresh = doc.body.querySelector(".live-root");
        const root = box.querySelector(".live-root");
        if (!fresh || !root) return;
        if (root.dataset.shape !== fresh.dataset.shape) {
          // From nothing to something (or back): the rest of the page changes too.
          if (box.dataset.liveReloadOnShape === "true") { window.location.reload(); return; }
          root.replaceWith(document.importNode(fresh, true));
        } else {
          merge(root, fresh);
        }
        box.dataset.refreshed = String(Number(box.dataset.refreshed || 0) + 1);
        tick();
      } catch (err) {
        // A network hiccup: the next round tries again.
      } finally {
        inFlight = false;
      }
    }

    tick();
    setInterval(tick, 1000);
    setInterval(refresh, every);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  }

  document.querySelectorAll("[data-live-src]").forEach(startLive);
})();
