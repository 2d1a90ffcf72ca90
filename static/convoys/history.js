/* The convoy page's story over time (convoy page only).
 *
 * Time slider: #history-slider steps through the convoy's events; each step asks the server
 * for the page's progress as it was after that event (replayed from the event log) and shows
 * it: DAG node classes, the wave table and the counts. "Back to now" (or the slider at its end)
 * asks for the present fragments again. Live updates keep coming: while the page shows the
 * past, the past is applied again after each one; the slider's end follows the log.
 *
 * Since your last visit: the page reports it was shown (POST, the seq it was drawn at); the
 * answer names the beads changed since this user's previous visit, marked .since-visit in the
 * graph, the wave table and the timeline until the page is left. A visible page that showed a
 * live update has shown it: the visit moves on with it, so a reload after watching marks
 * nothing the user watched change. What arrived while the tab was hidden is marked when the
 * tab is shown again. */
(function () {
  "use strict";
  // The pages' one format (formatting.EXACT_FORMAT), in UTC as the server draws it.
  function exactTime(iso) {
    const d = new Date(iso), two = (n) => String(n).padStart(2, "0");
    return `${d.getUTCFullYear()}-${two(d.getUTCMonth() + 1)}-${two(d.getUTCDate())} ` +
           `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}:${two(d.getUTCSeconds())} UTC`;
  }
  const card = document.getElementById("history-card");
  if (!card) return;
  const slider = document.getElementById("history-slider");
  const nowButton = document.getElementById("history-now");
  const stateEl = document.getElementById("history-state");
  const sinceEl = document.getElementById("since-visit");
  // past: the step shown; target: the step asked for (the slider stays there meanwhile).
  const history = { past: null, target: null, pending: 0, changed: [], requests: 0 };
  window.convoyHistory = history;
  const csrf = () => (document.querySelector("input[name=csrfmiddlewaretoken]") || {}).value || "";
  const live = window.convoyLive;
  const ICONS = live.rules.icons;  // {drawn state: icon}, as the server draws the graph
  const STATE_CLASSES = Object.keys(ICONS).map((state) => "st-" + state);

  function steps() {
    const gantt = document.getElementById("gantt-card");
    return parseInt((gantt && gantt.dataset.steps) || slider.max || "1", 10) || 1;
  }

  let timer = null;  // a slider move waiting to be shown (the slider is the user's until then)

  function setMax() {
    const atEnd = history.target === null && timer === null;
    const max = steps();
    if (String(max) !== slider.max) slider.max = String(max);
    if (max > 0) slider.disabled = false;
    if (atEnd) slider.value = String(max);
  }

  function applyPast(data) {
    const dag = document.getElementById("dag");
    if (dag) {
      dag.querySelectorAll("g.node[data-id]").forEach((node) => {
        const state = data.states[node.dataset.id];
        if (!state) return;
        const cls = "st-" + state;
        STATE_CLASSES.forEach((c) => node.classList.remove(c));
        node.classList.add(cls);
        const icon = node.querySelector("text.icon");
        if (icon && !node.classList.contains("gate") && !node.classList.contains("ghost")) icon.textContent = ICONS[state];
      });
    }
    live.place(data.fragments, true);  // quiet: this runs in answer to convoy:fragments too
    const c = data.counts;
    // The head's bar and counts line as they were (the next live update redraws the head;
    // the past is applied again after it).
    const bar = document.querySelector("#convoy-head svg.bar");
    if (bar) {
      const t = document.createElement("template");
      t.innerHTML = data.bar;
      if (t.content.firstElementChild) bar.replaceWith(t.content.firstElementChild);
    }
    const line = document.querySelector("#convoy-head p.counts");
    if (line) {
      line.textContent = `As after event #${data.seq}: ${c.done}/${c.total} done (${c.percent_complete}%) · ${c.active} in progress · ` +
        `${c.ready} ready · ${c.blocked} blocked · ${c.unknown} unknown`;
    }
    const when = exactTime(data.at);
    stateEl.textContent = `Showing the past: after event #${data.seq} (${data.what || data.kind}${data.bead ? " " + data.bead : ""}, ${when}), step ${data.step} of ${data.steps}: ` +
      `${c.done}/${c.total} done · ${c.active} in progress · ${c.ready} ready · ${c.blocked} blocked` + (c.unknown ? ` · ${c.unknown} unknown` : "");
    document.body.classList.add("history-past");
    nowButton.disabled = false;
    markChanged();
  }

  async function show(step) {
    const ticket = ++history.pending;
    history.target = step;
    history.requests += 1;
    const url = new URL(card.dataset.stepUrl, location.href);
    url.searchParams.set("step", String(step));
    let data = null;
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.ok) data = await response.json();
      else stateEl.textContent = (await response.json().catch(() => ({}))).detail || `error ${response.status}`;
    } catch (e) { stateEl.textContent = "offline: could not load that step"; }
    if (!data || ticket !== history.pending) return;
    history.past = data;
    applyPast(data);
  }

  async function backToNow() {
    history.past = null;
    history.target = null;
    history.pending += 1;
    document.body.classList.remove("history-past");
    stateEl.textContent = "Showing now.";
    nowButton.disabled = true;
    try {
      await live.load(location.href, ["convoy-head", "dag-card", "wave-card", "gantt-card"]);
    } catch (e) { /* the next live update draws the present */ }
    setMax();
  }

  slider.addEventListener("input", () => {
    clearTimeout(timer);
    const value = parseInt(slider.value, 10);
    timer = setTimeout(() => {
      timer = null;
      if (value >= steps() && history.target !== null) backToNow();
      else if (value < steps()) show(value);
    }, 120);
  });
  nowButton.addEventListener("click", () => { backToNow(); });

  // --- since your last visit ----------------------------------------------------------------
  function markChanged() {
    if (!history.changed.length) return;
    const ids = new Set(history.changed);
    document.querySelectorAll("#dag g.node[data-id], #wave-card [data-bead], #gantt [data-bead], #bead-table [data-bead]").forEach((el) => {
      const id = el.dataset.id || el.dataset.bead;
      if (ids.has(id)) el.classList.add("since-visit");
    });
  }

  const shownSeq = () =>
    parseInt(document.body.dataset.rendered || document.body.dataset.asOf || "0", 10) || 0;
  let reported = 0, reporting = false, missed = false;

  async function post(seq) {
    const body = new URLSearchParams({ seq: String(seq) });
    const response = await fetch(card.dataset.visitUrl, {
      method: "POST", body, credentials: "same-origin", headers: { "X-CSRFToken": csrf() },
    });
    return response.ok ? response.json() : null;
  }

  // The page shows events up to shownSeq(): while it is visible, the user has seen them.
  async function seen() {
    if (reporting || document.visibilityState !== "visible" || shownSeq() <= reported) return;
    reporting = true;
    const seq = shownSeq(), back = missed;
    missed = false;
    try {
      const data = await post(seq);
      reported = Math.max(reported, seq);
      if (back && data && data.changed.length) {  // shown again: what arrived while hidden
        history.changed = [...new Set([...history.changed, ...data.changed])];
        banner(`While this tab was hidden: ${data.changed.length} bead${data.changed.length === 1 ? "" : "s"} changed, marked ◆: `, data);
        markChanged();
      }
    } catch (e) { missed = missed || back; /* the next update reports again */ }
    reporting = false;
    if (shownSeq() > reported) seen();
  }

  function banner(text, data) {
    sinceEl.textContent = "";
    sinceEl.append(text);
    for (const id of data.shown) {
      const code = document.createElement("code");
      code.className = "since-visit";
      code.textContent = id;
      sinceEl.append(code, " ");
    }
    if (data.hidden) sinceEl.append(`+${data.hidden} more`);
    sinceEl.hidden = false;
  }

  async function reportVisit() {
    const seq = parseInt(document.body.dataset.asOf || "0", 10) || 0;
    reporting = true;  // first: a later report must not overtake the one that reads the visit
    try {
      const data = await post(seq);
      reported = Math.max(reported, seq);
      if (data && data.previous) {
        history.changed = data.changed;
        const when = exactTime(data.previous.at);
        const n = data.changed.length;
        banner(n
          ? `Since your last visit (${when}): ${n} bead${n === 1 ? "" : "s"} changed, marked ◆: `
          : `Nothing changed since your last visit (${when}).`, data);
        markChanged();
      }
    } catch (e) { /* no mark this time */ }
    finally { reporting = false; }
    seen();
  }

  document.addEventListener("convoy:fragments", () => {
    setMax();
    if (history.past) applyPast(history.past);
    else markChanged();
    if (document.visibilityState === "visible") seen();
    else missed = true;
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") seen();
  });
  setMax();
  reportVisit();
})();
