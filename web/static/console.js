// Light refresh: re-fetch the page every few seconds and swap <main>, unless the operator is using a form.
(function () {
  "use strict";
  const main = document.getElementById("main");
  if (!main || !main.dataset.refresh) return;
  const period = Math.max(1000, parseInt(main.dataset.refresh, 10) || 3000);
  let busy = false;

  function interacting() {
    const a = document.activeElement;
    return a && a !== document.body && main.contains(a) && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(a.tagName);
  }

  async function refresh() {
    if (busy || document.hidden || interacting()) return;
    busy = true;
    try {
      const resp = await fetch(window.location.href, { headers: { "X-Requested-With": "refresh" }, credentials: "same-origin" });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.getElementById("main");
      if (fresh && !interacting()) main.innerHTML = fresh.innerHTML;
      document.body.classList.remove("offline");
    } catch (err) {
      document.body.classList.add("offline");  // shown as a banner by the stylesheet
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, period);
})();
