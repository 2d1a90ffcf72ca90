/* The convoy page's DAG: pan (drag, arrow keys) and zoom (wheel, +/-, buttons) on the SVG's
 * viewBox. Live updates replace nodes in place; when the whole drawing is replaced (its layout
 * changed), the view is set up again and keeps its zoom and position if the layout is the same. */
(function () {
  "use strict";
  let view = null, home = null, layout = null, drag = null, svg = null;

  function setView() { if (svg && view) svg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`); }

  function zoom(f) {
    const cx = view.x + view.w / 2, cy = view.y + view.h / 2;
    view.w /= f; view.h /= f; view.x = cx - view.w / 2; view.y = cy - view.h / 2; setView();
  }

  function setup() {
    const viewport = document.getElementById("dag");
    svg = viewport && viewport.querySelector("svg");
    if (!svg || viewport.dataset.panZoom) return;
    viewport.dataset.panZoom = "1";
    const full = svg.viewBox.baseVal;
    home = { x: full.x, y: full.y, w: full.width, h: full.height };
    if (layout !== viewport.dataset.layout || !view) view = { ...home };
    layout = viewport.dataset.layout;
    const fit = Math.min(1, (viewport.clientWidth || 900) / home.w);
    svg.setAttribute("width", Math.max(home.w * fit, 300));
    svg.setAttribute("height", Math.max(home.h * fit, 120));
    setView();
    document.querySelectorAll("[data-zoom]").forEach((b) => b.addEventListener("click", () => {
      const f = parseFloat(b.dataset.zoom);
      if (f === 0) { view = { ...home }; setView(); } else zoom(f);
    }));
    viewport.addEventListener("wheel", (e) => { e.preventDefault(); zoom(e.deltaY < 0 ? 1.15 : 1 / 1.15); }, { passive: false });
    viewport.addEventListener("keydown", (e) => {
      const step = view.w / 10;
      if (e.key === "+" || e.key === "=") zoom(1.25); else if (e.key === "-") zoom(0.8);
      else if (e.key === "ArrowLeft") { view.x -= step; setView(); } else if (e.key === "ArrowRight") { view.x += step; setView(); }
      else if (e.key === "ArrowUp") { view.y -= step; setView(); } else if (e.key === "ArrowDown") { view.y += step; setView(); }
    });
    svg.addEventListener("pointerdown", (e) => { if (e.target.closest("a")) return; drag = { x: e.clientX, y: e.clientY, v: { ...view } }; });
  }

  window.addEventListener("pointerup", () => { drag = null; });
  window.addEventListener("pointermove", (e) => {
    if (!drag || !svg) return;
    const scale = view.w / svg.clientWidth;
    view.x = drag.v.x - (e.clientX - drag.x) * scale; view.y = drag.v.y - (e.clientY - drag.y) * scale; setView();
  });
  document.addEventListener("convoy:fragments", setup);
  setup();
})();
