/* The command palette, on every page: Ctrl-K (Cmd-K) opens it; typing finds beads, epics,
 * convoys and rigs by id or title (GET /api/search, debounced) and offers what can be done to
 * each: open it, pause or resume a convoy, acknowledge its escalation, stage an epic. Arrow
 * keys move, Enter goes, Escape closes and gives the focus back to where it was. What the
 * user picks is remembered (localStorage) and comes first next time. Keyboard only works:
 * the input is a combobox whose listbox option in focus is its aria-activedescendant. */
(function () {
  "use strict";
  const dialog = document.getElementById("palette");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const input = document.getElementById("palette-input");
  const list = document.getElementById("palette-list");
  const status = document.getElementById("palette-status");
  const post = document.getElementById("palette-post");
  const opener = document.getElementById("palette-open");
  const urls = dialog.dataset;
  const canChange = urls.canChange === "1";
  const RECENT = "convoyweb.palette.recent";
  const VERBS = { pause: "pause", resume: "resume", ack: "acknowledge", acknowledge: "acknowledge", stage: "stage", open: "open" };
  let items = [];
  let active = -1;
  let returnTo = null;
  let timer = null;
  let asked = 0;
  let enterWaits = false;  // Enter pressed before the answer came: go when it comes

  function recent() {
    try { return JSON.parse(localStorage.getItem(RECENT) || "[]").filter((r) => r && r.key); } catch (e) { return []; }
  }
  function remember(item) {
    const kept = recent().filter((r) => r.key !== item.key);
    kept.unshift({ key: item.key, label: item.label, detail: item.detail, kind: item.kind, href: item.href || "", post: item.post || "" });
    try { localStorage.setItem(RECENT, JSON.stringify(kept.slice(0, 30))); } catch (e) { /* private mode: not remembered */ }
  }

  function open() {
    if (dialog.open) return;
    returnTo = document.activeElement;
    dialog.showModal();
    input.value = "";
    show(pages(""));
    input.focus();
  }
  function close() {
    if (dialog.open) dialog.close();
  }
  dialog.addEventListener("close", () => {
    clearTimeout(timer);
    timer = null;
    enterWaits = false;
    asked += 1;  // an answer still on its way is dropped
    const back = returnTo && document.contains(returnTo) ? returnTo : opener;
    returnTo = null;
    if (back && typeof back.focus === "function") back.focus();
  });

  document.addEventListener("keydown", (event) => {
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "k") {
      event.preventDefault();
      if (dialog.open) close(); else open();
    }
  });
  if (opener) opener.addEventListener("click", open);

  /* What the text alone offers: the recent picks, the main pages, searching for it. */
  function pages(text) {
    const found = [];
    const words = text.trim().toLowerCase();
    const seen = new Set();
    for (const r of recent()) {
      if (!words || `${r.label} ${r.detail}`.toLowerCase().includes(words)) { found.push(r); seen.add(r.key); }
    }
    if (!words) {
      for (const [label, href] of [["Dashboard", urls.dashboard], ["Stage an epic", urls.stage], ["Inbox", urls.inbox], ["Stranded convoys", urls.stranded]]) {
        const key = `page ${href}`;
        if (!seen.has(key)) found.push({ key, label, detail: "page", kind: "page", href });
      }
    }
    return found.slice(0, 12);
  }

  function actionsFor(hit, verb) {
    const out = [];
    const add = (v, label, extra) => {
      if (!verb || verb === v) out.push(Object.assign({ key: `${v} ${hit.kind} ${hit.id}`, label, detail: `${hit.title} (${hit.status})`, kind: hit.kind }, extra));
    };
    add("open", `${hit.id}`, { href: hit.url });
    if (hit.kind === "convoy") {
      if (canChange && hit.status === "paused") add("resume", `resume ${hit.id}`, { post: `${hit.url}resume/` });
      else if (canChange && hit.status !== "closed" && hit.status !== "landed") add("pause", `pause ${hit.id}`, { post: `${hit.url}pause/` });
      // A closed convoy escalates no more: there is nothing of it to acknowledge.
      if (hit.status !== "closed" && hit.status !== "landed") add("acknowledge", `acknowledge ${hit.id}`, { post: `${hit.url}ack/` });
    }
    if (hit.kind === "epic") add("stage", `stage ${hit.id}`, { href: `${urls.stage}?epic=${encodeURIComponent(hit.id)}` });
    return out;
  }

  function ranked(found) {
    const order = new Map(recent().map((r, i) => [r.key, i]));
    return found
      .map((item, i) => [order.has(item.key) ? order.get(item.key) : 1000 + i, item])
      .sort((a, b) => a[0] - b[0])
      .map((pair) => pair[1]);
  }

  async function ask(text) {
    const mine = ++asked;
    const parts = text.trim().split(/\s+/);
    const verb = parts.length > 1 ? VERBS[parts[0].toLowerCase()] : undefined;
    const q = verb ? parts.slice(1).join(" ") : text.trim();
    let hits = [];
    try {
      const url = new URL(urls.api, location.href);
      url.searchParams.set("q", q);
      url.searchParams.set("limit", "8");
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.ok) hits = (await response.json()).hits || [];
    } catch (e) { /* offline: only what the text offers */ }
    if (mine !== asked || !dialog.open) return;
    timer = null;
    const found = ranked(hits.flatMap((hit) => actionsFor(hit, verb)));
    found.push({ key: `search ${q}`, label: `Search for \u201c${q}\u201d`, detail: "every match, a page at a time", kind: "search", href: `${urls.search}?q=${encodeURIComponent(q)}`, transient: true });
    show(found);
    if (enterWaits) { enterWaits = false; go(items[active]); }
  }

  function show(found) {
    items = found;
    list.replaceChildren();
    found.forEach((item, i) => {
      const li = document.createElement("li");
      li.id = `palette-option-${i}`;
      li.setAttribute("role", "option");
      li.setAttribute("aria-selected", "false");
      li.dataset.index = String(i);
      const kind = document.createElement("span");
      kind.className = "tag kind";
      kind.textContent = item.kind;
      const label = document.createElement("span");
      label.className = "palette-label";
      label.textContent = item.label;
      const detail = document.createElement("span");
      detail.className = "palette-detail";
      detail.textContent = item.detail || "";
      li.append(kind, " ", label, " ", detail);
      list.append(li);
    });
    input.setAttribute("aria-expanded", found.length ? "true" : "false");
    if (status) status.textContent = found.length ? `${found.length} option${found.length === 1 ? "" : "s"}` : "Nothing matches";
    move(found.length ? 0 : -1);
  }

  function move(to) {
    const options = list.children;
    if (active >= 0 && options[active]) options[active].setAttribute("aria-selected", "false");
    active = to;
    if (to >= 0 && options[to]) {
      options[to].setAttribute("aria-selected", "true");
      input.setAttribute("aria-activedescendant", options[to].id);
      options[to].scrollIntoView({ block: "nearest" });
    } else input.removeAttribute("aria-activedescendant");
  }

  function go(item) {
    if (!item) return;
    if (!item.transient) remember(item);
    returnTo = null;  // the page changes: nothing to give the focus back to
    if (item.post) {
      post.action = item.post;
      dialog.close();
      post.submit();
    } else if (item.href) {
      dialog.close();
      location.assign(item.href);
    }
  }

  input.addEventListener("input", () => {
    clearTimeout(timer);
    const text = input.value;
    enterWaits = false;
    if (!text.trim()) { asked += 1; timer = null; show(pages("")); return; }
    show(pages(text));
    timer = setTimeout(() => ask(text), 150);
  });
  input.addEventListener("keydown", (event) => {
    const n = items.length;
    if (event.key === "ArrowDown") { event.preventDefault(); if (n) move((active + 1) % n); }
    else if (event.key === "ArrowUp") { event.preventDefault(); if (n) move((active - 1 + n) % n); }
    else if (event.key === "Home" && event.ctrlKey) { event.preventDefault(); if (n) move(0); }
    else if (event.key === "End" && event.ctrlKey) { event.preventDefault(); if (n) move(n - 1); }
    else if (event.key === "Enter") {
      event.preventDefault();
      if (timer !== null && input.value.trim()) enterWaits = true; else go(items[active]);
    }
  });
  list.addEventListener("click", (event) => {
    const li = event.target.closest("li[role=option]");
    if (li) go(items[Number(li.dataset.index)]);
  });
  dialog.addEventListener("click", (event) => { if (event.target === dialog) close(); });
})();
