// The Logs page, live: new lines arrive as server-sent events and are appended as text.
// The page works without this (its refresh link); this only spares the reload.
"use strict";
(function () {
  const log = document.getElementById("log");
  if (!log || !log.dataset.stream || !window.EventSource) return;
  const kept = 1000;
  const source = new EventSource(log.dataset.stream);
  source.addEventListener("open", function () { log.dataset.live = "on"; });
  source.addEventListener("error", function () { log.dataset.live = "off"; });
  source.addEventListener("message", function (event) {
    const line = JSON.parse(event.data);
    const empty = log.querySelector(".empty");
    if (empty) empty.remove();
    const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    const div = document.createElement("div");
    div.className = "line " + String(line.level).toLowerCase();
    div.dataset.seq = String(line.seq);
    div.textContent = line.text;  // text, never markup: a log line may quote anyone
    log.appendChild(div);
    while (log.children.length > kept) log.firstElementChild.remove();
    if (atEnd) div.scrollIntoView({ block: "end" });
  });
})();
