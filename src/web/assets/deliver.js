/* tally's web page: delivering a set from its view. The "Deliver" section chooses a profile
   and a target (from GET /v1/delivery/profiles and /targets), shows before the click why the
   set cannot be delivered with that profile (GET /v1/sets/{id}?profile=), offers "deliver
   anyway" (force), then shows the set's latest delivery file by file (each file's state,
   name, and why when not delivered), where the files are once it ended, and a retry for what
   was not delivered. What it shows is read before the set's view is drawn (showSet awaits
   deliverData), so the view appears whole and a live redraw keeps keyboard focus. Progress
   follows the live stream's `delivery` events (core.js): nothing polls on a timer. */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot } = T;
  /* What the owner picked per set (kept while the view is drawn again by a live update). */
  const picked = new Map();
  let lists = null;

  /** The profiles and targets a delivery may name (read once per page load). */
  async function loadLists() {
    if (!lists) {
      const [p, t] = await Promise.all([api("GET", "/v1/delivery/profiles"), api("GET", "/v1/delivery/targets")]);
      lists = { profiles: p.profiles || [], targets: t.targets || [] };
    }
    return lists;
  }

  /* A file's or a delivery's state: an icon and its words' catalogue key (colour is never the
     only signal). */
  const STATES = {
    queued: ["…", "dstate.queued"], writing: ["↻", "dstate.writing"], delivering: ["↻", "dstate.delivering"],
    delivered: ["✓", "dstate.delivered"], partly_delivered: ["?", "dstate.partly_delivered"],
    failed: ["✕", "dstate.failed"], unknown: ["?", "dstate.unknown"],
  };
  const BADGE = { queued: "queued", writing: "running", delivering: "running", delivered: "succeeded",
    partly_delivered: "unknown", failed: "failed", unknown: "unknown" };

  function stateBadge(state) {
    const [icon, key] = STATES[state] || ["•", null];
    const words = key ? T.t(key) : state;
    return h("span", { class: "badge s-" + (BADGE[state] || state) }, h("span", { class: "icon", "aria-hidden": "true" }, icon), " " + words);
  }

  /** The built-in profiles' names in the owner's words (the catalogue's keys). */
  const BUILT_IN = { amazon: "profile.amazon", shopify: "profile.shopify", etsy: "profile.etsy",
    taobao: "profile.taobao", original: "profile.original" };

  /** A profile in a few words for its option: "amazon: 2000×2000 JPEG, source at least 1000 px". */
  function profileWords(p) {
    /* A built-in profile by the name the owner knows it by (淘宝主图), its API name beside it. */
    const known = BUILT_IN[p.name] ? T.t(BUILT_IN[p.name]) + " (" + p.name + ")" : p.name;
    if (!p.width) return T.tf("deliver.as_generated", { name: known });
    return T.tf("deliver.profile_size", { name: known, width: p.width, height: p.height,
      format: String(p.format || "").toUpperCase() }) + (p.min_source ? T.tf("deliver.min_source", { min: p.min_source }) : "");
  }

  /** What the Deliver section of set `s` shows, read before the set's view is drawn (so the
      view appears whole, with no part filling in after it): the lists, the owner's picks, the
      reasons for the picked profile, and the latest delivery. `{error}` when it cannot be read. */
  async function deliverData(s) {
    try {
      const { profiles, targets } = await loadLists();
      const mine = picked.get(s.id) || { profile: (profiles[0] || {}).name, target: (targets[0] || {}).name, force: false };
      picked.set(s.id, mine);
      const [reasons, list] = await Promise.all([readiness(s.id, mine.profile),
        api("GET", "/v1/sets/" + encodeURIComponent(s.id) + "/deliveries")]);
      const all = list.deliveries || [];
      return { profiles, targets, mine, reasons, latest: all.length ? all[all.length - 1] : null };
    } catch (e) {
      if (e.code === "signed_out") throw e;
      return { error: e.message };
    }
  }

  /** Why set `id` cannot be delivered with profile `name`, in plain words. */
  async function readiness(id, name) {
    if (!name) return [];
    const r = await api("GET", "/v1/sets/" + encodeURIComponent(id) + "?profile=" + encodeURIComponent(name));
    return (r.delivery && r.delivery.blocking) || [];
  }

  /** The Deliver section of set `s`, drawn from `data` ([`deliverData`]). */
  function deliverSection(s, data) {
    const title = h("h2", { id: "deliver-title" }, T.t("deliver.title"));
    const attrs = { id: "deliver", class: "card deliver", "aria-labelledby": "deliver-title", "data-ready": "true" };
    if (!data || data.error) return h("section", attrs, title, h("p", { class: "hint" }, (data && data.error) || ""));
    const { profiles, targets, mine } = data;
    const profile = h("select", { id: "deliver-profile" },
      profiles.map((p) => h("option", { value: p.name, selected: p.name === mine.profile }, profileWords(p))));
    const target = h("select", { id: "deliver-target" },
      targets.map((t) => h("option", { value: t.name, selected: t.name === mine.target }, t.name + " (" + t.location + ")")));
    const blocking = h("ul", { id: "deliver-blocking", class: "blocking" });
    const status = h("p", { id: "deliver-ready", class: "hint", role: "status" });
    const force = h("input", { type: "checkbox", id: "deliver-force", checked: mine.force });
    /* A shopify target needs the product the files are attached to (its gid or handle). */
    const product = h("input", { type: "text", id: "deliver-product", value: mine.product || "",
      placeholder: "gid://shopify/Product/… / handle" });
    const productRow = h("span", {}, h("label", { for: "deliver-product" }, T.t("deliver.product")), product);
    const isShop = () => ((targets.find((t) => t.name === target.value) || {}).kind === "shopify");
    productRow.hidden = !isShop();
    const start = h("button", { type: "button", id: "deliver-start", class: "primary" }, T.t("deliver.start"));
    const err = errorSlot("deliver-error");
    const progress = h("div", { id: "delivery-box" });
    const showReasons = (name, reasons) => {
      blocking.replaceChildren(...reasons.map((x) => h("li", {}, x)));
      blocking.dataset.profile = name;
      const p = profiles.find((x) => x.name === name) || {};
      status.textContent = reasons.length
        ? T.tf("deliver.not_ready", { profile: name })
        : T.tf("deliver.ready", { profile: name }) + (p.max_bytes ? T.t("deliver.bytes_later") : "");
    };
    showReasons(profile.value, data.reasons);
    /* Another profile: its reasons, read before the click. */
    profile.addEventListener("change", async () => {
      const name = profile.value;
      mine.profile = name;
      try {
        const reasons = await readiness(s.id, name);
        if (profile.value === name) showReasons(name, reasons); /* unless another was picked meanwhile */
      } catch (e) {
        if (e.code !== "signed_out") T.showError(err, e.message);
      }
    });
    target.addEventListener("change", () => { mine.target = target.value; productRow.hidden = !isShop(); });
    product.addEventListener("input", () => { mine.product = product.value; });
    force.addEventListener("change", () => { mine.force = force.checked; });
    start.addEventListener("click", () => busy(start, err, async () => {
      const d = await api("POST", "/v1/sets/" + encodeURIComponent(s.id) + "/deliveries",
        Object.assign({ profile: profile.value, target: target.value, force: force.checked },
          isShop() ? { shopify_product: product.value.trim() } : {}));
      showDelivery(progress, d);
    }));
    if (data.latest) showDelivery(progress, data.latest);
    return h("section", attrs, title,
      h("p", { class: "hint" }, T.t("deliver.intro")),
      h("div", { class: "deliver-pick" },
        h("span", {}, h("label", { for: "deliver-profile" }, T.t("deliver.profile")), profile),
        h("span", {}, h("label", { for: "deliver-target" }, T.t("deliver.target")), target), productRow),
      status, blocking,
      h("label", { class: "check", for: "deliver-force" }, force,
        T.t("deliver.force")),
      h("div", { class: "actions" }, start), err, progress);
  }

  /** Where a delivery's files are, in words, from its target. */
  function whereWords(d) {
    const t = ((lists && lists.targets) || []).find((x) => x.name === d.target);
    return t ? t.location : d.target;
  }

  /** Draw delivery `d` into `box`: its state, each file, where they are, and a retry. */
  function showDelivery(box, d) {
    box.dataset.deliveryId = d.id;
    const items = d.items || [];
    const settled = !["queued", "delivering"].includes(d.state);
    const done = items.filter((i) => i.state === "delivered").length;
    const err = errorSlot("delivery-error");
    let retry = null;
    if (settled && done < items.length) {
      retry = h("button", { type: "button", id: "delivery-retry" }, T.t("deliver.retry"));
      retry.addEventListener("click", () => busy(retry, err, async () => {
        const again = await api("POST", "/v1/deliveries/" + encodeURIComponent(d.id) + "/retry", {});
        showDelivery(box, again);
      }));
    }
    box.replaceChildren(h("section", { id: "delivery-progress", class: "delivery", "data-state": d.state,
      "aria-labelledby": "delivery-title" },
      h("h3", { id: "delivery-title" }, T.tf("deliver.latest", { profile: d.profile, target: d.target }) + (d.forced ? T.t("deliver.forced") : "")),
      h("p", { class: "status-line", role: "status" }, stateBadge(d.state), " " + T.tf("deliver.count", { done, total: items.length })),
      h("ol", { id: "delivery-items", class: "delivery-items" }, items.map((i) => h("li", {
        "data-file-name": i.file_name, "data-state": i.state, "data-sha256": i.sha256 || "" },
        h("span", { class: "file" }, i.file_name), " ", stateBadge(i.state),
        i.state === "delivered" && i.width ? h("span", { class: "hint" }, " " + T.tf("deliver.size", { width: i.width, height: i.height, bytes: i.bytes })) : null,
        /* The delivered file itself, for a phone to save (the daemon checks it is byte for byte
           the delivered one). */
        i.state === "delivered" ? [" ", h("a", { class: "button", download: "", id: "delivered-file-" + i.position,
          href: "/v1/deliveries/" + encodeURIComponent(d.id) + "/files/" + i.position,
          "aria-label": T.tf("deliver.download_file", { name: i.file_name }) }, T.t("download"))] : null,
        i.why ? h("p", { class: "why" }, i.why + (i.retry_safe === true ? T.t("deliver.safe") : "")) : null))),
      settled && done ? h("p", { id: "delivery-where" }, T.t("deliver.where_before"), h("code", {}, whereWords(d)),
        T.t("deliver.where_after")) : null,
      done ? h("p", {}, h("a", { class: "button primary", download: "", id: "delivered-zip",
        href: "/v1/deliveries/" + encodeURIComponent(d.id) + "/download" }, T.tf("deliver.download_all", { n: done }))) : null,
      retry ? h("div", { class: "actions" }, retry) : null, err));
  }

  /** A `delivery` event from the stream: re-read it if it is the one on screen (or a new one
      of this set). */
  async function deliveryChanged(setId, deliveryId, eventSetId) {
    if (eventSetId !== setId) return;
    const box = document.getElementById("delivery-box");
    if (!box) return;
    if (box.dataset.deliveryId && box.dataset.deliveryId !== deliveryId) {
      /* A newer delivery of this set (made elsewhere, by the CLI say) takes the place of the
         one shown; an older one's change is not drawn over it. Ids are UUIDv7, so a later
         delivery's id sorts after an earlier one's. */
      if (deliveryId < box.dataset.deliveryId) return;
    }
    try {
      const d = await api("GET", "/v1/deliveries/" + encodeURIComponent(deliveryId));
      const now = document.getElementById("delivery-box");
      if (now) showDelivery(now, d);
    } catch (e) { /* the next event or resync re-reads */ }
  }

  T.deliverData = deliverData;
  T.deliverSection = deliverSection;
  T.deliveryChanged = deliveryChanged;
})(window.tally);
