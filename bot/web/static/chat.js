// The panel's chat, enhanced. Without this script the page works by itself (forms, and a
// reload every few seconds while a turn runs); with it, the conversation's event stream shows
// the answer as it is written, the tool calls and the turn's state, and the transcript is
// read again (from the server, which escapes it) whenever the session has something new.
// The model's text is only ever set as text (textContent), never as HTML.
"use strict";

(function () {
  const chat = document.getElementById("chat");
  const transcript = document.getElementById("transcript");
  if (!chat || !transcript || !("EventSource" in window)) return;
  const base = "/chat/" + encodeURIComponent(chat.dataset.name);
  const form = document.getElementById("say");
  const STATES = {
    working: "memobot is answering…",
    waiting: "memobot waits for your answer to the question above.",
    done: "",
  };

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  }

  function keepBottom(change) {
    const stick = nearBottom();
    change();
    if (stick) window.scrollTo(0, document.body.scrollHeight);
  }

  // One read at a time; news during a read means one more read after it.
  let reading = null;
  let again = false;
  function refresh() {
    if (reading) {
      again = true;
      return reading;
    }
    reading = (async function () {
      do {
        again = false;
        const response = await fetch(base + "/transcript", { cache: "no-store" });
        if (response.redirected || !response.ok) {
          window.location.assign(base); // logged out, or the gateway went: the page says
          return;
        }
        const template = document.createElement("template");
        template.innerHTML = await response.text();
        keepBottom(() => transcript.replaceChildren(template.content));
        // A read that started before the latest streamed text shows less of it: that text
        // again (the next may be long in coming).
        const shown = document.getElementById("live-text");
        if (writing && shown && writing.startsWith(shown.textContent)) showText(writing);
      } while (again);
    })().finally(() => {
      reading = null;
    });
    return reading;
  }

  let writing = ""; // the text of the answer being written, as last streamed

  function liveBox() {
    const box = document.getElementById("live");
    if (box) box.hidden = false;
    return box;
  }

  function showText(text) {
    const box = liveBox();
    if (box) keepBottom(() => (box.querySelector("#live-text").textContent = text));
  }

  function addTool(line) {
    const box = liveBox();
    if (!box) return;
    const item = document.createElement("li");
    item.textContent = "↳ " + line;
    keepBottom(() => box.querySelector("#live-tools").append(item));
  }

  // The line is part of the transcript (each read sets it as the session has it): looked up
  // each time, never kept.
  function setState(value) {
    const state = document.getElementById("state");
    if (state) state.textContent = STATES[value] ?? "";
  }

  // A new id for the next message: the same id posted twice is one message.
  function newOnce(field) {
    const bytes = new Uint8Array(8);
    crypto.getRandomValues(bytes);
    field.value = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function data(event) {
    return JSON.parse(event.data);
  }

  const events = new EventSource(base + "/events");
  events.addEventListener("open", refresh); // what happened while it was not connected
  events.addEventListener("refresh", refresh);
  events.addEventListener("text", (e) => showText((writing = data(e).text)));
  events.addEventListener("tool", (e) => {
    writing = ""; // that reply is in the session's checkpoint now, shown from there
    addTool(data(e).line);
  });
  events.addEventListener("state", (e) => {
    if (data(e).state === "done") writing = "";
    setState(data(e).state);
  });

  if (!form) return;
  const text = form.querySelector("textarea");
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body: new FormData(form),
        redirect: "manual",
      });
      if (response.type !== "opaqueredirect") {
        // Refused (a redirect is "sent"): the server's own page says why, the text kept.
        form.submit();
        return;
      }
      form.reset();
      if (form.elements.once) newOnce(form.elements.once);
      setState("working");
      await refresh();
    } finally {
      button.disabled = false;
      text.focus();
    }
  });
})();
