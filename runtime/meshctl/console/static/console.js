// The mesh page's live part: every second, the fragment the server renders again replaces the old one
// (only when it changed, so an open <details> stays open until something changes). No framework, no build.
"use strict";
(function () {
  const box = document.querySelector("[data-live]");
  if (!box) return;
  const url = box.getAttribute("data-live");
  let last = null;
  async function poll() {
    try {
      const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (r.status === 401) {
        const note = document.createElement("p");
        note.className = "problem";
        note.textContent = "Your session has ended: reload the page to log in again.";
        box.before(note);
        return; // no more polling
      }
      if (r.ok) {
        const html = await r.text();
        if (html !== last) {
          if (last !== null) box.innerHTML = html; // the server's own escaped markup
          last = html;
          box.setAttribute("data-updated", String(Date.now()));
        }
      }
    } catch (e) {
      // the console is restarting or the network is gone: try again next second
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
