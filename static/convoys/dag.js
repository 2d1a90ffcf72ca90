/* The convoy page's DAG (loaded on that page only).
 * Pan: drag (mouse or one finger), arrow keys. Zoom: wheel (about the pointer), pinch, +/-,
 * buttons; 0 or Reset shows it all (on a phone: the window it opened on, at natural size).
 * Hovering or keyboard-focusing a bead highlights its upstream and downstream chains and
 * dims the rest; ?focus=<id> (data-focus) centres the view
 * on that bead and keeps its chains highlighted. Live updates replace nodes in place; when the
 * whole drawing is replaced (its layout changed) the view is set up again and keeps its zoom
 * and position if the layout is the same. What this script adds for a highlight (class hl, a
 * top layer) goes when the pointer or focus leaves, so a live page still equals a reload. */
(function () {
  "use strict";
  let view = null, home = null, start = null, layout = null, svg = null, viewport = null;
  const NARROW = "(max-width: 600px)";  // as app.css's phone layout
  let graph = null, lit = [], pinned = "";
  const pointers = new Map();
  let drag = null, pinch = null;

  // A live update names the layout this page draws: the server then sends changed nodes
  // only, or the whole drawing when its layout changed.
  if (window.convoyLive) {
    window.convoyLive.headers.push(() => {
      const dag = document.getElementById("dag");
      return dag && dag.dataset.layout ? { "X-Live-Layout": dag.dataset.layout } : {};
    });
  }

  function setView() { if (svg && view) svg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`); }

  /* Zoom by f about a point in drawing units (the centre by default). */
  function zoom(f, px, py) {
    if (!view) return;
    const cx = px === undefined ? view.x + view.w / 2 : px, cy = py === undefined ? view.y + view.h / 2 : py;
    view.x = cx - (cx - view.x) / f; view.y = cy - (cy - view.y) / f;
    view.w /= f; view.h /= f; setView();
  }

  function toDrawing(clientX, clientY) {
    const r = svg.getBoundingClientRect();
    return [view.x + (clientX - r.left) * view.w / (r.width || 1), view.y + (clientY - r.top) * view.h / (r.height || 1)];
  }

  // --- the chains of a bead -------------------------------------------------------------------
  function readGraph() {
    const up = new Map(), down = new Map(), nodes = new Map(), edges = [];
    svg.querySelectorAll(".nodes g.node[data-id]").forEach((n) => nodes.set(n.dataset.id, n));
    svg.querySelectorAll(".edges path.edge[data-from]").forEach((e) => {
      const a = e.dataset.from, b = e.dataset.to;
      edges.push(e);
      if (!down.has(a)) down.set(a, []); down.get(a).push(b);
      if (!up.has(b)) up.set(b, []); up.get(b).push(a);
    });
    return { up, down, nodes, edges };
  }

  function reach(start, next) {
    const seen = new Set([start]), queue = [start];
    while (queue.length) for (const n of next.get(queue.pop()) || []) if (!seen.has(n)) { seen.add(n); queue.push(n); }
    return seen;
  }

  let shown = "";  // the bead whose chains are lit
  /* The highlight is a veil over the whole drawing with copies of the chain's nodes and edges
   * on top (pointer events pass through to the originals): dimming thousands of elements one
   * by one cost a 5,000-bead page ~0.6 s of style work per hover. The originals get class hl. */
  const SVGNS = "http://www.w3.org/2000/svg";
  function clear() {
    for (const el of lit) el.classList.remove("hl", "hl-focus");
    lit = []; shown = "";
    if (svg) svg.querySelectorAll(".hl-layer").forEach((layer) => layer.remove());
  }

  function highlight(id) {
    if (id && id === shown && lit.length && lit[0].isConnected) return;  // moving within one bead
    clear();
    if (!svg || !id) return;
    shown = id;
    graph = graph || readGraph();
    if (!graph.nodes.has(id)) return;
    const ups = reach(id, graph.up), downs = reach(id, graph.down);
    const layer = document.createElementNS(SVGNS, "g");
    layer.setAttribute("class", "hl-layer");
    layer.setAttribute("aria-hidden", "true");
    const veil = document.createElementNS(SVGNS, "rect");
    veil.setAttribute("class", "veil");
    for (const [k, v] of [["x", home.x], ["y", home.y], ["width", home.w], ["height", home.h]]) veil.setAttribute(k, v);
    layer.appendChild(veil);
    const mark = (el) => {
      el.classList.add("hl"); lit.push(el);
      const copy = el.cloneNode(true);
      copy.removeAttribute("id"); copy.removeAttribute("tabindex");
      layer.appendChild(copy);
    };
    const onChain = (e) => (ups.has(e.dataset.from) && ups.has(e.dataset.to)) || (downs.has(e.dataset.from) && downs.has(e.dataset.to));
    for (const e of graph.edges) if (onChain(e)) mark(e);
    graph.nodes.get(id).classList.add("hl-focus");
    for (const n of new Set([...ups, ...downs])) { const el = graph.nodes.get(n); if (el) mark(el); }
    svg.querySelectorAll("#dag-overlay [data-id], #dag-overlay .edge").forEach((el) => {
      if (el.dataset.id ? ups.has(el.dataset.id) || downs.has(el.dataset.id) : onChain(el)) mark(el);
    });
    svg.appendChild(layer);
  }

  function nodeOf(target) { const g = target && target.closest && target.closest("g.node[data-id], a.node-link"); return g && (g.matches("a") ? g.querySelector("g.node[data-id]") : g); }

  // --- set up (again after a live redraw of the whole card) -------------------------------------
  function setup() {
    viewport = document.getElementById("dag");
    svg = viewport && viewport.querySelector("svg");
    if (!svg || viewport.dataset.panZoom) return;
    viewport.dataset.panZoom = "1";
    const full = svg.viewBox.baseVal;
    home = { x: full.x, y: full.y, w: full.width, h: full.height };
    const room = viewport.clientWidth || 900;
    const fit = Math.min(1, room / home.w);
    if (fit < 1 && window.matchMedia(NARROW).matches) {
      // A phone: the whole drawing shrunk to the screen's width would draw its labels a few
      // px high, so it opens on a window of it at its natural size (labels 11 px and up),
      // the screen wide and at most 60% of it high, to pan and zoom from.
      const h = Math.min(home.h, Math.max(Math.round(window.innerHeight * 0.6), 240));
      start = { x: home.x, y: home.y, w: room, h };
      frontier(start);
      svg.setAttribute("width", room);
      svg.setAttribute("height", h);
    } else {
      start = { ...home };
      svg.setAttribute("width", Math.max(home.w * fit, 300));
      svg.setAttribute("height", Math.max(home.h * fit, 120));
    }
    if (layout !== viewport.dataset.layout || !view) view = { ...start };
    layout = viewport.dataset.layout;
    setView();
    pinned = viewport.dataset.focus || "";
    if (pinned) centre(pinned, fit);
    document.querySelectorAll("[data-zoom]").forEach((b) => b.addEventListener("click", () => {
      const f = parseFloat(b.dataset.zoom);
      if (f === 0) { view = { ...start }; setView(); } else zoom(f);
    }));
    viewport.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [px, py] = toDrawing(e.clientX, e.clientY);
      zoom(e.deltaY < 0 ? 1.15 : 1 / 1.15, px, py);
    }, { passive: false });
    viewport.addEventListener("keydown", (e) => {
      if (e.target !== viewport && !e.target.closest("svg")) return;
      const step = view.w / 10;
      const moves = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, -step], ArrowDown: [0, step] };
      if (e.key === "+" || e.key === "=") zoom(1.25);
      else if (e.key === "-") zoom(0.8);
      else if (e.key === "0") { view = { ...start }; setView(); }
      else if (moves[e.key]) { view.x += moves[e.key][0]; view.y += moves[e.key][1]; setView(); }
      else return;
      e.preventDefault();
    });
    svg.addEventListener("pointerdown", (e) => {
      if (e.pointerType === "mouse" && e.target.closest("a")) return;  // a click opens the bead
      pointers.set(e.pointerId, [e.clientX, e.clientY]);
      if (pointers.size === 1) drag = { x: e.clientX, y: e.clientY, v: { ...view } };
      else if (pointers.size === 2) { drag = null; pinch = spread(); }
    });
    svg.addEventListener("pointerover", (e) => { const n = nodeOf(e.target); if (n) highlight(n.dataset.id); });
    svg.addEventListener("pointerleave", () => { if (pinned) highlight(pinned); else clear(); });
    svg.addEventListener("focusin", (e) => { const n = nodeOf(e.target); if (n) highlight(n.dataset.id); });
    svg.addEventListener("focusout", () => { if (pinned) highlight(pinned); else clear(); });
    if (pinned) highlight(pinned);
    const warm = () => { if (svg && !graph) graph = readGraph(); };
    if (window.requestIdleCallback) requestIdleCallback(warm); else setTimeout(warm, 200);
  }

  /* A phone's window opens where the work is: at the leftmost bead working or ready (the
   * waves before it are done), that bead's column at the window's left edge. */
  function frontier(win) {
    let best = null;
    svg.querySelectorAll(".nodes g.node.st-active, .nodes g.node.st-ready").forEach((n) => {
      const m = n.transform.baseVal.consolidate();
      if (m && (!best || m.matrix.e < best.e)) best = { e: m.matrix.e, f: m.matrix.f, n };
    });
    if (!best) return;
    const box = best.n.querySelector("rect, polygon").getBBox();
    const clamp = (v, lo, hi) => Math.max(lo, Math.min(v, hi));
    win.x = clamp(best.e - 24, home.x, home.x + home.w - win.w);
    win.y = clamp(best.f + box.height / 2 - win.h / 2, home.y, home.y + home.h - win.h);
  }

  /* Centre the view on a bead at its natural size (one drawing unit a pixel); a drawing that
   * fits the page already is left as it is. */
  function centre(id, fit) {
    const n = svg.querySelector(`g.node[data-id="${CSS.escape(id)}"]`);
    const windowed = start.w < home.w || start.h < home.h;  // a phone's window of the drawing
    if (!n || (fit >= 1 && !windowed)) return;
    const m = n.transform.baseVal.consolidate();
    const box = n.querySelector("rect, polygon").getBBox();
    const cx = (m ? m.matrix.e : 0) + box.width / 2, cy = (m ? m.matrix.f : 0) + box.height / 2;
    view = windowed ? { w: start.w, h: start.h, x: 0, y: 0 } : { w: home.w * fit, h: home.h * fit, x: 0, y: 0 };
    view.x = cx - view.w / 2; view.y = cy - view.h / 2;
    setView();
  }

  function spread() {
    const [a, b] = [...pointers.values()];
    return { d: Math.hypot(a[0] - b[0], a[1] - b[1]) || 1, mid: [(a[0] + b[0]) / 2, (a[1] + b[1]) / 2] };
  }

  function release(e) { pointers.delete(e.pointerId); if (pointers.size < 2) pinch = null; if (!pointers.size) drag = null; }
  window.addEventListener("pointerup", release);
  window.addEventListener("pointercancel", release);
  window.addEventListener("pointermove", (e) => {
    if (!svg || !pointers.has(e.pointerId)) return;
    pointers.set(e.pointerId, [e.clientX, e.clientY]);
    if (pinch && pointers.size === 2) {
      const now = spread();
      const [px, py] = toDrawing(now.mid[0], now.mid[1]);
      zoom(now.d / pinch.d, px, py);
      pinch = now;
    } else if (drag) {
      const scale = view.w / (svg.clientWidth || 1);
      view.x = drag.v.x - (e.clientX - drag.x) * scale; view.y = drag.v.y - (e.clientY - drag.y) * scale; setView();
    }
  });
  document.addEventListener("convoy:fragments", () => {
    // Nodes were replaced: forget the old elements (the highlight is drawn again if pinned).
    clear(); graph = null; setup();
    if (pinned && svg) highlight(pinned);
  });
  /* An overview (big convoys) draws a few waves; "open in graph" (a wave's row, a wave's
   * "N more" box) adds its wave: the page's URL gains ?open=N (so live updates and a reload
   * draw the same) and the graph and wave table are fetched as fragments. */
  document.addEventListener("click", async (e) => {
    const link = e.target.closest && e.target.closest("[data-open-wave]");
    if (!link || e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey) return;
    e.preventDefault();
    const url = new URL(location.href);
    const open = (url.searchParams.get("open") || "").split(",").filter(Boolean);
    const wave = link.getAttribute("data-open-wave");
    if (!open.includes(wave)) open.push(wave);
    url.searchParams.set("open", open.join(","));
    url.searchParams.delete("fragments");
    url.hash = "";
    history.replaceState(history.state, "", url);
    if (!(await window.convoyLive.load(url, ["dag-card", "wave-card"]))) return;
    const card = document.getElementById("dag-card");
    if (card) card.scrollIntoView({ block: "nearest" });
  });
  setup();
})();
