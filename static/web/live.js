// Live updates: one WebSocket per workspace shown on the page (the admin console's pages: one for
// the whole cluster). Each state change the portal pushes ({"kind": "job"|"instance"|"notebook"|
// "raycluster", "id": ..., "state": ...}) becomes a "live-<kind>" event and a "live-<kind>-<id>" event on
// <body> (and "live-any", "live-batch"); page parts listen for them with
// hx-trigger and re-render themselves from the server, so the server stays the one place that
// formats a page. (A part about one object listens for its own event rather than filtering with
// an hx-trigger expression: the Content-Security-Policy allows no eval, so htmx evaluates nothing.)
// A live part's element stays for the page's life and only its inside is replaced (hx-swap
// "innerHTML"): a change heard while the part's last request is out is queued on that element and
// sent when the request returns. Were the element itself replaced, htmx would drop the queued
// request with it, and the page would show a state already gone (Admitted while the job runs).
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  const status = () => document.getElementById("live-status");
  // The page's sockets by workspace ("" for the console's): each with when it opened and when its
  // last heartbeat came (0 while not open).
  const sockets = new Map();

  function setStatus(state, text, why) {
    const el = status();
    if (!el) return;
    el.classList.toggle("on", state === "on");
    el.classList.toggle("off", state === "off");
    el.querySelector(".live-text").textContent = text;
    el.title = why || "Live updates";
  }

  // "Live" only while heartbeats arrive on every socket of the page: the scheduler loop, another
  // process, sends one every 5 s through the channel layer, so they prove that changes made
  // anywhere in the portal reach this page. An open socket without one for 12 s says so.
  const LATE_MS = 12000;
  function refresh() {
    if (sockets.size === 0) return;
    const now = Date.now();
    let worst = 0;  // the page is as live as its least live socket
    sockets.forEach((s) => {
      let rank = 0;
      if (!s.openedAt) rank = 3;
      else if (now - Math.max(s.openedAt, s.lastBeat) > LATE_MS) rank = 2;
      else if (!s.lastBeat) rank = 1;
      worst = Math.max(worst, rank);
    });
    if (worst === 0) setStatus("on", "Live", "Live updates: changes appear without a reload");
    else if (worst === 1) setStatus("off", "Connecting…");
    else if (worst === 2) setStatus("off", "Not live", "No updates arrive: reload the page to see changes");
    else setStatus("off", "Reconnecting…");
  }
  setInterval(refresh, 1000);

  function fire(name, detail) {
    document.body.dispatchEvent(new CustomEvent(name, { detail: detail, bubbles: true }));
  }

  // "live-batch": at most one every 500 ms, and always one after the last change. For parts that
  // hear many changes (the console hears the whole cluster's), where a debounce ("delay:") could
  // wait forever on a busy cluster and a throttle could miss the last change.
  let batch = null;
  function batched() {
    if (!batch) batch = setTimeout(() => { batch = null; fire("live-batch", {}); }, 500);
  }

  function connect(workspace, attempt) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    // The console (workspace "") hears every workspace; a page of workspaces hears each of its own;
    // a page of an instance shared with its reader ("instance:<id>") hears that instance alone.
    const shared = workspace.startsWith("instance:") ? workspace.slice("instance:".length) : null;
    const path = shared ? `/ws/instances/${encodeURIComponent(shared)}/`
      : workspace ? `/ws/workspaces/${encodeURIComponent(workspace)}/` : "/ws/console/";
    const socket = new WebSocket(`${scheme}//${location.host}${path}`);
    const entry = { openedAt: 0, lastBeat: 0 };
    sockets.set(workspace, entry);
    socket.addEventListener("open", () => {
      // Open is not live yet: that takes a heartbeat.
      entry.openedAt = Date.now();
      refresh();
      // Catch up on what changed before this socket listened: between the page's render and now
      // (a job admitted and started within its first second), or while it was away.
      fire("live-reconnected", { workspace: workspace });
      attempt = 0;
    });
    socket.addEventListener("message", (event) => {
      let data;
      try { data = JSON.parse(event.data); } catch (e) { return; }
      if (data.kind === "heartbeat") { entry.lastBeat = Date.now(); refresh(); return; }
      data.workspace = workspace;
      fire(`live-${data.kind}`, data);
      fire(`live-${data.kind}-${data.id}`, data);
      fire("live-any", data);
      batched();
    });
    socket.addEventListener("close", (event) => {
      entry.openedAt = 0;
      entry.lastBeat = 0;
      if (event.code === 4404 || event.code === 4403) {  // not this user's: do not retry
        sockets.delete(workspace);
        return;
      }
      refresh();
      const wait = Math.min(15000, 500 * 2 ** Math.min(attempt, 5));
      setTimeout(() => connect(workspace, attempt + 1), wait);
    });
  }

  // A workload's log (a job's, a Ray cluster's), followed through the API while it may still write
  // to it. The box names its kind's live events ("data-live-kind", a job's by default) and its id.
  const FINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "STOPPED"]);
  function followLog(box) {
    const out = box.querySelector("pre");
    const picker = box.querySelector("select");
    const kind = box.dataset.liveKind || "job";
    const id = box.dataset.workloadId || box.dataset.jobId;
    let offset = 0, replica = 0, timer = null, running = false;
    async function tick() {
      if (running) return;
      running = true;
      try {
        const url = `${box.dataset.logUrl}?replica=${replica}&offset=${offset}`;
        const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) { out.dataset.error = String(response.status); return; }
        const data = await response.json();
        if (data.replica !== replica) return;
        const atBottom = out.scrollHeight - out.scrollTop - out.clientHeight < 30;
        if (data.text) {
          if (offset === 0) out.textContent = "";
          out.append(document.createTextNode(data.text));
          if (atBottom) out.scrollTop = out.scrollHeight;
        } else if (offset === 0 && !out.textContent.trim()) {
          out.textContent = FINAL.has(data.state) ? "(no output)" : "Waiting for output…";
        }
        offset = data.offset;
        box.dataset.state = data.state;
        if (FINAL.has(data.state) && timer) { clearInterval(timer); timer = null; }
      } catch (e) {
        // the next tick tries again
      } finally {
        running = false;
      }
    }
    function restart() {
      if (timer) clearInterval(timer);
      timer = setInterval(tick, 1500);
      tick();
    }
    if (picker) picker.addEventListener("change", () => { replica = Number(picker.value); offset = 0; out.textContent = ""; restart(); });
    document.body.addEventListener(`live-${kind}`, (event) => {
      if (String(event.detail.id) === id && !timer) restart();
      else if (String(event.detail.id) === id) tick();
    });
    restart();
  }

  // GPU use over time: a line per GPU type and a dashed line for each type's limit.
  const PALETTE = ["#3b5bdb", "#12b886", "#f59f00", "#e64980", "#7048e8", "#15aabf"];
  // A time on a chart's axis as the pages write times: 24-hour, "14:05".
  const clock = (label) => new Date(label).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  function drawChart(box) {
    const canvas = box.querySelector("canvas");
    const table = box.querySelector("table tbody");
    let chart = null, pending = null;
    async function load() {
      const response = await fetch(box.dataset.chartUrl, { credentials: "same-origin" });
      if (!response.ok) return;
      const data = await response.json();
      const labels = data.labels.map(clock);
      const datasets = [];
      // The GPUs held by type (the dashboard), or a measure per device ("suffix", "y_title",
      // "y_max": a workload's GPU utilisation, where a bucket without a sample is null).
      const suffix = data.suffix === undefined ? " in use" : data.suffix;
      const present = (values) => values.filter((v) => v !== null);
      Object.entries(data.series).forEach(([type, values], i) => {
        const color = PALETTE[i % PALETTE.length];
        // Every figure is one bucket's (GPUs held on average over it, nodes up, a device's use),
        // labelled with the bucket's end: drawn as steps, which hold each value over its bucket,
        // never as a smoothed curve that overshoots between them (3.5 GPUs where 3 and 4 were held).
        datasets.push({ label: `${type}${suffix}`, data: values, borderColor: color, backgroundColor: color + "22",
          fill: true, stepped: "before", tension: 0, pointRadius: 0, borderWidth: 2, spanGaps: false });
        if (data.measured && type in data.measured) {  // what the held GPUs measured busy, where telemetry exists
          datasets.push({ label: `${type} measured busy`, data: data.measured[type], borderColor: color,
            borderDash: [2, 3], stepped: "before", tension: 0, pointRadius: 0, borderWidth: 2, fill: false,
            spanGaps: false });
        }
        if (data.limits && type in data.limits) {
          datasets.push({ label: `${type} ${data.limit_label}`, data: values.map(() => data.limits[type]),
            borderColor: color, borderDash: [6, 4], pointRadius: 0, borderWidth: 1.5, fill: false });
        }
        if (data.floors && type in data.floors) {  // a lower limit (an elastic pool's minimum)
          datasets.push({ label: `${type} ${data.floor_label}`, data: values.map(() => data.floors[type]),
            borderColor: color, borderDash: [2, 4], pointRadius: 0, borderWidth: 1.5, fill: false });
        }
      });
      if (table) {
        table.innerHTML = "";
        Object.entries(data.series).forEach(([type, values]) => {
          const row = table.insertRow();
          row.insertCell().textContent = type;
          const known = present(values);
          row.insertCell().textContent = known.length ? known[known.length - 1].toFixed(data.digits ?? 2) : "—";
          row.insertCell().textContent = known.length ? Math.max(0, ...known).toFixed(data.digits ?? 2) : "—";
          row.insertCell().textContent = data.limits && type in data.limits ? String(data.limits[type]) : "—";
        });
      }
      box.dataset.loaded = String(Date.now());
      if (typeof Chart === "undefined" || !canvas) return;
      if (!chart) {
        chart = new Chart(canvas, {
          type: "line",
          data: { labels: labels, datasets: datasets },
          // No animation: a refresh or a new width redraws at once, never a line growing from the left.
          options: { responsive: true, maintainAspectRatio: false, animation: false,
            interaction: { mode: "index", intersect: false },
            scales: { y: { beginAtZero: true, max: data.y_max, title: { display: true, text: data.y_title || "GPUs" } },
              x: { ticks: { maxTicksLimit: 8, maxRotation: 0, autoSkipPadding: 12 } } },
            plugins: { legend: { position: "bottom" } } },
        });
      } else {
        chart.data.labels = labels;
        chart.data.datasets = datasets;
        chart.update("none");
      }
    }
    function soon() {
      clearTimeout(pending);
      pending = setTimeout(load, 400);
    }
    ["live-job", "live-instance", "live-raycluster", "live-reconnected"].forEach((name) => document.body.addEventListener(name, soon));
    setInterval(load, 60000);  // the time axis moves on even when nothing changes
    load();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const names = (document.body.dataset.liveWorkspaces || "").split(",").filter(Boolean);
    // A page that shows no workspace's work has no live indicator (templates/web/base.html).
    if (document.body.classList.contains("console")) connect("", 0);
    names.forEach((name) => connect(name, 0));
    document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
      select.addEventListener("change", () => select.form.requestSubmit());
    });
    document.querySelectorAll("[data-log-url]").forEach(followLog);
    document.querySelectorAll("[data-chart-url]").forEach(drawChart);
    // On a phone the navigation is one line that scrolls: show the current page's link in it, at the
    // start and whenever the width changes (a phone turned, a window narrowed).
    const nav = document.querySelector(".sidenav");
    const here = nav && nav.querySelector('[aria-current="page"]');
    function showHere() {
      if (!here || nav.scrollWidth <= nav.clientWidth) return;
      const offset = here.getBoundingClientRect().left - nav.getBoundingClientRect().left;
      nav.scrollLeft += offset - (nav.clientWidth - here.offsetWidth) / 2;
    }
    showHere();
    window.addEventListener("resize", showHere);
    // One listener for every Copy button, those a live update renders later included.
    document.addEventListener("click", async (event) => {
      const button = event.target.closest("[data-copy]");
      if (!button) return;
      const target = document.getElementById(button.dataset.copy);
      try { await navigator.clipboard.writeText(target.textContent.trim()); button.textContent = "Copied"; }
      catch (e) { button.textContent = "Select and copy"; }
    });
  });
})();
