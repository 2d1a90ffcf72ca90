/* convoyweb live updates: one websocket per page, replay by sequence number, in-place updates.
 * The page remembers the last sequence number it applied; on reconnect (jittered backoff) it
 * asks for everything after it; "resync" (gap older than the log) reloads the page. */
(function () {
  "use strict";
  const body = document.body;
  const topics = body.dataset.topics || "dashboard,inbox";
  const state = { last: parseInt(body.dataset.asOf || "0", 10) || 0, applied: new Set(), count: 0, log: [],
                  unread: parseInt(body.dataset.unread || "0", 10) || 0, socket: null, attempt: 0 };
  window.convoyLive = state;
  const liveEl = document.getElementById("live-state");
  let refreshTimer = null, ackPending = false;

  function setLive(text, ok) { if (liveEl) { liveEl.textContent = "● " + text; liveEl.classList.toggle("on", ok); } }

  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${proto}//${location.host}/ws/live/?topics=${encodeURIComponent(topics)}&since=${state.last}`;
    const ws = new WebSocket(url);
    state.socket = ws;
    ws.onopen = () => { state.attempt = 0; setLive("live", true); };
    ws.onmessage = (msg) => handle(JSON.parse(msg.data));
    ws.onclose = () => {
      setLive("reconnecting", false);
      const delay = Math.min(30000, 500 * 2 ** state.attempt) * (0.5 + Math.random());
      state.attempt += 1;
      setTimeout(connect, delay);
    };
  }

  function handle(msg) {
    if (msg.type === "resync") { location.reload(); return; }
    if (msg.type !== "event") return;
    if (state.applied.has(msg.seq)) return;
    state.applied.add(msg.seq);
    if (state.applied.size > 20000) state.applied = new Set([...state.applied].slice(-10000));
    state.last = Math.max(state.last, msg.seq);
    state.count += 1;
    state.log.push(msg.seq);
    if (state.log.length > 5000) state.log.splice(0, 1000);
    ackPending = true;
    apply(msg);
  }

  function apply(ev) {
    const d = ev.data || {};
    if (ev.kind === "notification") { notifyUser(ev); return; }
    if (ev.kind === "bead.dispatched") toast(`▶ ${ev.bead_id} dispatched to ${d.assignee}`);
    if (ev.kind === "convoy.landed") toast(`Convoy landed: ${d.title || ev.convoy_id}`, "good");
    if (ev.kind === "dispatch.failed") toast(`✗ dispatch of ${ev.bead_id} failed: ${d.error}`, "bad");
    if (ev.bead_id && d.status) {
      document.querySelectorAll(`[data-bead="${CSS.escape(ev.bead_id)}"] .b-status`).forEach((el) => { el.textContent = d.status; });
      document.querySelectorAll(`[data-bead="${CSS.escape(ev.bead_id)}"] .b-assignee`).forEach((el) => { el.textContent = d.assignee || "—"; });
    }
    scheduleRefresh();
  }

  /* Re-read the page's live parts (never the DAG geometry: only its node classes). */
  function scheduleRefresh() {
    if (refreshTimer) return;
    refreshTimer = setTimeout(async () => {
      refreshTimer = null;
      try {
        const html = await (await fetch(location.href, { headers: { "X-Live": "1" } })).text();
        const doc = new DOMParser().parseFromString(html, "text/html");
        for (const sel of ["#convoy-table tbody", "#convoy-head", "#wave-table tbody", "#bead-table tbody",
                           "#timeline", "#critical", "#bead-fields", "#inbox-list"]) {
          const mine = document.querySelector(sel), fresh = doc.querySelector(sel);
          if (mine && fresh) mine.replaceWith(fresh);
        }
        doc.querySelectorAll(".dag .node[data-id]").forEach((fresh) => {
          const mine = document.querySelector(`.dag .node[data-id="${CSS.escape(fresh.dataset.id)}"]`);
          if (mine) mine.setAttribute("class", fresh.getAttribute("class"));
        });
        body.dataset.refreshed = String(state.last);
      } catch (e) { /* the next event refreshes again */ }
    }, 150);
  }

  function toast(text, kind) {
    const box = document.getElementById("toasts");
    if (!box) return;
    const el = document.createElement("div");
    el.className = "toast " + (kind || "");
    el.setAttribute("role", kind === "bad" ? "alert" : "status");
    el.textContent = text;
    box.appendChild(el);
    setTimeout(() => el.remove(), 8000);
    while (box.children.length > 5) box.firstChild.remove();
  }

  function notifyUser(ev) {
    const d = ev.data || {};
    state.unread += 1;
    updateBadge();
    toast(d.subject || "Notification", "good");
    if ("Notification" in window && Notification.permission === "granted") {
      const n = new Notification(d.subject || "convoyweb", { tag: ev.convoy_id || "convoyweb", body: d.title || "" });
      n.onclick = () => { window.focus(); location.href = `/convoys/${ev.convoy_id}/`; };
    }
    scheduleRefresh();
  }

  function updateBadge() {
    const badge = document.getElementById("unread");
    if (badge) badge.textContent = String(state.unread);
    document.title = (state.unread ? `(${state.unread}) ` : "") + document.title.replace(/^\(\d+\) /, "");
    const link = document.getElementById("favicon");
    if (!link) return;
    link.dataset.logo = link.dataset.logo || link.href;
    if (!state.unread) { link.href = link.dataset.logo; return; }
    // The logo (an SVG, no emoji font needed) with a red dot for unread notifications.
    const logo = new Image();
    logo.onload = () => {
      const canvas = document.createElement("canvas");
      canvas.width = canvas.height = 32;
      const ctx = canvas.getContext("2d");
      ctx.drawImage(logo, 0, 0, 32, 32);
      ctx.fillStyle = "#d33"; ctx.beginPath(); ctx.arc(24, 8, 8, 0, 7); ctx.fill();
      link.href = canvas.toDataURL("image/png");
    };
    logo.src = link.dataset.logo;
  }

  const enable = document.getElementById("enable-notifications");
  if (enable) {
    if (!("Notification" in window) || Notification.permission !== "default") enable.hidden = true;
    enable.addEventListener("click", () => Notification.requestPermission().then(() => { enable.hidden = true; }));
  }
  if (location.pathname.startsWith("/inbox")) { state.unread = 0; }
  updateBadge();

  setInterval(() => {
    const ws = state.socket;
    if (ws && ws.readyState === 1 && ackPending) { ws.send(JSON.stringify({ type: "ack", seq: state.last })); ackPending = false; }
  }, 1000);
  setInterval(() => { const ws = state.socket; if (ws && ws.readyState === 1) ws.send(JSON.stringify({ type: "ping" })); }, 25000);

  /* DAG pan and zoom on the SVG viewBox. */
  const viewport = document.getElementById("dag");
  const svg = viewport && viewport.querySelector("svg");
  if (svg) {
    const full = svg.viewBox.baseVal;
    const home = { x: full.x, y: full.y, w: full.width, h: full.height };
    let view = { ...home };
    const fit = Math.min(1, (viewport.clientWidth || 900) / home.w);
    svg.setAttribute("width", Math.max(home.w * fit, 300));
    svg.setAttribute("height", Math.max(home.h * fit, 120));
    const set = () => svg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`);
    const zoom = (f) => { const cx = view.x + view.w / 2, cy = view.y + view.h / 2; view.w /= f; view.h /= f; view.x = cx - view.w / 2; view.y = cy - view.h / 2; set(); };
    document.querySelectorAll("[data-zoom]").forEach((b) => b.addEventListener("click", () => {
      const f = parseFloat(b.dataset.zoom); if (f === 0) { view = { ...home }; set(); } else zoom(f); }));
    viewport.addEventListener("wheel", (e) => { e.preventDefault(); zoom(e.deltaY < 0 ? 1.15 : 1 / 1.15); }, { passive: false });
    viewport.addEventListener("keydown", (e) => {
      const step = view.w / 10;
      if (e.key === "+" || e.key === "=") zoom(1.25); else if (e.key === "-") zoom(0.8);
      else if (e.key === "ArrowLeft") { view.x -= step; set(); } else if (e.key === "ArrowRight") { view.x += step; set(); }
      else if (e.key === "ArrowUp") { view.y -= step; set(); } else if (e.key === "ArrowDown") { view.y += step; set(); }
    });
    let drag = null;
    svg.addEventListener("pointerdown", (e) => { if (e.target.closest("a")) return; drag = { x: e.clientX, y: e.clientY, v: { ...view } }; });
    window.addEventListener("pointerup", () => { drag = null; });
    window.addEventListener("pointermove", (e) => {
      if (!drag) return;
      const scale = view.w / svg.clientWidth;
      view.x = drag.v.x - (e.clientX - drag.x) * scale; view.y = drag.v.y - (e.clientY - drag.y) * scale; set();
    });
  }

  connect();
})();
