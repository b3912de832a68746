/* tally's web page: the jobs list (new job, search, filters in plain words that always show
   what is applied with one click to clear, thumbnails, rows updated in place so focus and the
   pointer stay put, an empty list that says why) and the words for a job's state that the
   one-job view (job.js) and the sets share. */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot, badge, time } = T;

  /* Filters in plain words (the page's language) → what to ask the API, and which tasks match on the page. */
  const FILTERS = [
    ["", T.t("filter.all"), {}, () => true],
    ["attention", T.t("filter.attention"), { needs_attention: "true" }, needsAttention],
    ["succeeded", T.t("filter.succeeded"), { status: "succeeded" }, (t) => t.status === "succeeded"],
    ["running", T.t("filter.running"), { status: "running" }, (t) => t.status === "running"],
    ["waiting", T.t("filter.waiting"), { status: "waiting" }, (t) => t.status === "waiting"],
    ["queued", T.t("filter.queued"), { status: "queued" }, (t) => t.status === "queued"],
    ["unknown", T.t("filter.unknown"), { status: "unknown" }, (t) => t.status === "unknown"],
    ["failed", T.t("filter.failed"), { status: "failed" }, (t) => t.status === "failed"],
    ["canceled", T.t("filter.canceled"), { status: "canceled" }, (t) => t.status === "canceled"],
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
  /** After the owner changed the providers (Settings): read them again next time. */
  T.forgetProviders = () => { providers = []; };

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

  /** What a job's state means, in one sentence, without internal words, in the page's
      language (the catalogue's `sentence.*`, `cause.*` and `failure.*`; the daemon's
      `waiting_for` comes in the same language). */
  function sentence(t) {
    return T.localTimes(sentenceOf(t));
  }

  function sentenceOf(t) {
    const p = { provider: t.provider };
    switch (t.status) {
      case "queued":
        if (t.waiting_for) return T.tf("sentence.queued_because", { why: t.waiting_for });
        return t.set_id ? T.t("sentence.queued_set") : T.t("sentence.queued");
      case "waiting":
        /* The daemon says what it waits for (a budget, a retry's time, a free slot). */
        if (t.waiting_for) return t.waiting_for;
        return T.tf("sentence.waiting", p);
      case "running": return t.cancel_requested ? T.tf("sentence.running_cancel", p) : T.tf("sentence.running", p);
      case "succeeded": return t.failure_kind === "operator" || /resolved/i.test(t.reason || "")
        ? T.t("sentence.done_recorded") : T.t("sentence.done");
      case "failed":
        if (t.refused_before_sending) return T.t("refused.not_sent") + " " + T.refusalWords(t.refused_before_sending).problem;
        return T.tf("sentence.failed", { why: failureWords(t) });
      case "unknown": return T.tf("sentence.unknown", { cause: unknownCause(t) });
      case "canceled": return T.t("sentence.canceled");
      default: return t.message || t.status;
    }
  }
  T.sentence = sentence;

  /** Why nothing can prove an unknown job's outcome, in plain words, from the reason the API
   * recorded (its raw error text stays under "Technical details"; the stored reason is
   * English whatever the page's language). An error answer (a 5xx) is not a lost answer, and
   * neither is an interruption of tally itself. */
  function unknownCause(t) {
    const r = t.reason || "";
    const p = { provider: t.provider };
    if (/answered with an error/.test(r)) return T.tf("cause.error_answer", p);
    if (/interrupted/.test(r)) return T.tf("cause.interrupted", p);
    if (/answer was lost|answer never arrived/.test(r)) return T.tf("cause.answer_lost", p);
    return T.tf("cause.unprovable", p);
  }

  function failureWords(t) {
    const p = { provider: t.provider };
    switch (t.failure_kind) {
      case "rejected": return T.tf("failure.rejected", p);
      case "configuration":
        if (/out of credit/.test(t.reason || "")) return T.tf("failure.out_of_credit", p);
        return T.tf("failure.configuration", p);
      case "not_sent": return T.tf("failure.not_sent", p);
      case "rate_limited": return T.tf("failure.rate_limited", p);
      case "undeliverable": return T.t("failure.undeliverable");
      case "expired": return T.tf("failure.expired", p);
      case "operator": return T.t("failure.operator");
      case "invalid_result":
        if (/could not be downloaded/.test(t.reason || "")) return T.tf("failure.not_downloaded", p);
        return T.tf("failure.invalid_result", p);
      default: return T.t("failure.other");
    }
  }

  // ---------------------------------------------------------------- the list

  function newJobForm() {
    const prompt = h("textarea", { id: "prompt", name: "prompt", rows: 2, required: true,
      placeholder: T.t("jobs.prompt_placeholder"), "aria-describedby": "prompt-error" });
    const select = h("select", { id: "provider", name: "provider" },
      providers.map((p) => h("option", { value: p.name, selected: p.name === defaultProvider }, p.name)));
    const note = h("p", { id: "provider-note", class: "hint" });
    const price = h("span", { id: "generate-price", class: "price" });
    const showNote = () => {
      const p = providers.find((x) => x.name === select.value);
      note.textContent = p ? T.tf("unknown.bills", { provider: p.name }) + p.billing_note : "";
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
        if (!prompt.value.trim()) throw new Error(T.t("job.prompt_first"));
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
    const search = h("input", { type: "search", id: "search", value: list.search, placeholder: T.t("jobs.search_placeholder"),
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
      h("div", { class: "row" }, h("h2", { id: "jobs-title" }, T.t("list.title")),
        h("div", { class: "tools" },
          h("span", { class: "filter" }, h("label", { for: "search" }, T.t("jobs.search")), search),
          h("span", { class: "filter" }, h("label", { for: "status-filter" }, T.t("jobs.show")), filter))),
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
    if (!words && !q) {
      /* The first run: nothing made yet. Try the free demo (the form above), or add a
         provider with its key in Settings; the language is the switch at the top. */
      const paid = providers.some((p) => p.billable !== false);
      return [h("section", { id: "first-run", class: "first-run", "aria-labelledby": "first-run-title" },
        h("h2", { id: "first-run-title" }, T.t("first.title")),
        h("ul", {},
          h("li", {}, T.t("first.demo")),
          paid ? null : h("li", {}, T.t("first.provider"), " ", h("a", { href: "#/settings", id: "first-run-settings" }, T.t("first.settings"))),
          h("li", {}, T.t("first.language"))))];
    }
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
    const send = h("button", { type: "button", id: "release-all-held", class: "danger" }, T.t("held.send_all"));
    const err = errorSlot("held-error");
    send.addEventListener("click", async () => {
      const yes = await T.confirmDialog(T.t("held.confirm_title"), T.t("held.confirm_body"), T.t("held.confirm_yes"));
      if (!yes) return;
      await busy(send, err, async () => {
        await api("POST", "/v1/held/release", { all: true });
        await load();
      });
    });
    return [h("div", { id: "notices" }), h("div", { id: "held-banner", class: "warn", hidden: true }, text, send, err)];
  }

  /** What start-up noticed (a lost tail of commits): shown on the jobs page whatever the
      filter, until the owner says she checked the dashboards it names. */
  async function loadNotices() {
    const box = document.getElementById("notices");
    if (!box) return;
    const r = await api("GET", "/v1/held?limit=1");
    box.replaceChildren(...(r.notices || []).map((n) => {
      const err = errorSlot(`notice-error-${n.id}`);
      const done = h("button", { type: "button", id: `notice-dismiss-${n.id}` }, T.t("notice.dismiss"));
      done.addEventListener("click", () => busy(done, err, async () => {
        await api("POST", `/v1/held/notices/${n.id}/dismiss`, {});
        await loadNotices();
      }));
      return h("div", { class: "warn notice", id: `notice-${n.id}`, role: "alert" }, h("p", {}, n.message), done, err);
    }));
  }

  /** Show the held banner when the owner's list is shown and something is held. */
  async function loadHeld() {
    loadNotices().catch(() => {});
    const banner = document.getElementById("held-banner");
    if (!banner) return;
    if (list.filter !== "attention") { banner.hidden = true; return; }
    const r = await api("GET", "/v1/held?limit=1");
    const n = r.total || 0;
    document.getElementById("held-text").textContent = n === 1 ? T.t("held.banner_one") : T.tf("held.banner_many", { n });
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
        t.set_id ? [" · ", h("a", { href: "#/sets/" + encodeURIComponent(t.set_id) }, T.tf("list.image_set", { product: product || T.t("list.open_the_set") }))] : null,
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
    return [" · " + T.t("list.retried_as") + " ", h("a", { href: "#/tasks/" + encodeURIComponent(r.id) }, T.t("list.a_new_job")),
      r.status ? " (" + T.t(`word.${r.status}`) + ")" : ""];
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

  T.showJobs = showJobs;
  T.unknownCause = unknownCause;
  T.failureWords = failureWords;
})(window.tally);
