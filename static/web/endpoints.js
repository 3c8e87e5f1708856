// An inference endpoint's page: its figures over time (Chart.js, drawn as live.js draws GPU use)
// and a replica's server log, followed through the API. Both refresh on the endpoint's live
// events ("live-endpoint-<id>", fired by live.js) and on a timer, since samples are taken every
// few seconds whether or not anything changes.
(function () {
  "use strict";
  const PALETTE = ["#3b5bdb", "#12b886", "#f59f00", "#e64980", "#7048e8", "#15aabf"];
  const BAD = "#c0352b";
  const REFRESH_MS = 15000;

  function line(label, data, color, extra) {
    return Object.assign({ label: label, data: data, borderColor: color, backgroundColor: color + "22", fill: false,
      tension: 0.25, pointRadius: 0, borderWidth: 2, spanGaps: false }, extra || {});
  }

  function limit(label, value, count, color) {
    return line(label, new Array(count).fill(value), color, { borderDash: [6, 4], borderWidth: 1.5 });
  }

  // What each chart draws from the figures (apps/web/endpoints.py, endpoint_metrics).
  const CHARTS = {
    replicas: (d, n) => ({ title: "Replicas", integer: true, datasets: [
      line("replicas", d.series.replicas, PALETTE[0], { fill: true, stepped: true, tension: 0 }),
      line("serving", d.series.serving, PALETTE[1], { stepped: true, tension: 0 }),
      limit(`minimum (${d.min_replicas})`, d.min_replicas, n, PALETTE[4]),
      limit(`maximum (${d.max_replicas})`, d.max_replicas, n, PALETTE[2]),
    ] }),
    traffic: (d) => ({ title: "per second", datasets: [
      line("requests", d.series.requests_per_s, PALETTE[0], { fill: true }),
      line("errors", d.series.errors_per_s, BAD),
    ] }),
    latency: (d) => ({ title: "ms", datasets: [
      line("p50", d.series.p50_s, PALETTE[1]),
      line("p95", d.series.p95_s, PALETTE[2]),
    ] }),
    tokens: (d) => ({ title: "tokens per second", datasets: [
      line("tokens", d.series.tokens_per_s, PALETTE[3], { fill: true }),
    ] }),
  };
  const TABLE = [["replicas", "Replicas", 0], ["serving", "Serving", 0], ["waiting", "Requests waiting", 0],
    ["requests_per_s", "Requests per second", 2], ["errors_per_s", "Errors per second", 2],
    ["p50_s", "p50 latency (ms)", 0], ["p95_s", "p95 latency (ms)", 0], ["tokens_per_s", "Tokens per second", 1]];

  // As many times along a chart's axis as fit its width (a phone's: three or four).
  function ticksFor(width) {
    return Math.max(3, Math.min(8, Math.floor(width / 80)));
  }

  function drawCharts(box) {
    const select = box.querySelector("select[data-window]");
    const table = box.querySelector("tbody[data-figures]");
    const charts = {};
    let pending = null;
    async function load() {
      const url = `${box.dataset.endpointCharts}?window=${encodeURIComponent(select ? select.value : "1h")}`;
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const data = await response.json();
      const labels = data.labels.map((l) => new Date(l).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" }));
      // No figures yet (or any more): say so, rather than draw empty axes.
      box.querySelector("[data-no-samples]").hidden = data.samples > 0;
      box.querySelectorAll(".charts, details").forEach((el) => { el.hidden = data.samples === 0; });
      box.querySelector("[data-no-tokens]").hidden = data.has_tokens || data.samples === 0;
      if (table) fillTable(table, data);
      box.dataset.loaded = String(Date.now());
      if (typeof Chart === "undefined" || data.samples === 0) return;
      box.querySelectorAll("canvas[data-chart]").forEach((canvas) => {
        const name = canvas.dataset.chart;
        const spec = CHARTS[name](data, labels.length);
        if (!charts[name]) {
          charts[name] = new Chart(canvas, {
            type: "line",
            data: { labels: labels, datasets: spec.datasets },
            // No animation: a refresh or a new width redraws at once (as live.js's charts).
            options: { responsive: true, maintainAspectRatio: false, animation: false,
              interaction: { mode: "index", intersect: false },
              scales: { y: { beginAtZero: true, title: { display: true, text: spec.title },
                ticks: spec.integer ? { precision: 0 } : {} },
                x: { ticks: { maxTicksLimit: ticksFor(canvas.parentElement.clientWidth), maxRotation: 0,
                  autoSkipPadding: 12 } } },
              onResize: (chart, size) => { chart.options.scales.x.ticks.maxTicksLimit = ticksFor(size.width); },
              plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } } },
          });
        } else {
          charts[name].data.labels = labels;
          charts[name].data.datasets = spec.datasets;
          charts[name].update("none");
        }
      });
    }
    function soon() {
      clearTimeout(pending);
      pending = setTimeout(load, 400);
    }
    document.body.addEventListener(`live-endpoint-${box.dataset.endpointId}`, soon);
    document.body.addEventListener("live-reconnected", soon);
    if (select) select.addEventListener("change", load);
    setInterval(load, REFRESH_MS);
    load();
  }

  function fillTable(table, data) {
    table.textContent = "";
    TABLE.forEach(([key, label, digits]) => {
      const known = data.series[key].filter((v) => v !== null);
      const row = table.insertRow();
      row.insertCell().textContent = label;
      const now = row.insertCell();
      const peak = row.insertCell();
      now.className = peak.className = "num";
      now.textContent = known.length ? known[known.length - 1].toFixed(digits) : "—";
      peak.textContent = known.length ? Math.max(...known).toFixed(digits) : "—";
    });
  }

  // A replica's server log, from `offset` on, every few seconds while the page is open.
  function followLog(box) {
    const out = box.querySelector("pre");
    const picker = box.querySelector("select");
    let replica = "", offset = 0, running = false;
    async function tick() {
      if (running) return;
      running = true;
      try {
        const url = `${box.dataset.endpointLog}?replica=${encodeURIComponent(replica)}&offset=${offset}`;
        const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) { out.dataset.error = String(response.status); return; }
        const data = await response.json();
        if (data.replica === null) return;
        if (replica === "") replica = String(data.replica);  // the newest, from now on
        if (String(data.replica) !== replica) return;
        const atBottom = out.scrollHeight - out.scrollTop - out.clientHeight < 30;
        if (data.text) {
          if (offset === 0) out.textContent = "";
          out.append(document.createTextNode(data.text));
          if (atBottom) out.scrollTop = out.scrollHeight;
        } else if (offset === 0) {
          out.textContent = box.dataset.final === "true" ? "(no output)" : "(no output yet)";
        }
        offset = data.offset;
      } catch (e) {
        // the next tick tries again
      } finally {
        running = false;
      }
    }
    if (picker) picker.addEventListener("change", () => { replica = picker.value; offset = 0; out.textContent = "Loading…"; tick(); });
    document.body.addEventListener(`live-endpoint-${box.dataset.endpointId}`, tick);
    setInterval(tick, 3000);
    tick();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-endpoint-charts]").forEach(drawCharts);
    document.querySelectorAll("[data-endpoint-log]").forEach(followLog);
  });
})();
