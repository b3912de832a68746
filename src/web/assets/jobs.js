/* tally's web page: the jobs list (new job, search, filters in plain words, thumbnails, rows
   updated in place so focus and the pointer stay put) and one job (its image, what happened
   as sentences, what to do next, and the technical details behind a disclosure). */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot, badge, time } = T;

  /* Filters in plain words → what to ask the API, and which tasks match on the page. */
  const FILTERS = [
    ["", "All jobs", {}, () => true],
    ["attention", "Needs your attention", { needs_attention: "true" }, needsAttention],
    ["succeeded", "Ready", { status: "succeeded" }, (t) => t.status === "succeeded"],
    ["running", "Generating now", { status: "running" }, (t) => t.status === "running"],
    ["waiting", "Waiting to try again", { status: "waiting" }, (t) => t.status === "waiting"],
    ["queued", "Waiting its turn", { status: "queued" }, (t) => t.status === "queued"],
    ["unknown", "Outcome unknown", { status: "unknown" }, (t) => t.status === "unknown"],
    ["failed", "Failed", { status: "failed" }, (t) => t.status === "failed"],
    ["canceled", "Canceled", { status: "canceled" }, (t) => t.status === "canceled"],
  ];

  /** An unknown job nobody has handled: `needs_attention` when the daemon says it, else an
      unknown job not yet retried. */
  function needsAttention(t) {
    if (typeof t.needs_attention === "boolean") return t.needs_attention;
    return t.status === "unknown" && !t.retried_as;
  }

  const list = { tasks: [], next: null, filter: "", search: "" };
  let providers = [];
  let defaultProvider = "";
  const products = new Map(); // set id → product name (or a promise of it)

  async function loadProviders() {
    if (providers.length) return;
    const r = await api("GET", "/v1/providers");
    providers = r.providers || [];
    defaultProvider = r.default || (providers[0] && providers[0].name) || "";
  }
  T.loadProviders = async () => { await loadProviders(); return { providers, defaultProvider }; };

  /** The product of a set, fetched once per set. */
  function productOf(setId, onKnown) {
    if (!setId) return null;
    const known = products.get(setId);
    if (typeof known === "string") return known;
    if (!known) {
      products.set(setId, api("GET", "/v1/sets/" + encodeURIComponent(setId)).then((s) => {
        products.set(setId, s.product);
        return s.product;
      }).catch(() => { products.delete(setId); return null; }));
    }
    Promise.resolve(products.get(setId)).then((p) => { if (p && onKnown) onKnown(p); });
    return null;
  }
  T.productOf = productOf;

  /** What a job's state means, in one sentence, without internal words. */
  function sentence(t) {
    switch (t.status) {
      case "queued":
        if (t.waiting_for) return t.waiting_for + " Nothing has been sent yet.";
        return t.set_id ? "Waiting for its turn in the set; nothing has been sent yet." : "Waiting its turn; nothing has been sent yet.";
      case "waiting":
        /* The daemon says what it waits for (a budget, a retry's time, a free slot). */
        if (t.waiting_for) return t.waiting_for;
        return "Waiting to try again; tally will send it when " + t.provider + " has room.";
      case "running": return t.cancel_requested
        ? "You asked to cancel, but " + t.provider + " was already working on it; the image will be kept if it arrives."
        : "Generating: " + t.provider + " is working on it.";
      case "succeeded": return t.failure_kind === "operator" || /resolved/i.test(t.reason || "")
        ? "Done: you recorded the image you found." : "Done: the image is ready.";
      case "failed":
        if (t.refused_before_sending) return T.t("refused.not_sent") + " " + T.refusalWords(t.refused_before_sending).problem;
        return "Failed: " + failureWords(t);
      case "unknown": return "The outcome is unknown: " + unknownCause(t) + ", so it may have been charged.";
      case "canceled": return "Canceled.";
      default: return t.message || t.status;
    }
  }
  T.sentence = sentence;

  /** Why nothing can prove an unknown job's outcome, in plain words, from the reason the API
   * recorded (its raw error text stays under "Technical details"). An error answer (a 5xx) is
   * not a lost answer, and neither is an interruption of tally itself. */
  function unknownCause(t) {
    const r = t.reason || "";
    if (/answered with an error/.test(r)) return t.provider + " answered with an error and could not say whether it ran";
    if (/interrupted/.test(r)) return "tally was interrupted while " + t.provider + " had the request";
    if (/answer was lost|answer never arrived/.test(r)) return "the request reached " + t.provider + ", but its answer was lost";
    return "nothing can prove what happened to the request at " + t.provider;
  }

  function failureWords(t) {
    switch (t.failure_kind) {
      case "rejected": return t.provider + " refused the request.";
      case "configuration":
        if (/out of credit/.test(t.reason || "")) return t.provider + " says the account is out of credit; nothing was charged. Add credit there, then retry.";
        return "tally's settings for " + t.provider + " are not right (check the API key and model).";
      case "not_sent": return "the request never reached " + t.provider + ".";
      case "rate_limited": return t.provider + " was too busy and kept refusing.";
      case "undeliverable": return "tally could not start it.";
      case "expired": return "it was made, but the image expired at " + t.provider + " before tally could fetch it.";
      case "operator": return "you recorded that it failed.";
      case "invalid_result":
        if (/could not be downloaded/.test(t.reason || "")) return "it was made (and charged), but tally could not download the image from " + t.provider + " in time; it had not expired there.";
        return t.provider + " answered with something that is not an image.";
      default: return "see the technical details.";
    }
  }

  // ---------------------------------------------------------------- the list

  function newJobForm() {
    const prompt = h("textarea", { id: "prompt", name: "prompt", rows: 2, required: true,
      placeholder: "red sneaker on a white background", "aria-describedby": "prompt-error" });
    const select = h("select", { id: "provider", name: "provider" },
      providers.map((p) => h("option", { value: p.name, selected: p.name === defaultProvider }, p.name)));
    const note = h("p", { id: "provider-note", class: "hint" });
    const price = h("span", { id: "generate-price", class: "price" });
    const showNote = () => {
      const p = providers.find((x) => x.name === select.value);
      note.textContent = p ? "How " + p.name + " bills: " + p.billing_note : "";
      price.textContent = p ? T.t("job.price") + " " + T.providerPrice(p) : "";
    };
    select.addEventListener("change", showNote);
    showNote();
    const submit = h("button", { type: "submit", id: "submit-task", class: "primary" }, T.t("job.generate"));
    const err = errorSlot("prompt-error");
    /* One key per job the user means to create: resending after a lost answer is then safe. */
    let key = null;
    prompt.addEventListener("input", () => { key = null; });
    select.addEventListener("change", () => { key = null; });
    const form = h("form", { id: "new-task", class: "card", novalidate: true },
      h("h2", {}, T.t("job.new")),
      h("label", { for: "prompt" }, T.t("job.prompt")), prompt,
      h("div", { class: "inline" },
        h("span", { class: "grow" }, h("label", { for: "provider" }, T.t("job.provider")), select),
        h("div", { class: "actions" }, submit, price)),
      note, err);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      busy(submit, err, async () => {
        if (!prompt.value.trim()) throw new Error("Write what the image should show first.");
        key = key || T.newKey();
        const t = await api("POST", "/v1/tasks", { prompt: prompt.value, provider: select.value, idempotency_key: key });
        key = null;
        prompt.value = "";
        upsert(t);
      });
    });
    return form;
  }

  function listSection() {
    const filter = h("select", { id: "status-filter" },
      FILTERS.map(([v, words]) => h("option", { value: v, selected: v === list.filter }, words)));
    filter.addEventListener("change", () => { list.filter = filter.value; drawApplied(); load(); });
    const search = h("input", { type: "search", id: "search", value: list.search, placeholder: "prompt or product",
      autocomplete: "off" });
    // The daemon searches every job (prompt or product), not only the ones loaded; a short
    // pause after typing keeps it to one request per word.
    let typing = null;
    search.addEventListener("input", () => {
      list.search = search.value;
      drawApplied();
      render();
      clearTimeout(typing);
      typing = setTimeout(() => load(), 250);
    });
    const more = h("button", { type: "button", id: "more", class: "more", hidden: true }, "Show older jobs");
    const moreErr = errorSlot("more-error");
    more.addEventListener("click", () => busy(more, moreErr, () => load(true)));
    return h("section", { class: "jobs", "aria-labelledby": "jobs-title" },
      h("div", { class: "row" }, h("h2", { id: "jobs-title" }, "Jobs, newest first"),
        h("div", { class: "tools" },
          h("span", { class: "filter" }, h("label", { for: "search" }, "Search"), search),
          h("span", { class: "filter" }, h("label", { for: "status-filter" }, "Show"), filter))),
      h("div", { id: "applied", class: "applied" }, appliedParts()),
      heldBanner(),
      h("ul", { id: "task-list", class: "tasks" }),
      h("div", { id: "empty", class: "empty", hidden: true }),
      more, moreErr);
  }

  /** The filter's words ("Needs your attention"). */
  function filterWords() {
    const f = FILTERS.find(([v]) => v === list.filter);
    return f && f[0] ? f[1] : null;
  }

  /** What is applied to the list, always on screen: the filter and the search, each with a
      button that removes it, and one that clears both. Empty when nothing is applied. */
  function appliedParts() {
    const words = filterWords();
    const q = list.search.trim();
    if (!words && !q) return [];
    const chip = (id, text, label, clear) => {
      const x = h("button", { type: "button", class: "chip-clear", id, "aria-label": label }, "✕");
      x.addEventListener("click", clear);
      return h("span", { class: "chip" }, text, x);
    };
    const all = h("button", { type: "button", id: "clear-filters", class: "link-button" }, T.t("filter.clear_all"));
    all.addEventListener("click", clearAll);
    return [h("span", { class: "applied-label" }, T.t("filter.applied")),
      words ? chip("clear-filter", T.tf("filter.showing", { filter: words }), T.tf("filter.remove", { filter: words }), () => setFilter("", list.search)) : null,
      q ? chip("clear-search", T.tf("filter.search", { q }), T.tf("filter.remove_search", { q }), () => setFilter(list.filter, "")) : null,
      all].filter(Boolean);
  }

  function drawApplied() {
    const box = document.getElementById("applied");
    if (box) box.replaceChildren(...appliedParts());
  }

  /** Change the filter and the search together (the controls follow), and reload the list. */
  function setFilter(filter, search) {
    list.filter = filter;
    list.search = search;
    const sel = document.getElementById("status-filter");
    const box = document.getElementById("search");
    if (sel) sel.value = filter;
    if (box) box.value = search;
    drawApplied();
    render();
    load();
    (box || sel || document.getElementById("view-title")).focus();
  }

  function clearAll() {
    setFilter("", "");
  }

  /** Why the list is empty, with one click to clear what hides jobs. */
  function emptyParts() {
    const words = filterWords();
    const q = list.search.trim();
    if (!words && !q) return [h("p", { class: "hint" }, T.t("list.empty"))];
    const text = words && q ? T.tf("list.empty_both", { q, filter: words })
      : q ? T.tf("list.empty_search", { q }) : T.tf("list.empty_filter", { filter: words });
    const clear = h("button", { type: "button", id: "empty-clear" }, T.t("filter.clear_all"));
    clear.addEventListener("click", clearAll);
    return [h("p", { id: "empty-text" }, text), clear];
  }

  /** Jobs held because the database was an older copy (shown with "Needs your attention"):
      how many, and sending them all again after saying what that may cost. */
  function heldBanner() {
    const text = h("p", { id: "held-text" });
    const send = h("button", { type: "button", id: "release-all-held", class: "danger" }, "Send all held jobs again…");
    const err = errorSlot("held-error");
    send.addEventListener("click", async () => {
      const yes = await T.confirmDialog("Send every held job again?",
        "Each held job may have been sent already by the daemon the database was copied from. Sending them again " +
        "makes a new request for each, which the provider may charge a second time.", "Send them all again");
      if (!yes) return;
      await busy(send, err, async () => {
        await api("POST", "/v1/held/release", { all: true });
        await load();
      });
    });
    return h("div", { id: "held-banner", class: "warn", hidden: true }, text, send, err);
  }

  /** Show the held banner when the owner's list is shown and something is held. */
  async function loadHeld() {
    const banner = document.getElementById("held-banner");
    if (!banner) return;
    if (list.filter !== "attention") { banner.hidden = true; return; }
    const r = await api("GET", "/v1/held?limit=1");
    const n = r.total || 0;
    document.getElementById("held-text").textContent = n === 1
      ? "1 job is held, not sent: the database was an older copy, and it may have been sent already."
      : n + " jobs are held, not sent: the database was an older copy, and they may have been sent already.";
    banner.hidden = n === 0;
  }

  async function showJobs(fresh) {
    try { await loadProviders(); } catch (e) { if (e.code === "signed_out") return; T.showError(null, e.message); }
    if (T.view.signedOut) return;
    const budget = await T.budgetLine();
    if (T.view.signedOut) return;
    if (!T.setView("jobs", null, T.t("view.jobs"), [budget, newJobForm(), listSection()], fresh)) return;
    T.view.onTask = (id) => refresh(id);
    T.view.onResync = () => load();
    await load();
  }

  async function load(older) {
    if (T.view.name !== "jobs") return;
    const f = FILTERS.find(([v]) => v === list.filter) || FILTERS[0];
    const q = new URLSearchParams(f[2]);
    if (older && list.next) q.set("before", list.next);
    if (list.search.trim()) q.set("q", list.search.trim());
    try {
      const page = await api("GET", "/v1/tasks" + (q.toString() ? "?" + q : ""));
      const got = (page.tasks || []).filter(f[3]);
      // The daemon found these for this search (perhaps by their set's product).
      for (const x of got) x.foundBy = list.search.trim();
      list.tasks = older ? list.tasks.concat(got) : got;
      list.next = page.next;
      render();
      if (!older) await loadHeld();
    } catch (e) {
      if (e.code !== "signed_out") T.showError(null, e.message);
    }
  }

  /** Whether a job belongs in the list for the search typed (the daemon's rule, applied to a
      row that changed live; products not known yet count as not matching). */
  function matchesSearch(t) {
    const q = list.search.trim().toLowerCase();
    if (!q || t.foundBy === list.search.trim()) return true;
    return String(t.prompt).toLowerCase().includes(q) || String(products.get(t.set_id) || "").toLowerCase().includes(q);
  }

  /** The pieces of one row, rebuilt inside the row's existing elements. */
  function rowParts(t) {
    const product = productOf(t.set_id, () => patchLater(t.id));
    const art = (t.artifacts || [])[0];
    const title = T.jobTitle(t, product);
    return {
      link: [
        art ? T.thumb(art.url, "", null) : h("span", { class: "thumb none", "aria-hidden": "true" }, badgeIcon(t.status)),
        h("span", { class: "title" }, title),
        badge(t.status),
        h("span", { class: "message" }, sentence(t)),
      ],
      meta: [
        t.provider, " · ", time(t.created_at),
        t.set_id ? [" · ", h("a", { href: "#/sets/" + encodeURIComponent(t.set_id) }, "Image set: " + (product || "open the set"))] : null,
        retriedAs(t),
      ],
      sig: JSON.stringify([t.status, t.message, title, art && art.id, t.retried_as, t.cancel_requested, product]),
    };
  }

  function badgeIcon(status) {
    return { queued: "…", waiting: "◷", running: "↻", failed: "✕", unknown: "?", canceled: "–" }[status] || "•";
  }

  function retriedAs(t) {
    const r = t.retried_as;
    if (!r || !r.id) return null;
    return [" · retried as → ", h("a", { href: "#/tasks/" + encodeURIComponent(r.id) }, "a new job"),
      r.status ? " (" + (r.status === "succeeded" ? "ready" : r.status) + ")" : ""];
  }

  function newRow(t) {
    const link = h("a", { href: "#/tasks/" + encodeURIComponent(t.id), class: "task-link" });
    const meta = h("p", { class: "meta" });
    const li = h("li", { class: "task", "data-task-id": t.id }, link, meta);
    patch(li, t);
    return li;
  }

  /** Update a row in place: the row and its link stay the same elements, so keyboard focus
      and the thing under the pointer stay where they are. */
  function patch(li, t) {
    const parts = rowParts(t);
    if (li.dataset.sig === parts.sig) return;
    li.dataset.sig = parts.sig;
    li.dataset.status = t.status;
    li.className = "task s-" + t.status;
    const [link, meta] = li.children;
    link.replaceChildren(...parts.link.flat());
    meta.replaceChildren(...parts.meta.flat(Infinity).filter((x) => x !== null && x !== undefined));
  }

  function patchLater(id) {
    const t = list.tasks.find((x) => x.id === id);
    const li = document.querySelector('#task-list li[data-task-id="' + CSS.escape(id) + '"]');
    if (t && li) patch(li, t);
  }

  /** Make the list on the page match `list.tasks`: rows are added, removed and patched, never
      rebuilt, and existing rows are not moved unless the order really changed. */
  function render() {
    const ul = document.getElementById("task-list");
    if (!ul) return;
    const shown = list.tasks.filter(matchesSearch);
    const want = new Set(shown.map((t) => t.id));
    for (const li of Array.from(ul.children)) if (!want.has(li.dataset.taskId)) li.remove();
    let at = ul.firstElementChild;
    for (const t of shown) {
      let li = at && at.dataset.taskId === t.id ? at : ul.querySelector('li[data-task-id="' + CSS.escape(t.id) + '"]');
      if (!li) {
        li = newRow(t);
        ul.insertBefore(li, at);
      } else {
        patch(li, t);
        if (li !== at) ul.insertBefore(li, at);
      }
      at = li.nextElementSibling;
    }
    const empty = document.getElementById("empty");
    if (shown.length === 0) {
      const sig = list.filter + "\u0000" + list.search.trim();
      if (empty.dataset.sig !== sig || empty.hidden) { empty.replaceChildren(...emptyParts()); empty.dataset.sig = sig; }
    }
    empty.hidden = shown.length > 0;
    document.getElementById("more").hidden = !list.next;
  }

  /** Put a fresh copy of a job into the list (or drop it when it no longer matches). */
  function upsert(t) {
    if (T.view.name !== "jobs") return;
    const f = FILTERS.find(([v]) => v === list.filter) || FILTERS[0];
    const i = list.tasks.findIndex((x) => x.id === t.id);
    const matches = f[3](t);
    if (i >= 0 && matches) { t.foundBy = list.tasks[i].foundBy; list.tasks[i] = t; }
    else if (i >= 0) list.tasks.splice(i, 1);
    else if (matches) {
      list.tasks.unshift(t);
      list.tasks.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
    }
    render();
  }

  /* Job ids whose fresh copy is being fetched, and ids that changed again meanwhile. */
  const fetching = new Set();
  const again = new Set();

  async function refresh(id) {
    if (fetching.has(id)) { again.add(id); return; }
    fetching.add(id);
    try {
      const t = await api("GET", "/v1/tasks/" + encodeURIComponent(id));
      upsert(t);
      /* A retry changed its original's "retried as": refresh that row too. */
      if (t.retry_of && list.tasks.some((x) => x.id === t.retry_of)) {
        upsert(await api("GET", "/v1/tasks/" + encodeURIComponent(t.retry_of)));
      }
    } catch (e) {
      /* A failed refresh leaves the last honest copy on screen; the next event refetches. */
    } finally {
      fetching.delete(id);
      if (again.delete(id)) refresh(id);
    }
  }

  // ---------------------------------------------------------------- one job

  async function showTask(id, fresh) {
    let t, ev;
    try {
      [t, ev] = await Promise.all([api("GET", "/v1/tasks/" + encodeURIComponent(id)),
        api("GET", "/v1/tasks/" + encodeURIComponent(id) + "/events")]);
    } catch (e) {
      if (e.code === "signed_out") return;
      T.setView("task", id, "Job not found", [h("p", {}, h("a", { href: "#/" }, "← All jobs")), h("p", {}, e.message)], fresh);
      return;
    }
    if (location.hash !== "#/tasks/" + encodeURIComponent(id) && location.hash !== "#/tasks/" + id) return;
    let product = null;
    if (t.set_id) {
      try { product = (await api("GET", "/v1/sets/" + encodeURIComponent(t.set_id))).product; } catch (e) { product = null; }
    }
    const retriedId = (t.retried_as && t.retried_as.id) || retriedFromEvents(ev.events || []);
    let retried = t.retried_as || null;
    if (retriedId && (!retried || !retried.status)) {
      try { const r = await api("GET", "/v1/tasks/" + encodeURIComponent(retriedId)); retried = { id: r.id, status: r.status }; } catch (e) { retried = { id: retriedId }; }
    }
    const focused = document.activeElement && document.activeElement.id;
    if (!T.setView("task", id, T.jobTitle(t, product), taskView(t, ev.events || [], product, retried), fresh)) return;
    T.view.onTask = (changed) => {
      if (changed === id || changed === retriedId) showTask(id, false);
    };
    T.view.onResync = () => showTask(id, false);
    /* A live re-render keeps keyboard focus where it was. */
    if (!fresh && focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  function retriedFromEvents(events) {
    for (const e of events.slice().reverse()) {
      const m = e.kind === "retried" && /retried as task ([0-9a-f-]{20,})/.exec(e.message);
      if (m) return m[1];
    }
    return null;
  }

  function unknownExplainer(t) {
    return h("section", { id: "unknown-explainer", class: "unknown-box", "aria-labelledby": "unknown-title" },
      h("h2", { id: "unknown-title" }, h("span", { class: "icon", "aria-hidden": "true" }, "?"), " The outcome is unknown"),
      h("ul", {},
        h("li", {}, "The result cannot be confirmed: " + unknownCause(t) + "."),
        h("li", {}, "Automatic retries have stopped: tally will not send this job again on its own."),
        h("li", {}, "Generating again is a new operation that may be charged again.")),
      t.billing_note ? h("p", { id: "billing-note" }, h("strong", {}, "How " + t.provider + " bills: "), t.billing_note) : null,
      h("p", {}, "First look in " + t.provider + "'s dashboard and record below what you found. Only if the image is not there, generate again."),
      T.whereToLook(t, ""));
  }

  /** A job a check stopped before anything was sent: what was wrong, and the fix. */
  function refusalBox(t) {
    const r = t.refused_before_sending;
    const words = T.refusalWords(r);
    return h("section", { id: "refusal", class: "refusal-box", "aria-labelledby": "refusal-title" },
      h("h2", { id: "refusal-title" }, T.t("refused.title")),
      h("p", { id: "refusal-problem" }, words.problem.charAt(0).toUpperCase() + words.problem.slice(1)),
      h("p", { id: "refusal-fix" }, h("strong", {}, T.t("refused.fix") + " "), words.fix),
      r.retry_helps ? null : h("p", { class: "hint", id: "refusal-no-retry" }, T.t("refused.no_retry")));
  }

  function taskView(t, events, product, retried) {
    const parts = [];
    parts.push(h("p", { class: "back" }, t.set_id
      ? h("a", { href: "#/sets/" + encodeURIComponent(t.set_id), id: "back-to-set" }, "← Image set: " + (product || "back to the set"))
      : h("a", { href: "#/" }, "← All jobs")));
    const charge = T.chargeSentence(t);
    parts.push(h("p", { class: "status-line" }, badge(t.status), " ", h("span", { id: "task-message" }, sentence(t)),
      charge ? h("span", { id: "charge", class: "charge" }, charge) : null));
    if (retried && retried.id) {
      parts.push(h("p", { id: "retried-as", class: "note" }, "Retried as → ",
        h("a", { href: "#/tasks/" + encodeURIComponent(retried.id) }, "the new job"),
        retried.status ? " (" + (retried.status === "succeeded" ? "ready" : retried.status) + ")" : ""));
    }
    if (t.refused_before_sending) parts.push(refusalBox(t));
    if (t.status === "unknown") {
      parts.push(unknownExplainer(t));
      parts.push(T.resolveForm(t, "resolve-", () => showTask(t.id, false)));
    }
    for (const a of t.artifacts || []) {
      const alt = "Generated image: " + t.prompt;
      const img = h("img", { id: "task-image", src: a.url, alt, loading: "lazy" });
      const open = h("button", { type: "button", class: "image-button", "aria-label": "Enlarge the image" }, img);
      open.addEventListener("click", () => T.openImage(a.url, alt, null));
      parts.push(h("figure", { class: "image" }, open,
        h("figcaption", {}, h("a", { href: a.url, download: "", class: "button", id: "download-image" }, "Download the image"))));
    }
    parts.push(h("dl", { class: "facts" },
      h("dt", {}, "Prompt"), h("dd", { id: "task-prompt" }, t.prompt),
      h("dt", {}, "Provider"), h("dd", {}, t.provider),
      h("dt", {}, "Created"), h("dd", {}, time(t.created_at)),
      t.retry_of ? [h("dt", {}, "Retry of"), h("dd", {}, h("a", { href: "#/tasks/" + encodeURIComponent(t.retry_of) }, "the earlier job"))] : null));
    parts.push(actions(t, retried));
    parts.push(h("section", { class: "timeline", "aria-labelledby": "timeline-title" },
      h("h2", { id: "timeline-title" }, "What happened"),
      h("ol", { id: "timeline" }, events.map((e) => h("li", { class: "ev ev-" + e.kind }, time(e.at), " ", h("span", {}, eventSentence(e, t)))))));
    parts.push(technical(t, events));
    return h("article", { class: "detail s-" + t.status, "data-task-id": t.id, "data-status": t.status }, parts);
  }

  function actions(t, retried) {
    const box = h("div", { class: "actions" });
    const err = errorSlot("task-action-error");
    if (!T.SETTLED.includes(t.status) && !t.cancel_requested) {
      const cancel = h("button", { type: "button", id: "cancel-task" }, "Cancel job");
      cancel.addEventListener("click", () => busy(cancel, err, async () => {
        await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/cancel", {});
        await showTask(t.id, false);
      }));
      box.append(cancel);
    }
    if (t.held) {
      /* Held because the database was an older copy: the owner decides, knowing the cost. */
      const send = h("button", { type: "button", id: "release-held", class: "danger" }, "Send it again…");
      send.addEventListener("click", async () => {
        const yes = await T.confirmDialog("Send this job again?", t.held.reason + " " + t.held.note, "Send it again");
        if (!yes) return;
        await busy(send, err, async () => {
          await api("POST", "/v1/held/release", { ids: [t.id] });
          await showTask(t.id, false);
        });
      });
      box.append(send);
    }
    const p = providers.find((x) => x.name === t.provider);
    /* The price of one more request, in words, shown before any button that sends one. */
    const cost = T.priceWords(p, 1) || "price not configured";
    let hint = null;
    /* A request refused before sending is refused the same way again: no retry that cannot help. */
    const hopeless = t.refused_before_sending && !t.refused_before_sending.retry_helps;
    if (t.retry && t.retry.allowed && !hopeless) {
      const ack = t.retry.requires_cost_acknowledgement;
      const again = retried && retried.id ? " again" : "";
      const retry = h("button", { type: "button", id: "retry-task", class: ack ? "danger" : "" },
        ack ? "Generate" + again + " as a new job…" : "Retry" + again);
      retry.addEventListener("click", async () => {
        const n = await T.retry(t, retry, err);
        if (n && n.id) location.hash = "#/tasks/" + encodeURIComponent(n.id);
      });
      box.append(retry);
      hint = h("p", { id: "retry-price", class: "hint" }, "Trying again sends a new request to " + t.provider +
        ": " + (cost === "free" ? "free, " + t.provider + " never charges." : cost + "."));
    }
    if (t.status === "succeeded") {
      const another = h("button", { type: "button", id: "generate-another" }, "Generate another like this…");
      const key = T.newKey();
      const free = cost === "free";
      const shot = t.set_id && t.shot_index !== null && t.shot_index !== undefined;
      another.addEventListener("click", async () => {
        /* One more image may cost money: say what, and ask first (like retry). A shot's image gets
           one more candidate of that shot (it stays in the set and its zip); a loose job a new job. */
        const yes = await T.confirmDialog(shot ? "Generate another candidate?" : "Generate another like this?",
          (shot ? "This adds one more candidate image to this shot of the set. "
            : "This is a new job with the same prompt. ") + (free ? t.provider + " never charges: it is free."
            : cost.startsWith("about ") ? t.provider + " will charge " + cost + " for it."
              : t.provider + " may charge for it; tally does not know how much (" + cost + ")."),
          free ? "Generate" : "Generate (" + cost + ")");
        if (!yes) return;
        busy(another, err, async () => {
          if (shot) {
            await api("POST", "/v1/sets/" + encodeURIComponent(t.set_id) + "/shots/" + t.shot_index + "/candidates",
              { count: 1, acknowledge_possible_charge: true });
            location.hash = "#/sets/" + encodeURIComponent(t.set_id);
            return;
          }
          const n = await api("POST", "/v1/tasks", { prompt: t.prompt, provider: t.provider, idempotency_key: key });
          location.hash = "#/tasks/" + encodeURIComponent(n.id);
        });
      });
      box.append(another);
      hint = h("p", { id: "retry-hint", class: "hint" }, "Generating another is a new job with the same prompt: " +
        (free ? "free, " + t.provider + " never charges." : cost + "."));
    }
    if (hint) return h("div", { class: "next" }, box, hint, err);
    return h("div", { class: "next" }, box, err);
  }

  /** One entry of the history as a sentence for people. */
  function eventSentence(e, t) {
    const m = e.message || "";
    const who = t.provider;
    switch (e.kind) {
      case "submitted": return t.retry_of ? "You asked for it again, as a new job." : (t.set_id ? "Added as a shot of the image set." : "You asked for this image.");
      case "scheduled": return "Its turn in the set came.";
      case "busy": return "Waited for " + who + " to have room.";
      case "claimed": { const n = /attempt (\d+)/.exec(m); return n && n[1] !== "1" ? "Started try " + n[1] + "." : "Started."; }
      case "resumed": return "tally picked it up again after an interruption.";
      case "calling": return "Sent to " + who + ".";
      case "accepted": return who + " accepted it and is working on it.";
      case "succeeded": return "The image arrived and was saved.";
      case "failed": return t.refused_before_sending
        ? T.t("refused.event") + " " + T.refusalWords(t.refused_before_sending).problem
        : "It failed: " + failureWords(t);
      case "unknown": return "The outcome cannot be proven: " + unknownCause(t) + " — it may have been charged.";
      case "retry_scheduled": return "It will be tried again automatically.";
      case "canceled": return "Canceled before anything was sent.";
      case "cancel_requested": return "You asked to cancel; " + who + " was already working on it.";
      case "retried": return "You generated it again, as a new job.";
      case "resolved": {
        const note = /: (.*)$/.exec(m.replace(/^resolved as (succeeded with an image|failed)/, ""));
        const what = /succeeded/.test(m) ? "You recorded: found the image." : "You recorded: it failed.";
        return note ? what + " Your note: " + note[1] : what;
      }
      case "recovering": return "tally was interrupted and is finding out what happened.";
      case "late_result": return "A late answer arrived and settled the unknown outcome.";
      case "requeued": return "tally was interrupted before sending; it will start again (nothing was sent).";
      case "held": return "Held, not sent: the database was an older copy, and this job may have been sent already. " + m;
      case "released": return "You asked to send it again.";
      default: return "tally updated this job.";
    }
  }

  function technical(t, events) {
    const rows = [["Job id", t.id], ["Status", t.status], ["Message", t.message]];
    if (t.reason) rows.push(["Provider's or tally's words", t.reason]);
    if (t.failure_kind) rows.push(["Failure kind", t.failure_kind]);
    if (t.idempotency_key) rows.push(["Idempotency key", t.idempotency_key]);
    if (t.set_id) rows.push(["Set id", t.set_id]);
    rows.push(["Attempts", String(t.attempts)]);
    for (const a of t.artifacts || []) {
      rows.push(["Image id", a.id], ["sha256", a.sha256], ["Size", a.bytes + " bytes, " + a.media_type]);
    }
    return h("details", { class: "technical", id: "technical" },
      h("summary", {}, "Technical details"),
      h("dl", { class: "facts" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, h("code", {}, v))])),
      h("table", { class: "raw-events" },
        h("caption", {}, "The raw timeline"),
        h("thead", {}, h("tr", {}, ["Time", "Actor", "Kind", "Message", "Execution"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, events.map((e) => h("tr", {}, h("td", {}, time(e.at)), h("td", {}, e.actor), h("td", {}, e.kind),
          h("td", {}, e.message), h("td", {}, h("code", {}, e.execution || "")))))));
  }

  T.showJobs = showJobs;
  T.showTask = showTask;
  T.eventSentence = eventSentence;
})(window.tally);
