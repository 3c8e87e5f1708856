// The GPU request form (templates/web/gprs/new.html): as the terms change, ask the portal for the
// earliest feasible start and whether the workspace's policy approves them at once
// (w/<ws>/gprs/estimate.json, which checks them as a request would be checked), debounced, and
// show its refusals beside their fields. The form works the same without it.
(function () {
  "use strict";
  const WAIT_MS = 400;
  const SKIP = new Set(["csrfmiddlewaretoken", "justification"]);

  function setup(form) {
    const url = form.dataset.estimateUrl;
    const start = form.querySelector('[data-estimate="start"]');
    const decision = form.querySelector('[data-estimate="decision"]');
    const box = form.querySelector("#gpr-estimate");
    let timer = null;
    let asked = 0;

    function clearErrors() {
      form.querySelectorAll("[data-estimate-error]").forEach((p) => { p.hidden = true; p.textContent = ""; });
    }

    function showErrors(errors) {
      const loose = [];
      Object.entries(errors || {}).forEach(([field, messages]) => {
        const p = form.querySelector(`[data-estimate-error="${field}"]`);
        if (p) { p.textContent = messages.join(" "); p.hidden = false; } else { loose.push(...messages); }
      });
      start.textContent = loose.length ? loose.join(" ") : "Correct the terms above to see the earliest start.";
      decision.textContent = "";
      box.dataset.state = "refused";
    }

    function show(answer) {
      start.textContent = answer.text;
      decision.textContent = answer.decision;
      box.dataset.state = answer.auto ? "auto" : "admin";
    }

    async function estimate() {
      const query = new URLSearchParams();
      new FormData(form).forEach((value, key) => { if (!SKIP.has(key)) query.append(key, value); });
      const mine = ++asked;
      box.setAttribute("aria-busy", "true");
      try {
        const response = await fetch(`${url}?${query}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
        const answer = await response.json();
        if (mine !== asked) return;  // a later change asked again meanwhile
        clearErrors();
        if (answer.ok) show(answer); else showErrors(answer.errors);
      } catch (error) {
        if (mine === asked) { start.textContent = "The estimate could not be fetched; the request is checked when sent."; }
      } finally {
        if (mine === asked) box.removeAttribute("aria-busy");
      }
    }

    function later() {
      clearTimeout(timer);
      timer = setTimeout(estimate, WAIT_MS);
    }

    form.addEventListener("input", (event) => { if (!SKIP.has(event.target.name)) later(); });
    form.addEventListener("change", (event) => { if (!SKIP.has(event.target.name)) later(); });
    // Choosing a time chooses "From"; emptying it goes back to as soon as possible.
    const at = form.querySelector("#id_start_at");
    at.addEventListener("input", () => {
      form.querySelector(at.value ? "#id_start_at_choice" : "#id_start_asap").checked = true;
    });
    estimate();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.querySelector("form[data-estimate-url]");
    if (form) setup(form);
  });
})();
