// The Playground (推理服务 → 试用): a chat with one ready endpoint, streamed as it is generated.
// It calls the cloud's own /v1/chat/completions with the console's session (and its CSRF token, as
// every console POST carries), reads the SSE answer chunk by chunk and writes each delta as text.
(function () {
  "use strict";
  var form = document.getElementById("playground");
  if (!form) return;
  var input = document.getElementById("playground-input");
  var log = document.getElementById("playground-log");
  var send = document.getElementById("playground-send");
  var history = [];

  function bubble(role, text) {
    var item = document.createElement("div");
    item.className = "chat-" + role;
    item.textContent = text;
    log.appendChild(item);
    return item;
  }

  // Enter sends, as in every chat; Shift+Enter (or Enter while an input method composes) is a newline.
  input.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    if (!send.disabled) form.requestSubmit();
  });

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = input.value.trim();
    if (!text) return;
    input.value = "";
    bubble("user", text);
    history.push({ role: "user", content: text });
    var answer = bubble("assistant", "");
    send.disabled = true;
    fetch("/v1/chat/completions", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-csrf-token": form.dataset.csrf },
      body: JSON.stringify({ model: form.dataset.model, messages: history, stream: true }),
    })
      .then(function (response) {
        if (!response.ok) {
          return response.json().then(function (body) {
            throw new Error((body.error && body.error.message) || response.statusText);
          });
        }
        var reader = response.body.getReader();
        var decoder = new TextDecoder();
        var pending = "";
        function pump() {
          return reader.read().then(function (part) {
            if (part.done) return;
            pending += decoder.decode(part.value, { stream: true });
            var lines = pending.split("\n");
            pending = lines.pop();
            lines.forEach(function (line) {
              if (line.indexOf("data: {") !== 0) return;
              var chunk = JSON.parse(line.slice(6));
              var delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
              if (delta && delta.content) answer.textContent += delta.content;
            });
            return pump();
          });
        }
        return pump();
      })
      .then(function () {
        history.push({ role: "assistant", content: answer.textContent });
      })
      .catch(function (error) {
        answer.className = "chat-error";
        answer.textContent = error.message;
        history.pop();
      })
      .then(function () {
        send.disabled = false;
      });
  });
})();
