// Console behaviour that needs script: accessKey reveal/copy/rotate, copy buttons on commands,
// confirmation dialogs, the live parts of 算力详情 / 可用算力 / 任务 that refresh without a reload,
// and a job's live log.
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

  // Delegated, so copy buttons in parts that a refresh swapped in work too.
  document.addEventListener("click", async (event) => {
    const button = event.target.closest?.(".copy-code");
    if (!button) return;
    const pre = button.parentElement.querySelector("pre");
    try { await copyText(pre.textContent.trim(), button); } catch (err) { /* no clipboard: nothing to do */ }
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
        box.dispatchEvent(new Event("live:updated"));
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
    box.addEventListener("live:refresh", refresh);  // "something changed": refresh now, not at the next tick
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  }

  document.querySelectorAll("[data-live-src]").forEach(startLive);

  // ---- what a form just did -------------------------------------------------------------------
  // A form's redirect says what it did in the query (?notice=…, ?created=1). A banner that said it
  // names those parameters (data-drop-query): the address loses them, so a reload or a bookmark
  // does not repeat it; and a banner about a state (data-while-state) goes when the page's live
  // state (data-live-state) moves on.
  document.querySelectorAll("[data-drop-query]").forEach((banner) => {
    const here = new URL(window.location.href);
    banner.dataset.dropQuery.split(" ").forEach((name) => here.searchParams.delete(name));
    window.history.replaceState(window.history.state, "", here.pathname + here.search + here.hash);
  });
  document.querySelectorAll("[data-live-src]").forEach((box) => {
    box.addEventListener("live:updated", () => {
      const state = box.querySelector("[data-live-state]");
      document.querySelectorAll("[data-while-state]").forEach((banner) => {
        if (state && banner.dataset.whileState !== state.dataset.liveState) banner.remove();
      });
    });
  });

  // ---- a job's live log -----------------------------------------------------------------------
  // Polls GET /api/v1/jobs/{id}/logs?offset=N and appends what comes. X-Next-Offset is where to go
  // on; X-Log-Complete says nothing more will come for that attempt. The latest attempt is followed
  // until the job has ended (a queued or lost job gets a new attempt, whose log replaces the shown
  // one); an older attempt chosen in the selector is read to its end once.
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const KEEP_CHARS = 2_000_000;  // beyond this the oldest output is dropped from the page

  function startLog(pre) {
    const src = pre.dataset.logSrc;
    const status = document.getElementById("log-status");
    const trimmed = document.getElementById("log-trimmed");
    const liveBox = pre.closest("[data-live-src]");
    let offset = 0;
    let chosen = "";  // "" follows the latest attempt; a number reads that attempt
    let served = null;  // the attempt the shown text belongs to
    let decoder = new TextDecoder();
    let timer = null;
    let generation = 0;
    let received = false;
    let busy = null;  // the generation whose poll is in flight
    let finished = false;

    const jobState = () => document.getElementById("job-state")?.dataset.state || "";
    const atBottom = () => pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;

    function show(state) {
      pre.dataset.logState = state;  // live | complete | error: also for tests and CSS
      if (state === "error") pre.dataset.placeholder = pre.dataset.error;
      else if (state === "complete") pre.dataset.placeholder = pre.dataset.empty;
      else pre.dataset.placeholder = pre.dataset.waiting;
      if (!status) return;
      status.hidden = state === "error";
      status.textContent = state === "complete" ? status.dataset.doneLabel : status.dataset.liveLabel;
      status.className = "badge log-status " + (state === "complete" ? "log-complete" : "log-live");
    }

    function reset() {
      pre.textContent = "";
      offset = 0;
      decoder = new TextDecoder();
      received = false;
      if (trimmed) trimmed.hidden = true;
    }

    function append(text) {
      if (!text) return;
      const stick = atBottom();
      pre.append(document.createTextNode(text));
      received = true;
      if (pre.textContent.length > KEEP_CHARS) {
        pre.textContent = pre.textContent.slice(-KEEP_CHARS / 2);
        if (trimmed) trimmed.hidden = false;
      }
      if (stick) pre.scrollTop = pre.scrollHeight;
    }

    function schedule(ms) {
      clearTimeout(timer);
      timer = setTimeout(poll, ms);
    }

    async function poll() {
      if (busy === generation) return;
      busy = generation;
      clearTimeout(timer);
      const mine = generation;
      let wait = 1000;
      try {
        const url = `${src}?offset=${offset}` + (chosen ? `&attempt=${chosen}` : "");
        const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
        if (mine !== generation) return;  // another attempt was chosen meanwhile
        if (response.status === 401) { window.location.reload(); return; }
        if (!response.ok) { show("error"); wait = 5000; return; }
        const attempt = response.headers.get("X-Attempt");
        if (served !== null && attempt !== served) reset();  // a new attempt began: its own log
        served = attempt;
        const bytes = new Uint8Array(await response.arrayBuffer());
        if (mine !== generation) return;
        const complete = response.headers.get("X-Log-Complete") === "true";
        const next = Number(response.headers.get("X-Next-Offset"));
        offset = Number.isFinite(next) ? next : offset + bytes.length;
        append(decoder.decode(bytes, { stream: !complete }));
        if (complete && (chosen || TERMINAL.has(jobState()))) {
          show("complete");
          pre.dataset.complete = "true";
          finished = true;
          if (liveBox) liveBox.dispatchEvent(new Event("live:refresh"));  // state and artifacts too
          return;
        }
        show("live");
        if (complete) {
          // Ended (or not begun) here but the page does not know the job's end yet: look again soon.
          wait = 2000;
          if (liveBox && received) liveBox.dispatchEvent(new Event("live:refresh"));
        } else if (bytes.length) {
          wait = 150;  // more may be waiting
        }
      } catch (err) {
        show("error");
        wait = 3000;
      } finally {
        if (busy === mine) busy = null;
        if (mine === generation && !finished) schedule(wait);
      }
    }

    document.addEventListener("change", (event) => {
      if (event.target.id !== "log-attempt") return;
      chosen = event.target.value;
      generation += 1;
      served = null;
      finished = false;  // a poll still in flight belongs to the old choice and is ignored
      delete pre.dataset.complete;
      reset();
      clearTimeout(timer);
      poll();
    });
    // The page learnt that the job ended: read the rest of the log now rather than at the next round.
    if (liveBox) {
      liveBox.addEventListener("live:updated", () => {
        if (!finished && !chosen && TERMINAL.has(jobState())) poll();
      });
    }

    show("live");
    poll();
  }

  const jobLog = document.getElementById("job-log");
  if (jobLog) startLog(jobLog);

  // ---- the submit form's estimate -------------------------------------------------------------
  // Prices are micro-yuan per unit-hour (#estimate's data-prices); amounts read by the one rule the
  // server uses (protocol/money.py money_text: two places, or two significant digits below a fen,
  // half to even), in BigInt so large jobs do not lose digits.
  const estimate = document.getElementById("estimate");
  const yuanText = (micro) => {
    let places = 2;
    while (micro !== 0n && micro < 10000n && places < 6 && micro * 10n ** BigInt(places) < 10000000n) places += 1;
    const step = 10n ** BigInt(6 - places);
    let units = micro / step;
    const rest = micro % step;
    if (2n * rest > step || (2n * rest === step && units % 2n === 1n)) units += 1n;
    const scale = 10n ** BigInt(places);
    return `${units / scale}.${(units % scale).toString().padStart(places, "0")}`;
  };
  const fill = (pattern, values) => pattern.replace(/\{(\w+)\}/g, (_, key) => values[key] ?? "");
  function updateEstimate() {
    const form = estimate.closest("form");
    const prices = JSON.parse(estimate.dataset.prices);
    const count = (name, fallback) => {
      const value = Number.parseInt(form.elements[name].value, 10);
      return Number.isInteger(value) && value >= 0 ? value : fallback;
    };
    const gpus = count("gpus_per_node", 0);
    const nodes = Math.max(count("nodes", 1), 1);
    const minutes = count("max_runtime_min", 0);
    const price = prices[gpus ? form.elements.gpu_product.value : "cpu"];
    if (price === undefined) {
      estimate.textContent = estimate.dataset.none;
      return;
    }
    const perHour = BigInt(price) * BigInt(gpus ? gpus * nodes : nodes);
    const values = { per_hour: yuanText(perHour), minutes, total: yuanText((perHour * BigInt(minutes * 60)) / 3600n) };
    estimate.textContent = fill(minutes ? estimate.dataset.total : estimate.dataset.open, values);
  }
  if (estimate) {
    estimate.closest("form").addEventListener("input", updateEstimate);
    estimate.closest("form").addEventListener("change", updateEstimate);
  }
})();
