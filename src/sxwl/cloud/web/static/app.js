// Console behaviour that needs script: accessKey reveal/copy/rotate and copy buttons on commands.
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
})();
