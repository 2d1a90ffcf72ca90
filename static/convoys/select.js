/* The dashboard's selection for its bulk controls: a checkbox per convoy row (in the
 * convoy-actions form), shift-click ticks or clears the range since the last one clicked,
 * the header's box ticks every convoy shown, and the form says how many are ticked. Rows
 * redrawn by live updates keep their ticks (live.js carries typed values over). */
(function () {
  "use strict";
  const form = document.getElementById("convoy-actions");
  if (!form) return;
  const count = document.getElementById("selected-count");
  const hint = count ? count.textContent : "";
  let last = null;

  function boxes() {
    return Array.from(document.querySelectorAll('#convoy-table input[type="checkbox"][name="ids"]'));
  }
  function all() { return document.getElementById("select-shown"); }

  function refresh() {
    const shown = boxes();
    const ticked = shown.filter((b) => b.checked).length;
    const head = all();
    if (head) {
      head.checked = shown.length > 0 && ticked === shown.length;
      head.indeterminate = ticked > 0 && ticked < shown.length;
    }
    if (count) count.textContent = ticked ? `${ticked} of ${shown.length} shown selected.` : hint;
  }

  document.addEventListener("click", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || box.type !== "checkbox") return;
    if (box.id === "select-shown") {
      for (const b of boxes()) b.checked = box.checked;
      last = null;
    } else if (box.name === "ids" && box.form === form) {
      const shown = boxes();
      if (event.shiftKey && last && shown.includes(last) && last !== box) {
        const [from, to] = [shown.indexOf(last), shown.indexOf(box)].sort((a, b) => a - b);
        for (const b of shown.slice(from, to + 1)) b.checked = box.checked;
      }
      last = box;
    } else return;
    refresh();
  });

  form.addEventListener("submit", (event) => {
    if (boxes().some((b) => b.checked)) return;
    event.preventDefault();
    if (count) count.textContent = "Select at least one convoy first.";
  });

  document.addEventListener("convoy:fragments", refresh);
  refresh();
})();
