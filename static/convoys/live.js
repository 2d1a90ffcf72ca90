/* convoyweb live updates.
 *
 * One websocket per page tells which events happened (replayed from the sequence number the
 * page was drawn at, `data-as-of`). The page then asks the server for its fragments with the
 * same URL (`X-Live: 1`, `X-Live-Since: <seq the page shows>`) and replaces each element by id:
 * the server renders the same templates as for a reload, so the page equals a reload.
 * One request in flight, at most one a second; a response older than what the page shows is
 * dropped. "resync" (the log no longer reaches back) refreshes every fragment.
 * Toasts: only for what the page shows, one per landing, at most three; the browser
 * notification once per landing across tabs. */
(function () {
  "use strict";
  const body = document.body;
  const topics = body.dataset.topics || "dashboard,inbox";
  const asOf = parseInt(body.dataset.asOf || "0", 10) || 0;
  // last: newest event seen; rendered: the seq the page shows; due: newest event it must show.
  const state = { last: asOf, rendered: asOf, due: asOf, applied: new Set(), count: 0, log: [],
                  fetches: 0, toasts: [], socket: null, attempt: 0,
                  headers: [] };  // page scripts add headers to live requests (dag.js: its layout)
  window.convoyLive = state;
  // The rules the server states once (convoys/web/context.py browser_rules): how relative
  // times are worded, each drawn state's icon.
  const rulesEl = document.getElementById("browser-rules");
  state.rules = rulesEl ? JSON.parse(rulesEl.textContent) : { relative: {}, icons: {} };
  const liveEl = document.getElementById("live-state");
  const pending = new Map();  // fragments held back while the user is typing in them
  const toasted = new Map();  // toast key -> time shown (one toast per landing)
  const MIN_GAP = 1000, TOAST_KEEP = 8000, MAX_TOASTS = 3, SAME_LANDING = 10 * 60 * 1000;
  let ackPending = false, inflight = false, timer = null, wanted = false, lastFetch = 0;

  function setLive(text, ok) { if (liveEl) { liveEl.textContent = "● " + text; liveEl.classList.toggle("on", ok); } }

  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${proto}//${location.host}/ws/live/?topics=${encodeURIComponent(topics)}&since=${state.last}`;
    const ws = new WebSocket(url);
    state.socket = ws;
    ws.onopen = () => { state.heard = Date.now(); state.attempt = 0; setLive("live", true); reconnected(); };
    ws.onmessage = (msg) => { state.heard = Date.now(); handle(JSON.parse(msg.data)); };
    ws.onclose = (closed) => {
      if (state.socket !== ws) return;  // one the ping loop gave up as silent
      // 4401: the session no longer signs this user in (logged out, password changed,
      // deactivated): reload, which leads to the login page, rather than knock forever.
      if (closed.code === 4401) { setLive("signed out", false); location.reload(); return; }
      lost(Date.now());
    };
  }

  function lost(since) {
    state.socket = null;
    setLive("reconnecting", false);
    disconnected(since);
    const delay = Math.min(30000, 500 * 2 ** state.attempt) * (0.5 + Math.random());
    state.attempt += 1;
    setTimeout(connect, delay);
  }

  /* A server that stopped answering (frozen, or a network that drops packets) keeps its socket
   * open: a ping every PING_EVERY, and a socket silent for SILENT_AFTER is given up as lost
   * since it was last heard. The server answers each ping with a pong. */
  const PING_EVERY = 5000, SILENT_AFTER = 12000;
  setInterval(() => {
    const ws = state.socket;
    if (!ws || ws.readyState !== 1) return;
    if (Date.now() - state.heard > SILENT_AFTER) {
      lost(state.heard);
      try { ws.close(); } catch (e) { /* closing a dead socket */ }
      return;
    }
    ws.send(JSON.stringify({ type: "ping" }));
  }, PING_EVERY);

  /* Staleness: STALE_AFTER without a connection, the page says since when it is not updated
   * and marks what it shows (body.stale) until a live answer after the reconnect caught up. */
  const STALE_AFTER = 10000;
  const stale = { lostAt: null, marked: false, catching: false, timer: null };
  state.stale = stale;
  function disconnected(since) {
    if (stale.lostAt !== null) return;
    stale.lostAt = since || Date.now();
    stale.timer = setInterval(() => {
      if (stale.lostAt !== null && !stale.marked && Date.now() - stale.lostAt >= STALE_AFTER) markStale();
    }, 1000);
  }
  function exact(ms) {  // formatting.EXACT_FORMAT: the pages' one format, in UTC
    const d = new Date(ms), two = (n) => String(n).padStart(2, "0");
    return `${d.getUTCFullYear()}-${two(d.getUTCMonth() + 1)}-${two(d.getUTCDate())} ` +
           `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}:${two(d.getUTCSeconds())} UTC`;
  }
  function markStale() {
    stale.marked = true;
    body.classList.add("stale");
    let banner = document.getElementById("stale-banner");
    if (!banner) {
      banner = document.createElement("p");
      banner.id = "stale-banner";
      banner.className = "msg warn";
      banner.setAttribute("role", "alert");
      const main = document.getElementById("main") || body;
      main.insertBefore(banner, main.firstChild);
    }
    banner.textContent = `Not updated since ${exact(stale.lostAt)}: no connection to the server. ` +
      "What this page shows may be out of date; it catches up when the connection is back.";
    setLive("offline: not updated", false);
  }
  function reconnected() {
    if (stale.lostAt === null) return;
    clearInterval(stale.timer);
    stale.timer = null;
    if (!stale.marked) { stale.lostAt = null; return; }
    stale.catching = true;  // unmarked once a live answer after this shows the newest seq
    refresh();
  }
  function caughtUp() {
    if (!stale.catching || state.due > state.rendered) return;
    stale.catching = false; stale.marked = false; stale.lostAt = null;
    body.classList.remove("stale");
    const banner = document.getElementById("stale-banner");
    if (banner) banner.remove();
  }

  function handle(msg) {
    if (msg.type === "resync") { resync(); return; }
    if (msg.type !== "event") return;
    if (state.applied.has(msg.seq)) return;
    state.applied.add(msg.seq);
    if (state.applied.size > 20000) state.applied = new Set([...state.applied].slice(-10000));
    state.last = Math.max(state.last, msg.seq);
    state.count += 1;
    state.log.push(msg.seq);
    if (state.log.length > 5000) state.log.splice(0, 1000);
    ackPending = true;
    if (msg.seq > asOf) tell(msg);
    if (msg.seq > state.rendered && watched(msg)) {
      state.due = Math.max(state.due, msg.seq);
      refresh();
    }
  }

  /* Pages that follow every event (to hear of rig changes) but show one convoy or bead name
   * what they watch in data-watch: "convoy:<id>", "bead:<id>", "kind:<event kind>". */
  const watch = new Set((body.dataset.watch || "").split(",").filter(Boolean));
  // Kinds only the pages showing their bead or convoy follow (browser-rules: a worker's log).
  const quiet = new Set(state.rules.quiet || []);
  function watched(ev) {
    if (!quiet.has(ev.kind) && (!watch.size || ev.kind === "notification" || watch.has(`kind:${ev.kind}`))) return true;
    if (ev.bead_id && watch.has(`bead:${ev.bead_id}`)) return true;
    return convoysOf(ev).some((id) => watch.has(`convoy:${id}`));
  }

  /* The log no longer reaches back to what the page shows: draw every fragment afresh, then
   * follow the log from there. No reload. */
  async function resync() {
    const data = await fetchFragments(true);
    if (data && state.socket && state.socket.readyState === 1) {
      state.last = Math.max(state.last, data.seq);
      state.socket.send(JSON.stringify({ type: "replay", since: data.seq }));
    }
  }

  // --- fragments ----------------------------------------------------------------------------
  function refresh() { wanted = true; pump(); }

  function pump() {
    if (inflight || timer || !wanted) return;
    timer = setTimeout(() => { timer = null; wanted = false; fetchFragments(false); },
                       Math.max(0, lastFetch + MIN_GAP - Date.now()));
  }

  async function fetchFragments(all) {
    inflight = true;
    lastFetch = Date.now();
    state.fetches += 1;
    const headers = { "X-Live": "1" };
    if (!all) headers["X-Live-Since"] = String(state.rendered);
    for (const add of state.headers) Object.assign(headers, add());
    const url = new URL(location.href);
    if (body.dataset.fragments) url.searchParams.set("fragments", body.dataset.fragments);
    let data = null;
    try {
      const response = await fetch(url, { headers, credentials: "same-origin", cache: "no-store" });
      const type = response.headers.get("Content-Type") || "";
      if (response.ok && type.startsWith("application/json")) {
        data = await response.json();
        apply(data);
      }
    } catch (e) { /* offline: the next event or reconnect asks again */ }
    inflight = false;
    if (state.due > state.rendered) wanted = true;
    pump();
    return data;
  }

  function apply(data) {
    if (data.seq < state.rendered) return;  // older than what the page already shows
    for (const [id, html] of Object.entries(data.fragments)) replace(id, html);
    state.rendered = data.seq;
    body.dataset.rendered = String(data.seq);
    caughtUp();
    updateBadge();
    document.dispatchEvent(new CustomEvent("convoy:fragments"));
  }

  /* Page scripts draw fragments through these, so every fragment follows the same rules (by
   * id, never from under the user's fingers, typed values kept). place: fragments the script
   * has ({id: html}); `quiet` leaves out the convoy:fragments event (for a script that draws
   * in answer to it). load: some of this page's fragments (ids) for `url` (the page with the
   * query it now shows), asked again while the answer is older than the rest of the page. */
  function place(fragments, quiet) {
    for (const [id, html] of Object.entries(fragments)) replace(id, html);
    if (!quiet) document.dispatchEvent(new CustomEvent("convoy:fragments"));
  }
  async function load(url, ids) {
    const asked = new URL(url, location.href);
    asked.searchParams.set("fragments", ids.join(","));
    const headers = { "X-Live": "1" };
    for (const add of state.headers) Object.assign(headers, add());
    for (let attempt = 0; attempt < 3; attempt += 1) {
      const response = await fetch(asked, { headers, credentials: "same-origin", cache: "no-store" });
      if (!response.ok) return null;
      const data = await response.json();
      if (data.seq >= state.rendered || attempt === 2) { place(data.fragments); return data; }
    }
    return null;
  }
  state.place = place;
  state.load = load;

  function replace(id, html) {
    const el = document.getElementById(id);
    if (!el) return;
    const focus = document.activeElement;
    if (focus && focus !== body && el.contains(focus) && focus.matches("input, textarea, select")) {
      pending.set(id, html);  // never pull a form from under the user's fingers
      return;
    }
    pending.delete(id);
    if (html === "") { el.remove(); return; }  // it left the page (a done bead off a long list)
    const typed = typedValues(el);
    el.outerHTML = html;
    const fresh = document.getElementById(id);
    if (fresh && typed.length) restoreValues(fresh, typed);
  }

  document.addEventListener("focusout", () => setTimeout(() => {
    for (const [id, html] of [...pending]) replace(id, html);
  }, 0));

  /* Values the user changed in a fragment's form controls, to carry into its new version. */
  function typedValues(el) {
    const out = [];
    el.querySelectorAll("input[name], textarea[name], select[name]").forEach((c) => {
      if (c.type === "hidden") return;
      if (c.type === "checkbox" || c.type === "radio") {
        if (c.checked !== c.defaultChecked) out.push([c.name, c.value, c.checked]);
      } else if (c.tagName === "SELECT") {
        const chosen = c.selectedOptions[0];
        if (chosen && !chosen.defaultSelected) out.push([c.name, c.value, null]);
      } else if (c.value !== c.defaultValue) out.push([c.name, c.value, null]);
    });
    return out;
  }

  function restoreValues(el, typed) {
    for (const [name, value, checked] of typed) {
      el.querySelectorAll(`[name="${CSS.escape(name)}"]`).forEach((c) => {
        if (checked === null) c.value = value;
        else if (c.value === value) c.checked = checked;
      });
    }
  }

  // --- toasts and notifications ---------------------------------------------------------------
  function convoysOf(ev) {
    const ids = new Set((ev.data && ev.data.convoys) || []);
    if (ev.convoy_id) ids.add(ev.convoy_id);
    return [...ids];
  }

  /* Does this page show the event's convoy? Convoy page: its convoy; dashboard: the listed
   * convoys; elsewhere: the user's subscriptions. */
  function convoyName(ev) {
    const title = ((ev.data && ev.data.title) || ev.convoy_id || "").replace(/^Convoy: /, "");
    return title || ev.convoy_id;
  }

  function tell(ev) {
    const d = ev.data || {};
    if (ev.kind === "notification") {
      // Addressed to this user: every page tells it but another convoy's page. (The dashboard
      // may already have dropped the landed convoy's row when the notification arrives.)
      // A receipt the user takes in the daily digest is quiet: the inbox only.
      if (d.quiet) return;
      const here = !body.dataset.convoy || convoysOf(ev).includes(body.dataset.convoy);
      if (d.user_id !== undefined && here) {
        if (d.action_needed) toast(`note:${d.notification_id || ev.seq}`, d.subject, "bad");
        else if (d.kind === "landed") toast(`landed:${ev.convoy_id}`, `Convoy landed: ${convoyName(ev)} (${ev.convoy_id})`, "good");
        else if (d.kind === "closed") toast(`closed:${ev.convoy_id}`, `Convoy closed: ${convoyName(ev)} (${ev.convoy_id})`, "");
      }
      notifyBrowser(ev);
      return;
    }
    // Dispatches never toast: the row, the node and the counts show them. Landings toast for
    // the user's subscriptions (the notifications above) and, on a convoy's own page, its own.
    if (ev.kind === "convoy.landed" && body.dataset.convoy && ev.convoy_id === body.dataset.convoy)
      toast(`landed:${ev.convoy_id}`, `Convoy landed: ${convoyName(ev)} (${ev.convoy_id})`, "good");
  }

  function toast(key, text, kind) {
    const now = Date.now();
    if (now - (toasted.get(key) || -Infinity) < SAME_LANDING) return;
    toasted.set(key, now);
    state.toasts.push(text);
    const box = document.getElementById("toasts");
    if (!box) return;
    const el = document.createElement("div");
    el.className = "toast " + (kind || "");  // #toasts is a live region: read once, as added
    el.dataset.key = key;
    el.textContent = text;
    box.appendChild(el);
    setTimeout(() => el.remove(), TOAST_KEEP);
    while (box.children.length > MAX_TOASTS) box.firstChild.remove();
  }

  /* Once per landing per user across tabs. One tab of the origin is the notifier: it holds a
   * Web Lock for as long as it is open, and the next tab takes over when it closes. (A claim in
   * localStorage is not enough: Chromium propagates its writes to other tabs asynchronously, so
   * two tabs could both see the key unset.) Without Web Locks, the localStorage claim is the
   * fallback; the tag makes the browser replace rather than stack a duplicate. */
  const NOTIFIED = "convoyweb:notified:";
  let notifier = false;
  if (navigator.locks) {
    navigator.locks.request("convoyweb-notifier", () => {
      notifier = true;
      return new Promise(() => {});  // held until this tab goes away
    }).catch(() => {});
  }

  function claimOnce(key) {
    if (navigator.locks) return notifier;
    try {
      if (localStorage.getItem(key)) return false;
      localStorage.setItem(key, String(Date.now()));
      return true;
    } catch (e) { return true; }  // storage refused: the tag still folds duplicates
  }

  function notifyBrowser(ev) {
    const d = ev.data || {};
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    if (!claimOnce(NOTIFIED + (d.notification_id || ev.seq))) return;
    const n = d.action_needed
      ? new Notification(d.subject, { tag: `note:${d.notification_id || ev.seq}`, body: ev.convoy_id })
      : new Notification(`Convoy landed: ${convoyName(ev)}`, { tag: `landed:${ev.convoy_id}`, body: ev.convoy_id });
    n.onclick = () => { window.focus(); location.href = `/convoys/${encodeURIComponent(ev.convoy_id)}/`; };
  }

  function forgetOldClaims() {
    try {
      for (const key of Object.keys(localStorage)) {
        if (key.startsWith(NOTIFIED) && Date.now() - Number(localStorage.getItem(key)) > 86400000) localStorage.removeItem(key);
      }
    } catch (e) { /* no storage */ }
  }

  function updateBadge() {
    const badge = document.getElementById("unread");
    const unread = badge ? parseInt(badge.textContent, 10) || 0 : 0;
    document.title = (unread ? `(${unread}) ` : "") + document.title.replace(/^\(\d+\) /, "");
    const link = document.getElementById("favicon");
    if (!link) return;
    link.dataset.logo = link.dataset.logo || link.href;
    if (!unread) { link.href = link.dataset.logo; return; }
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
  updateBadge();
  forgetOldClaims();
  // A page's "done" notes ("Subscribed to …") go after a while: what they said may not stay
  // true on a live page (errors and warnings stay until the user acts).
  setTimeout(() => document.querySelectorAll(".messages .msg.success, .messages .msg.info")
    .forEach((note) => note.remove()), 15000);

  setInterval(() => {
    const ws = state.socket;
    if (ws && ws.readyState === 1 && ackPending) { ws.send(JSON.stringify({ type: "ack", seq: state.last })); ackPending = false; }
  }, 1000);


  /* Relative times ("3m ago") drift on a page left open: word them again from the exact time
   * each carries, every 20 s, with the server's clock (data-now: when the page was drawn), in
   * the words the server states (formatting.RELATIVE_WORDS, in the browser-rules block). */
  const skew = (Date.parse(body.dataset.now || "") || Date.now()) - Date.now();
  function duration(seconds) {
    let minutes = Math.floor(seconds / 60);
    if (minutes < 1) return words.instant;
    if (minutes < 60) return `${minutes}m`;
    let hours = Math.floor(minutes / 60);
    minutes %= 60;
    if (hours < 24) return minutes ? `${hours}h ${minutes}m` : `${hours}h`;
    const days = Math.floor(hours / 24);
    hours %= 24;
    return hours ? `${days}d ${hours}h` : `${days}d`;
  }
  const words = state.rules.relative;
  function relative(moment, now) {
    const seconds = (moment - now) / 1000;
    if (seconds > 0 && seconds < 60) return words.soon;
    if (Math.abs(seconds) < 60) return words.now;
    const text = duration(Math.abs(seconds));
    return (seconds > 0 ? words.ahead : words.ago).replace("{}", text);
  }
  function rewordTimes() {
    const now = Date.now() + skew;
    document.querySelectorAll("time[data-relative][datetime]").forEach((el) => {
      const moment = Date.parse(el.getAttribute("datetime"));
      if (Number.isNaN(moment)) return;
      const text = relative(moment, now);
      if (el.textContent !== text) el.textContent = text;
    });
  }
  state.rewordTimes = rewordTimes;
  setInterval(rewordTimes, 20000);

  connect();
})();
