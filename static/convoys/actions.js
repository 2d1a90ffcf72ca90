/* Bead actions on a page (docs/actions.md): tick beads in the wave table and the bead table
 * (shift-click ticks a range; "all in this wave"; "all with the cause…"), preview the chosen
 * action, then confirm. The form works without this script (a preview page, then back); with
 * it the preview and the summary are drawn in place (`action-result`, through convoyLive.place)
 * and the tables change as the action's events arrive, like any other change. */
(function () {
  "use strict";
  const form = document.querySelector("form[data-bead-actions]");
  if (!form) return;
  const picks = () => [...document.querySelectorAll("input[data-pick]")];
  let last = null;

  function count() {
    const chosen = new Set(picks().filter((c) => c.checked).map((c) => c.value));
    const label = document.getElementById("action-picked");
    if (label) label.textContent = chosen.size ? `${chosen.size} selected` : "none selected";
  }

  function tick(value, on) {
    for (const box of picks()) if (box.value === value) box.checked = on;
  }

  document.addEventListener("click", (ev) => {
    const box = ev.target.closest("input[data-pick]");
    if (box) {
      const group = box.closest("table") || document;
      const inGroup = [...group.querySelectorAll("input[data-pick]")];
      if (ev.shiftKey && last && last !== box && inGroup.includes(last)) {
        const [a, b] = [inGroup.indexOf(last), inGroup.indexOf(box)].sort((x, y) => x - y);
        for (const other of inGroup.slice(a, b + 1)) tick(other.value, box.checked);
      }
      tick(box.value, box.checked);
      last = box;
      count();
      return;
    }
    const wave = ev.target.closest("[data-pick-wave]");
    if (wave) {
      const number = wave.dataset.pickWave;
      const row = document.getElementById(`wave-${number}`);
      const boxes = row ? [...row.querySelectorAll("input[data-pick]")] : [];
      document.querySelectorAll(`tr[data-wave="${CSS.escape(number)}"] input[data-pick]`)
        .forEach((b) => boxes.push(b));
      for (const b of boxes) tick(b.value, true);
      count();
      return;
    }
    if (ev.target.closest("[data-pick-none]")) {
      for (const b of picks()) b.checked = false;
      count();
    }
  });

  const cause = document.getElementById("pick-cause");
  function causes() {
    if (!cause) return;
    const kinds = [...new Set([...document.querySelectorAll("tr[data-cause]")]
      .map((r) => r.dataset.cause).filter(Boolean))].sort();
    const keep = cause.options[0];
    cause.replaceChildren(keep);
    for (const kind of kinds) {
      const option = document.createElement("option");
      option.value = kind;
      option.textContent = kind.replaceAll("-", " ");
      cause.append(option);
    }
  }
  if (cause) {
    cause.addEventListener("focus", causes);
    cause.addEventListener("pointerdown", causes);
    cause.addEventListener("change", () => {
      const kind = cause.value;
      if (!kind) return;
      document.querySelectorAll(`tr[data-cause="${CSS.escape(kind)}"] input[data-pick]`)
        .forEach((b) => tick(b.value, true));
      cause.value = "";
      count();
    });
    causes();
  }

  // Not `form.action`: the form's own field named "action" shadows it.
  const target = form.getAttribute("action");
  async function send(data) {
    const response = await fetch(target, {
      method: "POST",
      body: data,
      headers: { "X-Live": "1" },
      credentials: "same-origin",
      cache: "no-store",
    });
    let answer = null;
    try { answer = await response.json(); } catch (err) { answer = null; }
    if (answer && answer.fragments) window.convoyLive.place(answer.fragments, true);
    const focus = document.getElementById("action-confirm") || document.getElementById("action-summary")
      || document.getElementById("action-error");
    if (focus) focus.focus({ preventScroll: false });
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    send(new FormData(form));
  });
  document.addEventListener("submit", (ev) => {
    const confirm = ev.target.closest("form[data-action-confirm]");
    if (!confirm) return;
    ev.preventDefault();
    const button = confirm.querySelector("button");
    if (button) button.disabled = true;
    send(new FormData(confirm));
  });
  document.addEventListener("convoy:fragments", count);
  count();
})();
