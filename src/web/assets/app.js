/* tally's web page script: the jobs list with live updates (server-sent events from
   /v1/stream), a job's detail and timeline, cancel, retry with an explicit cost confirmation,
   resolving an unknown job by hand, and image sets. Plain JavaScript, no build step; it talks
   only to the /v1 API, with the session cookie and the CSRF token the page was served with.
   Everything from the API is put on the page as text (never as HTML). */
"use strict";

(function () {
  const CSRF = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const STATUSES = ["queued", "waiting", "running", "succeeded", "failed", "unknown", "canceled"];
  const SETTLED = ["succeeded", "failed", "unknown", "canceled"];
  /* An icon per status, next to its word: colour is never the only signal. */
  const ICONS = {
    queued: "…", waiting: "◷", running: "↻", succeeded: "✓", failed: "✕", unknown: "?", canceled: "–",
    done: "✓", done_with_problems: "?",
  };
  const main = document.getElementById("main");
  const errorBox = document.getElementById("error");
  const live = document.getElementById("live");

  /* What is on screen: the route and the data behind it. */
  const view = { name: "", id: null, filter: "", tasks: [], next: null, set: null };
  let providers = [];
  let defaultProvider = "";

  // ---------------------------------------------------------------- helpers

  /** Build an element: h("p", {class: "x"}, "text", child, …). Strings become text nodes. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return el;
  }

  function time(iso) {
    const d = new Date(iso);
    return h("time", { datetime: iso }, isNaN(d) ? iso : d.toLocaleString());
  }

  function badge(status, label) {
    const words = (label || status).replace(/_/g, " ");
    return h("span", { class: "badge s-" + status },
      h("span", { class: "icon", "aria-hidden": "true" }, ICONS[status] || "•"), " " + words);
  }

  function showError(message) {
    if (!message) {
      errorBox.hidden = true;
      errorBox.textContent = "";
      return;
    }
    errorBox.textContent = message;
    errorBox.hidden = false;
  }

  /** A random idempotency key (works outside secure contexts too). */
  function newKey() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return "web-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** Call the API; state-changing calls carry the CSRF token. Throws ApiError. */
  async function api(method, path, body) {
    const opts = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
    if (method !== "GET") opts.headers["X-CSRF-Token"] = CSRF;
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    let r;
    try {
      r = await fetch(path, opts);
    } catch (e) {
      throw new ApiError(0, "unreachable", "tally did not answer. Is `tally serve` still running?");
    }
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!r.ok) {
      const err = data && data.error ? data.error : {};
      if (r.status === 401) signedOut();
      throw new ApiError(r.status, err.code || "http_" + r.status, err.message || "tally answered " + r.status);
    }
    return data;
  }

  /** Run `action` with `button` disabled, so a request cannot be sent twice by a double click. */
  async function busy(button, action) {
    if (button.disabled) return;
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    try {
      showError("");
      await action();
    } catch (e) {
      showError(e.message || String(e));
    } finally {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }

  function signedOut() {
    live.textContent = "signed out";
    showError("This browser's session has ended (tally may have restarted). Run `tally sign-in` " +
      "on the computer where tally runs and open the link it prints.");
  }

  // ---------------------------------------------------------------- routing

  function route() {
    const hash = location.hash || "#/";
    let m;
    showError("");
    if ((m = hash.match(/^#\/tasks\/([^/]+)$/))) return showTask(decodeURIComponent(m[1]));
    if ((m = hash.match(/^#\/sets\/([^/]+)$/))) return showSet(decodeURIComponent(m[1]));
    if (hash === "#/sets") return showSets();
    return showJobs();
  }

  function setView(name, id, ...content) {
    view.name = name;
    view.id = id;
    main.replaceChildren(...content);
    for (const [nav, names] of [["nav-jobs", ["jobs", "task"]], ["nav-sets", ["sets", "set"]]]) {
      const a = document.getElementById(nav);
      if (names.includes(name)) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
  }

  // ---------------------------------------------------------------- jobs list

  async function loadProviders() {
    if (providers.length) return;
    const r = await api("GET", "/v1/providers");
    providers = r.providers || [];
    defaultProvider = r.default || (providers[0] && providers[0].name) || "";
  }

  function jobsView() {
    const prompt = h("textarea", { id: "prompt", name: "prompt", rows: 2, required: true,
      placeholder: "red sneaker on a white background" });
    const select = h("select", { id: "provider", name: "provider" },
      providers.map((p) => h("option", { value: p.name, selected: p.name === defaultProvider }, p.name + " (" + p.kind + ")")));
    const note = h("p", { id: "provider-note", class: "hint" });
    const showNote = () => {
      const p = providers.find((x) => x.name === select.value);
      note.textContent = p ? "How " + p.name + " bills: " + p.billing_note : "";
    };
    select.addEventListener("change", showNote);
    showNote();
    const submit = h("button", { type: "submit", id: "submit-task", class: "primary" }, "Generate");
    /* One key per job the user means to create: resending after a lost answer is then safe. */
    let key = null;
    prompt.addEventListener("input", () => { key = null; });
    select.addEventListener("change", () => { key = null; });
    const form = h("form", { id: "new-task", class: "card" },
      h("h2", {}, "New job"),
      h("label", { for: "prompt" }, "What should the image show?"), prompt,
      h("div", { class: "inline" },
        h("span", { class: "grow" }, h("label", { for: "provider" }, "Provider"), select),
        h("div", { class: "actions" }, submit)),
      note);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      busy(submit, async () => {
        key = key || newKey();
        const t = await api("POST", "/v1/tasks", { prompt: prompt.value, provider: select.value, idempotency_key: key });
        key = null;
        prompt.value = "";
        upsertTask(t);
      });
    });

    const filter = h("select", { id: "status-filter" },
      h("option", { value: "" }, "all jobs"),
      STATUSES.map((s) => h("option", { value: s, selected: s === view.filter }, s)));
    filter.addEventListener("change", () => {
      view.filter = filter.value;
      loadTasks();
    });
    const more = h("button", { type: "button", id: "more", hidden: true }, "Show older jobs");
    more.addEventListener("click", () => busy(more, () => loadTasks(true)));
    const list = h("ul", { id: "task-list", class: "tasks", "aria-live": "polite" });
    return [form, h("section", { class: "jobs", "aria-labelledby": "jobs-title" },
      h("div", { class: "row" }, h("h2", { id: "jobs-title" }, "Jobs, newest first"),
        h("span", { class: "filter" }, h("label", { for: "status-filter" }, "Show "), filter)),
      list, h("p", { id: "empty", class: "hint", hidden: true }, "No jobs here yet."), more)];
  }

  async function showJobs() {
    try { await loadProviders(); } catch (e) { showError(e.message); }
    setView("jobs", null, ...jobsView());
    await loadTasks();
  }

  async function loadTasks(older) {
    if (view.name !== "jobs") return;
    const q = new URLSearchParams();
    if (view.filter) q.set("status", view.filter);
    if (older && view.next) q.set("before", view.next);
    try {
      const page = await api("GET", "/v1/tasks" + (q.toString() ? "?" + q : ""));
      view.tasks = older ? view.tasks.concat(page.tasks) : page.tasks;
      view.next = page.next;
      renderTasks();
    } catch (e) {
      showError(e.message);
    }
  }

  function taskItem(t) {
    return h("li", { class: "task s-" + t.status, "data-task-id": t.id, "data-status": t.status },
      h("a", { href: "#/tasks/" + encodeURIComponent(t.id), class: "task-link" },
        badge(t.status),
        h("span", { class: "prompt" }, t.prompt),
        h("span", { class: "message" }, t.message),
        h("span", { class: "meta" }, t.provider + " · ", time(t.created_at),
          t.retry_of ? " · retry of an earlier job" : "")));
  }

  function renderTasks() {
    const list = document.getElementById("task-list");
    if (!list) return;
    list.replaceChildren(...view.tasks.map(taskItem));
    document.getElementById("empty").hidden = view.tasks.length > 0;
    document.getElementById("more").hidden = !view.next;
  }

  /** Put a fresh copy of a task into the list: replace it, add it on top, or drop it when it no
      longer matches the filter. */
  function upsertTask(t) {
    if (view.name !== "jobs") return;
    const i = view.tasks.findIndex((x) => x.id === t.id);
    const matches = !view.filter || view.filter === t.status;
    if (i >= 0 && matches) view.tasks[i] = t;
    else if (i >= 0) view.tasks.splice(i, 1);
    else if (matches) {
      view.tasks.unshift(t);
      view.tasks.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
    }
    renderTasks();
  }

  // ---------------------------------------------------------------- one job

  async function showTask(id) {
    let t, ev;
    try {
      [t, ev] = await Promise.all([api("GET", "/v1/tasks/" + encodeURIComponent(id)),
        api("GET", "/v1/tasks/" + encodeURIComponent(id) + "/events")]);
    } catch (e) {
      setView("task", id, h("p", {}, h("a", { href: "#/" }, "← All jobs")), h("p", {}, e.message));
      return;
    }
    if (location.hash !== "#/tasks/" + encodeURIComponent(id) && location.hash !== "#/tasks/" + id) return;
    const focused = document.activeElement && document.activeElement.id;
    setView("task", id, taskView(t, ev.events || []));
    /* Keep keyboard focus where it was when a live update re-renders the view. */
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  function unknownExplainer(t) {
    return h("section", { id: "unknown-explainer", class: "unknown-box", "aria-labelledby": "unknown-title" },
      h("h3", { id: "unknown-title" }, h("span", { class: "icon", "aria-hidden": "true" }, "?"), " The outcome is unknown"),
      h("ul", {},
        h("li", {}, "The result cannot be confirmed: the request reached the provider, and nothing can prove what happened to it (the cause is above)."),
        h("li", {}, "Automatic retries have stopped: tally will not send this job again on its own."),
        h("li", {}, "Generating again is a new operation that may be charged again.")),
      t.billing_note ? h("p", { id: "billing-note" }, h("strong", {}, "How " + t.provider + " bills: "), t.billing_note) : null,
      h("p", {}, "Check the provider's dashboard, then record below what you found; or generate again on purpose."));
  }

  function taskView(t, events) {
    const parts = [h("p", {}, h("a", { href: "#/" }, "← All jobs"))];
    parts.push(h("h2", {}, "Job ", h("code", {}, t.id)));
    parts.push(h("p", { class: "status-line" }, badge(t.status), " ", h("span", { id: "task-message" }, t.message)));
    if (t.status === "unknown") parts.push(unknownExplainer(t));
    for (const a of t.artifacts || []) {
      parts.push(h("figure", { class: "image" },
        h("img", { id: "task-image", src: a.url, alt: "Generated image: " + t.prompt, loading: "lazy" }),
        h("figcaption", {}, a.media_type + ", " + a.bytes + " bytes, sha256 " + a.sha256.slice(0, 16) + "… · ",
          h("a", { href: a.url, download: "" }, "Download"))));
    }
    const facts = [["Prompt", t.prompt], ["Provider", t.provider], ["Attempts", String(t.attempts)],
      ["Created", time(t.created_at)], ["Updated", time(t.updated_at)]];
    if (t.retry_of) facts.push(["Retry of", h("a", { href: "#/tasks/" + encodeURIComponent(t.retry_of) }, t.retry_of)]);
    parts.push(h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));

    const actions = h("div", { class: "actions" });
    if (!SETTLED.includes(t.status) && !t.cancel_requested) {
      const cancel = h("button", { type: "button", id: "cancel-task" }, "Cancel job");
      cancel.addEventListener("click", () => busy(cancel, async () => {
        const r = await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/cancel", {});
        await showTask(r.id);
      }));
      actions.append(cancel);
    }
    if (t.retry.allowed) {
      const retry = h("button", { type: "button", id: "retry-task", class: t.retry.requires_cost_acknowledgement ? "danger" : "" },
        t.retry.requires_cost_acknowledgement ? "Generate again…" : "Retry");
      retry.addEventListener("click", () => {
        if (t.retry.requires_cost_acknowledgement) openRetryDialog(t);
        else busy(retry, async () => {
          const n = await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/retry", {});
          location.hash = "#/tasks/" + encodeURIComponent(n.id);
        });
      });
      actions.append(retry);
    }
    if (actions.childElementCount) parts.push(actions);
    if (t.retry.allowed || t.status === "succeeded") parts.push(h("p", { id: "retry-hint", class: "hint" }, t.retry.note));
    if (t.status === "unknown") parts.push(resolveForm(t));

    parts.push(h("section", { class: "timeline", "aria-labelledby": "timeline-title" },
      h("h3", { id: "timeline-title" }, "Timeline"),
      h("ol", { id: "timeline" }, events.map((e) => h("li", { class: "ev ev-" + e.kind },
        time(e.at), " ", h("span", { class: "actor" }, e.actor), " ", h("span", { class: "kind" }, e.kind.replace(/_/g, " ")),
        h("p", {}, e.message))))));
    return h("article", { class: "detail s-" + t.status, "data-task-id": t.id, "data-status": t.status }, parts);
  }

  function openRetryDialog(t) {
    const dialog = document.getElementById("retry-dialog");
    const ack = document.getElementById("retry-ack");
    const confirm = document.getElementById("retry-confirm");
    const cancel = document.getElementById("retry-cancel");
    document.getElementById("retry-note").textContent = t.retry.note;
    document.getElementById("retry-billing").textContent = t.billing_note ? "How " + t.provider + " bills: " + t.billing_note : "";
    ack.checked = false;
    confirm.disabled = true;
    ack.onchange = () => { confirm.disabled = !ack.checked; };
    cancel.onclick = () => dialog.close();
    /* One key per confirmation: a second click cannot create a second task. */
    const key = newKey();
    confirm.onclick = () => {
      if (!ack.checked) return;
      busy(confirm, async () => {
        try {
          const n = await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/retry",
            { acknowledge_possible_charge: true, idempotency_key: key });
          dialog.close();
          location.hash = "#/tasks/" + encodeURIComponent(n.id);
        } finally {
          confirm.disabled = !ack.checked;
        }
      });
    };
    dialog.showModal();
    ack.focus();
  }

  function resolveForm(t) {
    const found = h("input", { type: "radio", name: "outcome", id: "resolve-found", value: "succeeded" });
    const failed = h("input", { type: "radio", name: "outcome", id: "resolve-failed", value: "failed" });
    const file = h("input", { type: "file", id: "resolve-file", accept: "image/png,image/jpeg,image/webp" });
    const note = h("textarea", { id: "resolve-note", rows: 2, maxlength: 2000 });
    const submit = h("button", { type: "submit", id: "resolve-submit" }, "Record what I found");
    const form = h("form", { id: "resolve-form", class: "card" },
      h("fieldset", {},
        h("legend", {}, "Record what you found at the provider"),
        h("label", { class: "check" }, found, " I found the image at the provider (upload it below)"),
        h("label", { for: "resolve-file" }, "The image (PNG, JPEG or WebP)"), file,
        h("label", { class: "check" }, failed, " I confirmed at the provider that it failed"),
        h("label", { for: "resolve-note" }, "Note for the timeline"), note,
        h("div", { class: "actions" }, submit)));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      busy(submit, async () => {
        const body = { note: note.value };
        if (found.checked) {
          if (!file.files.length) throw new Error("Choose the image file you found at the provider.");
          body.outcome = "succeeded";
          body.image_base64 = await fileBase64(file.files[0]);
        } else if (failed.checked) {
          body.outcome = "failed";
        } else {
          throw new Error("Choose what you found: the image, or that it failed.");
        }
        await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/resolve", body);
        await showTask(t.id);
      });
    });
    return form;
  }

  function fileBase64(f) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ""));
      r.onerror = () => reject(new Error("Could not read the file."));
      r.readAsDataURL(f);
    });
  }

  // ---------------------------------------------------------------- image sets

  async function showSets() {
    let page;
    try {
      page = await api("GET", "/v1/sets");
    } catch (e) {
      setView("sets", null, h("p", {}, e.message));
      return;
    }
    const sets = page.sets || [];
    setView("sets", null, h("h2", {}, "Image sets, newest first"),
      sets.length ? h("ul", { id: "set-list", class: "tasks" }, sets.map((s) =>
        h("li", { class: "task s-" + s.status, "data-set-id": s.id, "data-status": s.status },
          h("a", { href: "#/sets/" + encodeURIComponent(s.id), class: "task-link" },
            badge(s.status), h("span", { class: "prompt" }, s.product),
            h("span", { class: "message" }, s.progress + ". " + s.message),
            h("span", { class: "meta" }, s.provider + " · ", time(s.created_at))))))
        : h("p", { class: "hint" }, "No image sets yet. Sets are created through the API (POST /v1/sets)."));
  }

  async function showSet(id) {
    let s;
    try {
      s = await api("GET", "/v1/sets/" + encodeURIComponent(id));
    } catch (e) {
      setView("set", id, h("p", {}, h("a", { href: "#/sets" }, "← All sets")), h("p", {}, e.message));
      return;
    }
    view.set = s;
    const actions = h("div", { class: "actions" });
    if (s.status === "running" && !s.canceled) {
      const cancel = h("button", { type: "button", id: "cancel-set" }, "Cancel the shots not started yet");
      cancel.addEventListener("click", () => busy(cancel, async () => {
        await api("POST", "/v1/sets/" + encodeURIComponent(s.id) + "/cancel", {});
        await showSet(s.id);
      }));
      actions.append(cancel);
    }
    setView("set", id, h("article", { class: "detail", "data-set-id": s.id, "data-status": s.status },
      h("p", {}, h("a", { href: "#/sets" }, "← All sets")),
      h("h2", {}, s.product),
      h("p", { class: "status-line" }, badge(s.status), " ", h("strong", { id: "set-progress" }, s.progress), " ",
        h("span", { id: "set-message" }, s.message)),
      h("dl", { class: "facts" }, h("dt", {}, "Provider"), h("dd", {}, s.provider),
        s.style ? [h("dt", {}, "Style"), h("dd", {}, s.style)] : null,
        h("dt", {}, "Created"), h("dd", {}, time(s.created_at))),
      actions,
      h("h3", {}, "Shots"),
      h("ol", { class: "shots" }, (s.shots || []).map((shot) =>
        h("li", { class: "shot s-" + shot.status, "data-task-id": shot.id, "data-status": shot.status },
          h("p", {}, h("strong", {}, (shot.position + 1) + ". " + (shot.role || "shot")), " ", badge(shot.status)),
          (shot.artifacts || []).map((a) => h("img", { src: a.url, alt: (shot.role || "Shot") + " image of " + s.product, loading: "lazy" })),
          h("p", { class: "message" }, shot.message),
          h("a", { href: "#/tasks/" + encodeURIComponent(shot.id) }, "Details and timeline"))))));
  }

  // ---------------------------------------------------------------- live updates

  /* Task ids whose fresh copy is being fetched, and ids that changed again meanwhile. */
  const fetching = new Set();
  const again = new Set();

  async function refreshTask(id) {
    if (fetching.has(id)) { again.add(id); return; }
    fetching.add(id);
    try {
      if (view.name === "jobs") upsertTask(await api("GET", "/v1/tasks/" + encodeURIComponent(id)));
      else if (view.name === "task" && view.id === id) await showTask(id);
      else if (view.name === "set" && view.set && (view.set.shots || []).some((x) => x.id === id)) await showSet(view.id);
      else if (view.name === "sets") await showSets();
    } catch (e) {
      /* A failed refresh leaves the last honest copy on screen; the next event refetches. */
    } finally {
      fetching.delete(id);
      if (again.delete(id)) refreshTask(id);
    }
  }

  function resync() {
    if (view.name === "jobs") loadTasks();
    else if (view.name === "task") showTask(view.id);
    else if (view.name === "set") showSet(view.id);
    else if (view.name === "sets") showSets();
  }

  function connect() {
    const es = new EventSource("/v1/stream");
    es.onopen = () => { live.textContent = "live"; live.className = "live on"; };
    es.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
    es.addEventListener("task", (ev) => {
      let d;
      try { d = JSON.parse(ev.data); } catch (e) { return; }
      if (d && d.id) refreshTask(d.id);
    });
    /* Sent on connect and when the stream fell behind: re-read what is on screen. */
    es.addEventListener("resync", resync);
  }

  window.addEventListener("hashchange", route);
  route();
  connect();
})();
