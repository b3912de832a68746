/* tally's web page, shared pieces: building elements, the /v1 API with the session's CSRF
   token, plain words for statuses and roles, money sentences derived from the API's charge
   fields, thumbnails and the enlarged-image dialog, the confirmation and retry dialogs, errors
   shown next to the control that caused them, views with an <h1> and a title each, the live
   stream (server-sent events) with an indicator that recovers, and the "sign in again" panel.
   Plain JavaScript, no build step. Everything from the API is put on the page as text, never
   as HTML. The page calls the unit of work a "job" (the API's task). A little over 600 lines on
   purpose: every view loads this one file first, and splitting it would add a script tag and a
   load order to keep; the views' own code lives in their files. */
"use strict";

window.tally = (function () {
  const CSRF = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  /* The shop's time zone (Settings, else `[ui] time_zone`): every time in the page is shown in
     it, so the computer and a phone agree with the budget's days. Empty: the device's. */
  const ZONE = (document.querySelector('meta[name="time-zone"]') || {}).content || "";

  /** A date as the shop's local date and time (the device's zone when the shop's is not
      known to this browser). */
  function localString(d) {
    if (ZONE) {
      try { return d.toLocaleString(undefined, { timeZone: ZONE }); } catch (_) { /* the device's */ }
    }
    return d.toLocaleString();
  }
  const SETTLED = ["succeeded", "failed", "unknown", "canceled"];
  /* An icon per status, next to its word: colour is never the only signal. */
  const ICONS = {
    queued: "…", waiting: "◷", running: "↻", succeeded: "✓", failed: "✕", unknown: "?", canceled: "–",
    done: "✓", done_with_problems: "?", draft: "✎",
  };
  /* Status words for people (in English; the page shows the catalogue's `word.*`). */
  const WORDS = {
    queued: "waiting its turn", waiting: "waiting", running: "generating", succeeded: "ready", failed: "failed",
    unknown: "outcome unknown", canceled: "canceled", done: "done", done_with_problems: "needs a look",
    draft: "copy to edit",
  };
  /* Shot roles in plain words (the API's names are main, selling_point, scene, detail, size; the page
     shows the catalogue's `role.*`). */
  const ROLES = [["main", "Main photo"], ["selling_point", "Selling point"], ["scene", "Lifestyle scene"],
    ["detail", "Detail close-up"], ["size", "Size and spec"], ["main_white", "White main image"]];

  const main = document.getElementById("main");
  const errorBox = document.getElementById("error");
  const live = document.getElementById("live");

  /** What is on screen: the view's name and id, and its live-update hooks. */
  const view = { name: "", id: null, onTask: null, onResync: null, onDelivery: null, signedOut: false };

  // ---------------------------------------------------------------- building the page

  /** Build an element: h("p", {class: "x"}, "text", child, …). Strings become text nodes. */
  /** The page's messages in its language (`web::i18n` puts them in the page). */
  const MESSAGES = (() => {
    try { return JSON.parse(document.getElementById("messages").textContent) || {}; } catch (e) { return {}; }
  })();

  /** One message of the catalogue (`assets/messages.json`) in the page's language. */
  function t(key) {
    return Object.prototype.hasOwnProperty.call(MESSAGES, key) ? MESSAGES[key] : key;
  }

  /** [`t`] by a name that a task parameter called `t` does not hide. */
  const msg = (key) => t(key);

  /** A message with `{name}` placeholders filled from `vars` (as text). */
  function tf(key, vars) {
    return t(key).replace(/\{(\w+)\}/g, (m, k) => (vars && vars[k] !== undefined ? String(vars[k]) : m));
  }

  /** The language switch: remember the choice (a cookie the daemon reads) and reload. */
  function languageSwitch() {
    const sel = document.getElementById("language");
    if (!sel) return;
    sel.value = document.documentElement.lang === "zh-CN" ? "zh-CN" : "en";
    sel.addEventListener("change", () => {
      document.cookie = "tally_lang=" + encodeURIComponent(sel.value) + "; Path=/; SameSite=Strict; Max-Age=31536000";
      location.reload();
    });
  }

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

  /** `text` with every RFC 3339 UTC time in it (`2026-12-03T23:34:24.000Z`, as the daemon
      writes them into its sentences) shown as the shop's local date and time; the
      Technical details keep them as they are. */
  function localTimes(text) {
    if (typeof text !== "string") return text;
    return text.replace(/\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z\b/g, (iso) => {
      const d = new Date(iso);
      return isNaN(d) ? iso : localString(d);
    });
  }

  function time(iso) {
    const d = new Date(iso);
    return h("time", { datetime: iso }, isNaN(d) ? iso : localString(d));
  }

  function badge(status) {
    return h("span", { class: "badge s-" + status },
      h("span", { class: "icon", "aria-hidden": "true" }, ICONS[status] || "•"), " " + (WORDS[status] ? t(`word.${status}`) : status));
  }

  function roleWords(role) {
    const r = ROLES.find(([k]) => k === role);
    return r ? t(`role.${r[0]}`) : role ? role.replace(/_/g, " ") : "Shot";
  }

  /** A job's name for people: its set's product and role for a shot, else its prompt. */
  function jobTitle(job, product) {
    if (job.shot_role || job.role) {
      const role = roleWords(job.shot_role || job.role);
      return product ? tf("role.of", { role, product }) : role + ": " + shotWords(job.prompt);
    }
    /* An edit is titled by its instruction; a cutout, which has none, by what it is. */
    if (job.operation === "edit") return tf("ops.title_edit", { prompt: job.prompt });
    if (job.operation === "cutout") return t("ops.title_cutout");
    return job.prompt;
  }

  /** A shot's own words: the prompt without the " — product: …; style: …" tally added. */
  function shotWords(prompt) {
    return String(prompt || "").replace(/ — product: [\s\S]*$/, "");
  }

  // ---------------------------------------------------------------- money, from the API's fields

  function money(amount, currency) {
    if (amount === null || amount === undefined || amount === "" || isNaN(Number(amount))) return null;
    const n = Number(amount);
    try {
      return new Intl.NumberFormat(undefined, { style: "currency", currency: currency || "USD",
        maximumFractionDigits: n < 1 ? 3 : 2 }).format(n);
    } catch (e) {
      return n.toFixed(2) + " " + (currency || "");
    }
  }

  /** What tally knows about charges for this job, as one sentence, from `charge` when the
      daemon sends it; else from the older `retry.requires_cost_acknowledgement`. */
  function chargeSentence(t) {
    /* `t` is the job here: the catalogue's words come through `tf`. */
    const c = t.charge;
    if (c && c.state) {
      const amount = money(c.estimated_cost, c.currency);
      const about = amount ? tf("charge.about", { amount }) : "";
      if (c.recorded_by_hand && c.state === "none") return tf("charge.by_hand_none");
      if (c.recorded_by_hand && c.state === "charged") return tf("charge.by_hand_charged", { about });
      switch (c.state) {
        case "none": return tf("charge.none");
        case "refused": return tf("charge.refused");
        case "charged": return tf("charge.charged", { about });
        case "possible": case "possibly_charged": case "maybe":
          return tf("charge.possible", { about });
        default: return null;
      }
    }
    if (!t.retry || !SETTLED.includes(t.status)) return null;
    return t.retry.requires_cost_acknowledgement ? tf("charge.possible", { about: "" }) : null;
  }

  /** "may charge about $0.04 again" when the daemon knows the price of a retry. */
  function retryCost(t) {
    const r = t.retry || {};
    const amount = money(r.estimated_cost, r.currency);
    return amount ? tf("retry.about", { amount }) : null;
  }

  /** What tally knows about the price at provider `p` of `GET /v1/providers`: "free" (it
      never charges), "amount" (a price per image), "unknown" (not configured, or by size), or
      null without a provider. Code decides by this flag, never by [`priceWords`]' words,
      which are in the page's language. */
  function priceKind(p) {
    if (!p) return null;
    if (p.billable === false) return "free";
    const each = Number(p.price_per_image);
    return p.price_per_image === null || p.price_per_image === undefined || isNaN(each) ? "unknown" : "amount";
  }

  /** The price of `n` images (1 by default) at provider `p` of `GET /v1/providers`, whose
      money fields are on the provider itself (`billable`, `price_per_image`,
      `price_per_size`, `currency`), in the page's language: "about $0.12 (3 × $0.04)",
      "free" for a provider that never charges, "price not configured" when tally does not
      know it ([`priceKind`] says which). */
  function priceWords(p, n) {
    const kind = priceKind(p);
    if (!kind) return null;
    const count = n === undefined ? 1 : n;
    if (kind === "free") return t("price.free");
    if (kind === "unknown") {
      const sizes = p.price_per_size && Object.keys(p.price_per_size).length;
      return sizes ? t("price.by_size") : t("job.price_not_configured");
    }
    const each = Number(p.price_per_image);
    const one = money(each, p.currency);
    if (count === 1) return tf("retry.about", { amount: one });
    const total = money(Math.round(each * count * 1e6) / 1e6, p.currency);
    return tf("price.about_many", { total, n: count, each: one });
  }

  /** The price of one image at a provider, for the line beside a button: "about $0.04 per
      image", "free", "price not configured". */
  function providerPrice(p) {
    const w = priceWords(p, 1);
    return priceKind(p) === "amount" ? tf("price.per_image", { price: w }) : w;
  }

  /** The price of one image as an amount ("$0.04"), or null. */
  function providerAmount(p) {
    return p && p.billable !== false ? money(p.price_per_image, p.currency) : null;
  }

  // ---------------------------------------------------------------- errors where they happen

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** Call the API; state-changing calls carry the CSRF token. Throws ApiError with words
      for people (never the API's developer text about tokens). */
  async function api(method, path, body, raw) {
    const opts = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
    if (method !== "GET") opts.headers["X-CSRF-Token"] = CSRF;
    if (raw) {
      opts.headers["Content-Type"] = raw.type || "application/octet-stream";
      opts.body = raw;
    } else if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    let r;
    try {
      r = await fetch(path, opts);
    } catch (e) {
      offline();
      throw new ApiError(0, "unreachable", t("core.unreachable"));
    }
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!r.ok) {
      const err = data && data.error ? data.error : {};
      if (r.status === 401 || (r.status === 403 && err.code === "csrf_token_required")) {
        signedOut();
        throw new ApiError(r.status, "signed_out", t("core.signed_out_error"));
      }
      const e = new ApiError(r.status, err.code || "http_" + r.status, err.message || tf("core.answered", { status: r.status }));
      /* A 409 about money carries the daemon's estimate (`estimated_cost`). */
      e.estimatedCost = err.estimated_cost || null;
      throw e;
    }
    return data;
  }

  /** Show (or clear) an error in `slot`, next to the control that caused it; scroll it into
      view and focus it, so it is seen and read out. */
  function showError(slot, message) {
    const box = slot || errorBox;
    if (!message) {
      box.hidden = true;
      box.textContent = "";
      return;
    }
    box.textContent = message;
    box.hidden = false;
    box.scrollIntoView({ block: "nearest" });
    box.focus({ preventScroll: true });
  }

  /** An empty error slot to put right after a control. */
  function errorSlot(id) {
    return h("p", { id, class: "field-error", role: "alert", tabindex: "-1", hidden: true });
  }

  /** Run `action` with `button` disabled, so a request cannot be sent twice by a double click;
      an error is shown in `slot`, next to the button. */
  async function busy(button, slot, action) {
    if (button.disabled) return;
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    try {
      showError(slot, "");
      await action();
    } catch (e) {
      if (e && e.code === "signed_out") return;
      showError(slot, (e && e.message) || String(e));
    } finally {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }

  /** A random idempotency key (works outside secure contexts too). */
  function newKey() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return "web-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }

  // ---------------------------------------------------------------- views

  /** The view the address names now: a view that finishes loading after the owner went
      elsewhere must not draw itself over the new one. */
  function routeName() {
    const hash = location.hash || "#/";
    if (/^#\/tasks\/[^/]+$/.test(hash)) return "task";
    if (hash === "#/sets/new") return "new-set";
    if (hash === "#/drafts/new") return "new-draft";
    if (/^#\/drafts\/[^/]+$/.test(hash)) return "draft";
    if (/^#\/sets\/[^/]+$/.test(hash)) return "set";
    if (hash === "#/sets") return "sets";
    if (hash === "#/spend") return "spend";
    if (hash === "#/settings") return "settings";
    return "jobs";
  }

  /** Put a view on the page: an <h1> (its text is also the document title), then `content`.
      On navigation (`fresh`) focus moves to the heading; a live refresh leaves focus alone. */
  function setView(name, id, title, content, fresh) {
    if (routeName() !== name) return false;
    const same = view.name === name && view.id === id;
    view.name = name;
    view.id = id;
    view.onTask = null;
    view.onResync = null;
    view.onDelivery = null;
    document.title = title + " · tally";
    const h1 = h("h1", { id: "view-title", tabindex: "-1" }, title);
    main.replaceChildren(h1, ...[content].flat().filter((c) => c !== null && c !== undefined));
    for (const [nav, names] of [["nav-jobs", ["jobs", "task"]], ["nav-sets", ["sets", "set", "new-set", "new-draft", "draft"]], ["nav-spend", ["spend"]], ["nav-settings", ["settings"]]]) {
      const a = document.getElementById(nav);
      if (names.includes(name)) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    if (fresh || !same) h1.focus();
    return true;
  }

  /* Every re-read of a view (after a live event, a resync or a button) takes a ticket, and only
     the newest may draw: reads overlap when events come quickly, and an older one whose
     answers came back last (a loaded machine) would otherwise draw its stale state over the
     newer one, with no event left to correct it. */
  let tickets = 0;
  function ticket() { tickets += 1; return tickets; }
  function latest(n) { return n === tickets; }

  /** The panel after the daemon restarted or the session ended: what to do, in words. */
  function signedOut() {
    if (view.signedOut) return;
    view.signedOut = true;
    if (channel) channel.postMessage({ type: "signed_out" });
    letGo();
    setLive(t("live.signed_out"), "off");
    view.name = "signed-out";
    document.title = t("core.sign_in_again_title");
    showError(null, "");
    const h1 = h("h1", { id: "view-title", tabindex: "-1" }, t("core.sign_in_again"));
    /* Pairing from another signed-in device first (a phone has no terminal), then the
       computer's command. */
    const pair = h("form", { class: "pair-form", method: "get", action: "/login" },
      h("h2", {}, t("signed_out.pair_title")), h("p", {}, t("signed_out.pair_how")),
      h("label", { for: "pair-code" }, t("signed_out.pair_label")),
      h("input", { id: "pair-code", name: "pair", autocomplete: "one-time-code", autocapitalize: "characters",
        spellcheck: "false", maxlength: "16", required: true, placeholder: "ABCD-EFGH" }),
      h("button", { type: "submit" }, t("signed_out.pair_button")));
    main.replaceChildren(h1, h("section", { id: "signed-out", class: "card panel" },
      h("p", {}, t("core.signed_out_why")),
      pair,
      h("p", {}, t("core.signed_out_how")),
      h("pre", {}, h("code", {}, "tally sign-in")),
      h("p", { class: "hint" }, t("core.signed_out_kept"))));
    h1.focus();
  }

  function setLive(text, cls) {
    if (live.textContent !== text) live.textContent = text;
    live.className = "live " + cls;
  }

  // ---------------------------------------------------------------- images

  /** A small, lazy-loaded thumbnail of an artifact or upload (`url` is its /v1 URL). If it does
      not load because the stored image is damaged (`image_damaged`), it says so in its place:
      such an image is not downloaded and is left out of a set's zip. */
  function thumb(url, alt, size) {
    const cls = "thumb" + (size ? " " + size : "");
    const img = h("img", { class: cls, src: url + "/thumbnail", alt, loading: "lazy", decoding: "async",
      width: 96, height: 96 });
    img.addEventListener("error", async () => {
      try {
        await api("GET", url + "/thumbnail");
      } catch (e) {
        if (e.code !== "image_damaged") return;
        // A damaged image cannot be enlarged either: the note takes the button's place too.
        const button = img.parentElement && img.parentElement.classList.contains("thumb-button");
        (button ? img.parentElement : img).replaceWith(h("span", { class: cls + " damaged", title: e.message },
          t("core.damaged")));
      }
    }, { once: true });
    return img;
  }

  /** A button showing a thumbnail that opens the full image. */
  function enlargeable(url, alt, name, size) {
    const b = h("button", { type: "button", class: "thumb-button", "aria-label": tf("image.enlarge", { alt }) },
      thumb(url, alt, size));
    b.addEventListener("click", () => openImage(url, alt, name));
    return b;
  }

  function openImage(url, alt, name) {
    const d = document.getElementById("image-dialog");
    const img = document.getElementById("image-dialog-img");
    img.src = url;
    img.alt = alt;
    document.getElementById("image-dialog-title").textContent = alt;
    const dl = document.getElementById("image-dialog-download");
    dl.href = url;
    if (name) dl.setAttribute("download", name); else dl.setAttribute("download", "");
    document.getElementById("image-dialog-close").onclick = () => d.close();
    d.showModal();
  }

  // ---------------------------------------------------------------- dialogs

  /** Ask before doing something that cannot be undone; resolves true for yes. */
  function confirmDialog(title, text, yes) {
    const d = document.getElementById("confirm-dialog");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    const ok = document.getElementById("confirm-yes");
    const no = document.getElementById("confirm-no");
    ok.textContent = yes || t("confirm.yes");
    return new Promise((resolve) => {
      const done = (v) => { d.onclose = null; d.close(); resolve(v); };
      ok.onclick = () => done(true);
      no.onclick = () => done(false);
      d.onclose = () => resolve(false);
      d.showModal();
      no.focus();
    });
  }

  /** The retry request's body: a fresh idempotency key, and, once the job was retried
      before, the id of that retry (the daemon asks for it, so a second retry is on purpose). */
  function retryBody(t, key, ack) {
    const body = { idempotency_key: key };
    if (ack) body.acknowledge_possible_charge = true;
    if (t.retried_as && t.retried_as.id) body.acknowledge_retried_as = t.retried_as.id;
    return body;
  }

  /** Retry a job. When nothing can have been charged for it: at once on a provider that never
      charges, else after a question naming the price of the new request (`provider`, from
      `GET /v1/providers`; without it the price is "not configured"). When it may have been
      charged: after the cost confirmation (the box must be ticked). Resolves with the new
      job, or null. */
  async function retry(t, button, slot, provider) {
    const needsAck = !!(t.retry && t.retry.requires_cost_acknowledgement);
    if (!needsAck) {
      const kind = priceKind(provider);
      if (kind !== "free") {
        const cost = priceWords(provider, 1) || tf("job.price_not_configured");
        const yes = await confirmDialog(tf("retry.ask_title"),
          tf("job.retry_price", { provider: t.provider, cost }) + " " + tf("retry.ask_nothing_charged"),
          kind === "amount" ? tf("another.yes_cost", { cost }) : tf("retry.confirm"));
        if (!yes) return null;
      }
      let made = null;
      await busy(button, slot, async () => {
        made = await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/retry", retryBody(t, newKey(), false));
      });
      return made;
    }
    const d = document.getElementById("retry-dialog");
    const ack = document.getElementById("retry-ack");
    const confirm = document.getElementById("retry-confirm");
    const err = document.getElementById("retry-error");
    /* "about $0.04" in the page's language, when the daemon knows the price. */
    const amount = money((t.retry || {}).estimated_cost, (t.retry || {}).currency);
    const cost = amount ? tf("retry.about", { amount }) : null;
    document.getElementById("retry-warning").textContent =
      cost ? tf("retry.warning_cost", { cost }) : tf("retry.warning");
    document.getElementById("retry-billing").textContent = t.billing_note ? tf("unknown.bills", { provider: t.provider }) + t.billing_note : "";
    document.getElementById("retry-ack-text").textContent = cost ? tf("retry.ack_cost", { cost }) : tf("retry.ack");
    ack.checked = false;
    confirm.disabled = true;
    showError(err, "");
    ack.onchange = () => { confirm.disabled = !ack.checked; };
    /* One key per confirmation: a second click cannot create a second job. */
    const key = newKey();
    return new Promise((resolve) => {
      let result = null;
      d.onclose = () => { d.onclose = null; resolve(result); };
      document.getElementById("retry-cancel").onclick = () => d.close();
      confirm.onclick = () => {
        if (!ack.checked) return;
        busy(confirm, err, async () => {
          result = await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/retry", retryBody(t, key, true));
          d.close();
        }).then(() => { confirm.disabled = !ack.checked; });
      };
      d.showModal();
      ack.focus();
    });
  }

  /** The form that records what the owner found at the provider for an unknown job. */
  function resolveForm(t, prefix, onDone) {
    const id = (s) => prefix + s;
    const found = h("input", { type: "radio", name: id("outcome"), id: id("found"), value: "succeeded" });
    const failed = h("input", { type: "radio", name: id("outcome"), id: id("failed"), value: "failed" });
    const file = h("input", { type: "file", id: id("file"), accept: "image/png,image/jpeg,image/webp" });
    const note = h("textarea", { id: id("note"), rows: 2, maxlength: 2000 });
    const charged = h("input", { type: "radio", name: id("charge"), id: id("charged"), value: "charged" });
    const notCharged = h("input", { type: "radio", name: id("charge"), id: id("not-charged"), value: "not_charged" });
    const chargeUnknown = h("input", { type: "radio", name: id("charge"), id: id("charge-unknown"), value: "unknown", checked: true });
    const submit = h("button", { type: "submit", id: id("submit"), class: "primary" }, msg("resolve.submit"));
    const err = errorSlot(id("error"));
    const form = h("form", { id: id("form"), class: "card resolve" },
      h("fieldset", {},
        h("legend", {}, msg("resolve.found_legend")),
        h("div", { class: "choice" },
          h("label", { class: "check", for: id("found") }, found, " " + msg("resolve.found")),
          h("div", { class: "sub" }, h("label", { for: id("file") }, msg("resolve.upload")), file)),
        h("div", { class: "choice" },
          h("label", { class: "check", for: id("failed") }, failed, " " + msg("resolve.failed"))),
        h("fieldset", { class: "charge-record" },
          h("legend", {}, msg("resolve.charge_legend")),
          h("label", { class: "check", for: id("charged") }, charged, " " + msg("resolve.charged")),
          h("label", { class: "check", for: id("not-charged") }, notCharged, " " + msg("resolve.not_charged")),
          h("label", { class: "check", for: id("charge-unknown") }, chargeUnknown, " " + msg("resolve.cannot_tell"))),
        h("label", { for: id("note") }, msg("resolve.note")), note,
        h("div", { class: "actions" }, submit), err));
    file.addEventListener("change", () => { if (file.files.length) found.checked = true; });
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      busy(submit, err, async () => {
        const body = { note: note.value };
        /* What the dashboard shows about the charge: Spend and the CSV follow this record. */
        body.charge = charged.checked ? "charged" : notCharged.checked ? "not_charged" : "unknown";
        if (found.checked) {
          if (!file.files.length) throw new Error(msg("resolve.need_file"));
          body.outcome = "succeeded";
          body.image_base64 = await fileBase64(file.files[0]);
        } else if (failed.checked) {
          body.outcome = "failed";
        } else {
          throw new Error(msg("resolve.need_choice"));
        }
        await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/resolve", body);
        await onDone();
      });
    });
    return form;
  }

  /** Open the resolve form in a dialog (for a shot card). */
  function resolveDialog(t, onDone) {
    const d = document.getElementById("resolve-dialog");
    const body = document.getElementById("resolve-dialog-body");
    /* Where to look (job.js) above the form, for an unknown shot. */
    body.replaceChildren(window.tally.whereToLook(t, "dlg-") || "", resolveForm(t, "dlg-resolve-", async () => { d.close(); await onDone(); }));
    document.getElementById("resolve-dialog-close").onclick = () => d.close();
    d.showModal();
  }

  function fileBase64(f) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ""));
      r.onerror = () => reject(new Error(t("resolve.unreadable_file")));
      r.readAsDataURL(f);
    });
  }

  // ---------------------------------------------------------------- live updates

  let stream = null;
  let retryTimer = null;
  let backoff = 1000;

  /* One live stream per browser, however many tabs are open (a browser keeps at most six
     connections to one address: six tabs each holding a stream left a seventh waiting
     forever). The tab holding the Web Lock "tally-stream" opens the stream and passes every
     event and its live state to the other tabs over a BroadcastChannel; when it closes (or
     goes into the back-forward cache) the lock passes to another tab, which opens the stream.
     Without those APIs each tab opens its own, as before. */
  const channel = "BroadcastChannel" in window ? new BroadcastChannel("tally-stream") : null;
  const shared = Boolean(channel && navigator.locks);
  let leader = false;
  let waitingForLock = false;
  let releaseLock = null;
  let liveNow = null;

  /** An event of the stream, in this tab. */
  function onEvent(kind, data) {
    /* Sent on connect and when the stream fell behind: re-read what is on screen. */
    if (kind === "resync") { if (view.onResync) view.onResync(); return; }
    let d;
    try { d = JSON.parse(data); } catch (e) { return; }
    if (!d || !d.id) return;
    if (kind === "task" && view.onTask) view.onTask(d.id, d.status);
    /* A delivery or one of its files changed: the view showing it re-reads it. */
    if (kind === "delivery" && view.onDelivery) view.onDelivery(d.id, d.set_id);
  }

  /** The live indicator, here and (from the tab holding the stream) in every other tab. */
  function sayLive(text, cls) {
    liveNow = { text, cls };
    setLive(text, cls);
    if (leader && channel) channel.postMessage({ type: "live", text, cls });
  }

  if (channel) {
    channel.onmessage = (m) => {
      const d = m.data || {};
      if (d.type === "event" && !leader) onEvent(d.kind, d.data);
      else if (d.type === "live" && !leader && !view.signedOut) setLive(d.text, d.cls);
      else if (d.type === "hello" && leader && liveNow) channel.postMessage({ type: "live", ...liveNow });
      else if (d.type === "signed_out") signedOut();
    };
  }

  /* Without Web Locks (they need a secure context: a phone on the shop's network reaches tally
     over plain http) a tab holds a stream only while it is visible: a phone shows one tab at a
     time, so however many are open, one stream is. Back in view, it reopens and re-reads. */
  if (!shared) {
    document.addEventListener("visibilitychange", () => {
      if (view.signedOut) return;
      if (document.hidden) {
        if (stream) { stream.close(); stream = null; }
        clearTimeout(retryTimer);
        document.documentElement.dataset.stream = "paused";
      } else {
        connect();
        if (view.onResync) view.onResync();
      }
    });
  }

  /** Take part in the browser's one stream: open it if this tab holds the lock, else hear it
      from the tab that does (and take it over when that tab goes). */
  function connect() {
    if (view.signedOut) return;
    if (!shared && document.hidden) return;
    if (!shared || leader) { openStream(); return; }
    if (waitingForLock) return;
    waitingForLock = true;
    navigator.locks.request("tally-stream", () => new Promise((resolve) => {
      waitingForLock = false;
      if (view.signedOut) { resolve(); return; }
      leader = true;
      releaseLock = resolve;
      openStream();
    }));
    channel.postMessage({ type: "hello" });
  }

  /** Let the stream go (into the back-forward cache, or closing): another tab takes it. */
  function letGo() {
    if (stream) { stream.close(); stream = null; }
    clearTimeout(retryTimer);
    if (releaseLock) { releaseLock(); releaseLock = null; }
    leader = false;
    document.documentElement.dataset.stream = "another-tab";
  }
  window.addEventListener("pagehide", letGo);
  window.addEventListener("pageshow", (ev) => {
    /* Back from the back-forward cache: rejoin, and re-read what is on screen. */
    if (!ev.persisted) return;
    setLive(t("live.connecting"), "off");
    connect();
    if (view.onResync) view.onResync();
  });

  /** Open the event stream; when it fails, find out why (daemon gone, or session gone) and
      say so; reconnect with a growing pause while tally does not answer. */
  function openStream() {
    if (view.signedOut) return;
    if (stream) stream.close();
    /* Which tab holds the browser's stream (read by the tests, and handy in devtools). */
    document.documentElement.dataset.stream = "this-tab";
    const es = new EventSource("/v1/stream");
    stream = es;
    es.onopen = () => {
      backoff = 1000;
      sayLive(t("live.on"), "on");
      showError(null, "");
    };
    es.onerror = () => {
      sayLive(t("live.reconnecting"), "off");
      if (es.readyState === EventSource.CLOSED) {
        es.close();
        checkSession();
      }
    };
    for (const kind of ["task", "delivery", "resync"]) {
      es.addEventListener(kind, (ev) => {
        onEvent(kind, ev.data);
        if (channel && leader) channel.postMessage({ type: "event", kind, data: ev.data });
      });
    }
  }

  /** After the stream closed: is the daemon there, and does it still know this session? */
  async function checkSession() {
    clearTimeout(retryTimer);
    try {
      const r = await fetch("/v1/session", { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (r.status === 401 || r.status === 404) return signedOut();
      connect();
    } catch (e) {
      offline();
    }
  }

  /** Why a picked file cannot be a photo of tally's, in words, or "" when it can: PNG, JPEG
      or WebP; an iPhone's HEIC photo gets the setting that makes it JPEG. */
  function notAPhoto(f) {
    if (/^image\/(png|jpeg|webp)$/.test(f.type)) return "";
    if (/^image\/hei[cf]/.test(f.type) || /\.hei[cf]$/i.test(f.name)) return tf("newset.heic", { name: f.name });
    return tf("newset.not_image", { name: f.name });
  }

  /** tally does not answer: say so in the indicator and try again later. */
  function offline() {
    if (view.signedOut) return;
    sayLive(t("live.reconnecting"), "off");
    clearTimeout(retryTimer);
    retryTimer = setTimeout(checkSession, backoff);
    backoff = Math.min(backoff * 2, 15000);
  }

  return {
    CSRF, SETTLED, ROLES, view, t, tf, languageSwitch, h, time, localTimes, badge, roleWords, jobTitle, shotWords, money, chargeSentence, retryCost,
    providerPrice, providerAmount, retryBody, routeName, ApiError, api, showError, errorSlot, busy, newKey, setView, ticket, latest, signedOut, thumb, enlargeable,
    openImage, confirmDialog, retry, priceWords, priceKind, resolveForm, resolveDialog, connect, main, errorBox, notAPhoto,
  };
})();
