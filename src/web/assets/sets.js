/* tally's web page: image sets (the list with thumbnails, a set with its reference photos and
   shot cards that carry their own retry, resolve and download, "Download all", cancel with a
   confirmation, resuming canceled shots together, the set's own history), creating a set in the page (product,
   reference photos by file picker or drag and drop, a shot list in plain words, style notes),
   and what tally spent. Editing, duplicating and deleting a set are in set_edit.js. */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot, badge, time } = T;

  // ---------------------------------------------------------------- the list

  async function showSets(fresh) {
    const mine = T.ticket();
    let page;
    let drafts = null;
    try {
      [page, drafts] = await Promise.all([api("GET", "/v1/sets"), T.draftsSection()]);
    } catch (e) {
      if (e.code === "signed_out" || !T.latest(mine)) return;
      T.setView("sets", null, T.t("view.sets"), h("p", {}, e.message), fresh);
      return;
    }
    /* A newer read is on its way: it draws. */
    if (!T.latest(mine)) return;
    const sets = page.sets || [];
    const make = h("p", { class: "actions" }, h("a", { href: "#/drafts/new", class: "button primary", id: "new-draft-link" }, T.t("draft.start")),
      h("a", { href: "#/sets/new", class: "button", id: "new-set-link" }, T.t("set.new")));
    const shown = T.setView("sets", null, T.t("view.sets"), [make, drafts,
      sets.length ? h("ul", { id: "set-list", class: "tasks" }, sets.map(setRow))
        : h("p", { class: "hint" }, T.t("sets.empty"))], fresh);
    if (!shown) return;
    T.view.onTask = () => showSets(false);
    T.view.onResync = () => showSets(false);
  }

  function setRow(s) {
    const arts = (s.shots || []).flatMap((x) => (x.artifacts || []).slice(0, 1)).slice(0, 4);
    return h("li", { class: "task s-" + s.status, "data-set-id": s.id, "data-status": s.status },
      h("a", { href: "#/sets/" + encodeURIComponent(s.id), class: "task-link set-link" },
        h("span", { class: "strip", "aria-hidden": "true" },
          arts.length ? arts.map((a) => T.thumb(a.url, "", "small")) : h("span", { class: "thumb none" }, "…")),
        h("span", { class: "title" }, s.product),
        badge(s.status),
        h("span", { class: "message" }, s.progress + ". " + s.message)),
      h("p", { class: "meta" }, s.provider + " · ", time(s.created_at),
        " · ", h("span", { class: "chosen-count" }, T.tf("sets.chosen_count", { n: s.shots_chosen || 0, total: (s.shots || []).length }))));
  }

  // ---------------------------------------------------------------- one set

  async function showSet(id, fresh) {
    const mine = T.ticket();
    let s;
    try {
      s = await api("GET", "/v1/sets/" + encodeURIComponent(id));
    } catch (e) {
      if (e.code === "signed_out" || !T.latest(mine)) return;
      T.setView("set", id, T.t("set.not_found"), [h("p", {}, h("a", { href: "#/sets" }, T.t("set.all"))), h("p", {}, e.message)], fresh);
      return;
    }
    if (location.hash !== "#/sets/" + encodeURIComponent(id) && location.hash !== "#/sets/" + id) return;
    let info = { providers: [] };
    try { info = await T.loadProviders(); } catch (e) { /* the price line then says less */ }
    let deliver;
    try { deliver = await T.deliverData(s); } catch (e) { if (e.code === "signed_out") return; }
    /* A newer read is on its way: it draws. */
    if (!T.latest(mine)) return;
    const focused = document.activeElement && document.activeElement.id;
    if (!T.setView("set", id, s.product, setView(s, info.providers.find((p) => p.name === s.provider), deliver), fresh)) return;
    const ids = new Set((s.shots || []).flatMap((x) => [x.id].concat((x.candidates || []).map((c) => c.task_id))));
    /* A change to one of its shots, or a new job that is a shot of this set (a retry). */
    T.view.onTask = async (changed) => {
      if (ids.has(changed)) return showSet(id, false);
      try {
        const t = await api("GET", "/v1/tasks/" + encodeURIComponent(changed));
        if (t.set_id === id) showSet(id, false);
      } catch (e) { /* the next event or resync re-reads */ }
    };
    T.view.onResync = () => showSet(id, false);
    T.view.onDelivery = (delivery, setId) => T.deliveryChanged(id, delivery, setId);
    if (!fresh && focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  function setView(s, provider, deliver) {
    const err = errorSlot("set-error");
    const top = h("div", { class: "actions" });
    const done = (s.shots || []).some((x) => (x.artifacts || []).length);
    if (done) {
      top.append(h("a", { href: "/v1/sets/" + encodeURIComponent(s.id) + "/download", class: "button primary",
        id: "download-all", download: "" }, T.t("set.download_all")));
    }
    if (s.status === "running" && !s.canceled) {
      const cancel = h("button", { type: "button", id: "cancel-set" }, T.t("set.cancel"));
      cancel.addEventListener("click", async () => {
        const yes = await T.confirmDialog(T.t("set.cancel_title"), T.t("set.cancel_body"), T.t("set.cancel_yes"));
        if (!yes) return;
        busy(cancel, err, async () => {
          await api("POST", "/v1/sets/" + encodeURIComponent(s.id) + "/cancel", {});
          await showSet(s.id, false);
        });
      });
      top.append(cancel);
    }
    /* The canceled shots nothing was charged for: resuming sends each as a new request. A
       canceled shot that may have been charged is not among them: it keeps its own Retry,
       with its cost box. The button counts, and sends, exactly these. */
    const unsent = (s.shots || []).filter((x) => x.status === "canceled" && x.retry && x.retry.allowed &&
      !x.retry.requires_cost_acknowledgement);
    if (unsent.length) {
      const resume = h("button", { type: "button", id: "resume-set", "data-count": String(unsent.length) },
        T.tf(unsent.length > 1 ? "set.resume_many" : "set.resume_one", { n: unsent.length }));
      resume.addEventListener("click", async () => {
        /* On a provider that charges, the price of all of them is asked first. */
        const kind = T.priceKind(provider);
        if (kind !== "free") {
          const cost = T.priceWords(provider, unsent.length) || T.t("job.price_not_configured");
          const yes = await T.confirmDialog(T.tf("set.resume_ask_title", { n: unsent.length }),
            T.tf("set.resume_ask_body", { n: unsent.length, provider: s.provider, cost }),
            kind === "amount" ? T.tf("another.yes_cost", { cost }) : T.t("retry.confirm"));
          if (!yes) return;
        }
        busy(resume, err, async () => {
          for (const shot of unsent) {
            await api("POST", "/v1/tasks/" + encodeURIComponent(shot.id) + "/retry", T.retryBody(shot, "resume-" + shot.id, false));
          }
          await showSet(s.id, false);
        });
      });
      top.append(resume);
    }
    top.append(...T.setEditActions(s, provider, err, () => showSet(s.id, false)));
    return h("article", { class: "detail", "data-set-id": s.id, "data-status": s.status },
      h("p", { class: "back" }, h("a", { href: "#/sets" }, T.t("set.all"))),
      h("p", { class: "status-line" }, badge(s.status), " ", h("strong", { id: "set-progress" }, s.progress), " ",
        h("span", { id: "set-message" }, s.message)),
      top, err,
      T.referencesSection(s, () => showSet(s.id, false)),
      h("dl", { class: "facts" }, h("dt", {}, T.t("job.fact_provider")), h("dd", {}, s.provider),
        s.style ? [h("dt", {}, T.t("set.fact_style")), h("dd", {}, s.style)] : null,
        h("dt", {}, T.t("job.fact_created")), h("dd", {}, time(s.created_at))),
      deliveryLine(s),
      budgetHold(s),
      h("h2", {}, T.t("set.shots")),
      h("ol", { class: "shots", id: "shots" }, (s.shots || []).map((shot) => shotCard(s, shot, provider))),
      T.deliverSection(s, deliver),
      setHistory(s));
  }

  /** While a budget holds images of this set back: how many, and the budget itself, raised
      right here (its form redraws the set once saved; held images check it again at once). */
  function budgetHold(s) {
    const held = (s.shots || []).reduce((n, shot) =>
      n + ((shot.candidates || []).length ? shot.candidates.filter((c) => c.held_by_budget).length : (shot.held_by_budget ? 1 : 0)), 0);
    if (!held) return null;
    const box = h("section", { class: "card", id: "set-budget-hold", "aria-labelledby": "set-budget-hold-title" },
      h("h2", { id: "set-budget-hold-title" }, T.t("set.budget_hold_title")),
      h("p", { id: "set-budget-hold-line" }, T.tf(held > 1 ? "set.budget_hold_many" : "set.budget_hold_one", { n: held })));
    T.budgetSection(() => showSet(s.id, false)).then((sec) => box.append(sec));
    return box;
  }

  /** The set's own timeline (created, candidates added, choices, edits, copies), its lines in
      the page's language as the API sends them; nothing when it has none. */
  function setHistory(s) {
    const events = s.timeline || [];
    if (!events.length) return null;
    return h("section", { class: "timeline", "aria-labelledby": "set-timeline-title" },
      h("h2", { id: "set-timeline-title" }, T.t("set.history")),
      h("ol", { id: "set-timeline" }, events.map((e) => h("li", { class: "ev ev-" + e.kind }, time(e.at), " ",
        h("span", {}, ...withSetLinks(e.message))))));
  }

  /** A history line with each set id in it (a copy, or the set it was copied from) made a
      link to that set instead of a raw id. */
  function withSetLinks(text) {
    const parts = String(text || "").split(/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/);
    return parts.map((p, i) => i % 2
      ? h("a", { href: "#/sets/" + encodeURIComponent(p), class: "set-link", "data-set-id": p }, T.t("set.history_open"))
      : T.localTimes(p));
  }

  /** Whether every shot has a chosen image, and if not which do not, in plain words. */
  function deliveryLine(s) {
    const d = s.delivery || { ready: false, blocking: [] };
    return h("p", { id: "set-delivery", class: "hint", "data-ready": String(!!d.ready) },
      d.ready ? T.t("set.all_chosen") : (d.blocking || []).join(" "));
  }

  /** A shot's candidates side by side: each image, its state, "Use this one", the chosen one marked. */
  /** A candidate that needs the owner (unknown: it may have been charged; failed): its own
      "Record what you found…" and "Generate again…" with the price, acting on its job. */
  function candidateFixes(s, shot, c, i, provider, err) {
    if (c.status !== "unknown" && c.status !== "failed") return [];
    const id = shot.position + "-" + i;
    const task = () => api("GET", "/v1/tasks/" + encodeURIComponent(c.task_id));
    const out = [];
    if (c.status === "unknown") {
      const rec = h("button", { type: "button", id: "cand-resolve-" + id }, T.t("set.resolve"));
      rec.addEventListener("click", () => busy(rec, err, async () => {
        T.resolveDialog(await task(), () => showSet(s.id, false));
      }));
      out.push(rec);
    }
    const again = h("button", { type: "button", id: "cand-retry-" + id, class: c.status === "unknown" ? "danger" : "" },
      T.t("set.generate_again"));
    again.addEventListener("click", async () => {
      let t;
      try { t = await task(); } catch (e) { err.textContent = e.message; err.hidden = false; return; }
      if (!(t.retry && t.retry.allowed)) { err.textContent = t.message; err.hidden = false; return; }
      const n = await T.retry(t, again, err, provider);
      if (n) await showSet(s.id, false);
    });
    out.push(again, h("span", { class: "hint", id: "cand-retry-price-" + id }, T.priceKind(provider) === "free"
      ? T.tf("job.retry_price_free", { provider: s.provider })
      : T.tf("job.retry_price", { provider: s.provider, cost: T.priceWords(provider, 1) || T.t("job.price_not_configured") })));
    return out;
  }

  /** How a shot stands, counting every candidate: one that ended unknown or failed beside a
      good one is not "ready" (green) but "needs a look", with a line saying which. */
  function shotStanding(shot) {
    const cands = shot.candidates || [];
    const unknown = cands.filter((c) => c.status === "unknown").length;
    const failed = cands.filter((c) => c.status === "failed").length;
    if (cands.length < 2 || (!unknown && !failed) || shot.status !== "succeeded") return { status: shot.status, line: null };
    return { status: "done_with_problems",
      line: T.tf("set.cands_attention", { total: cands.length, unknown, failed }) };
  }

  function candidateList(s, shot, provider) {
    const role = T.roleWords(shot.role);
    const err = errorSlot("choice-error-" + shot.position);
    const path = "/v1/sets/" + encodeURIComponent(s.id) + "/shots/" + shot.position + "/choice";
    const items = (shot.candidates || []).map((c, i) => {
      const a = c.artifact;
      const label = T.tf("cand.label", { role, n: i + 1, total: shot.candidates.length });
      const chosen = !!(a && a.id === shot.chosen);
      const act = h("div", { class: "actions" });
      if (a && !chosen) {
        const use = h("button", { type: "button", class: "use-this", id: "use-" + shot.position + "-" + i,
          "aria-label": T.tf("cand.use_label", { label }) }, T.t("cand.use"));
        use.addEventListener("click", () => busy(use, err, async () => {
          await api("PUT", path, { artifact_id: a.id });
          await showSet(s.id, false);
        }));
        act.append(use);
      }
      if (chosen) {
        const clear = h("button", { type: "button", class: "clear-choice", id: "unchoose-" + shot.position,
          "aria-label": T.tf("cand.clear_label", { role }) }, T.t("cand.clear"));
        clear.addEventListener("click", () => busy(clear, err, async () => {
          await api("DELETE", path);
          await showSet(s.id, false);
        }));
        act.append(clear);
      }
      act.append(...candidateFixes(s, shot, c, i, provider, err));
      return h("li", { class: "candidate s-" + c.status + (chosen ? " chosen" : ""), "data-task-id": c.task_id,
        "data-artifact-id": a ? a.id : "", "data-chosen": String(chosen) },
        a ? T.enlargeable(a.url, label, null, "shot") : h("span", { class: "thumb none" }, "…"),
        chosen ? h("strong", { class: "chosen-mark" }, T.t("cand.chosen")) : badge(c.status),
        act);
    });
    const ul = h("ul", { class: "candidates", id: "candidates-" + shot.position, "aria-label": T.tf("cand.list_label", { role }) }, items);
    /* Arrow keys, Enter and "Compare" (compare.js). */
    return [ul, T.enhanceCandidates(s, shot, ul), err];
  }

  /** "Generate another like this" for a shot: one more candidate, its price said first. */
  function moreButton(s, shot, provider, err) {
    const each = T.providerAmount(provider);
    /* A copy to edit sends nothing until its start, which asks for the price of every image. */
    const billed = s.status !== "draft" && !(provider && provider.price && provider.price.billable === false) &&
      !!provider && !!each;
    const more = h("button", { type: "button", id: "shot-more-" + shot.position },
      each ? T.tf("set.more_cost", { amount: each }) : T.t("set.more"));
    more.addEventListener("click", async () => {
      let ack = false;
      if (billed) {
        ack = await T.confirmDialog(T.t("another.title_candidate"),
          T.tf("set.more_body", { provider: s.provider, amount: each }), T.t("set.more_yes"));
        if (!ack) return;
      }
      busy(more, err, async () => {
        await api("POST", "/v1/sets/" + encodeURIComponent(s.id) + "/shots/" + shot.position + "/candidates",
          { count: 1, acknowledge_possible_charge: ack });
        await showSet(s.id, false);
      });
    });
    return more;
  }

  function shotCard(s, shot, provider) {
    const role = T.roleWords(shot.role);
    const err = errorSlot("shot-error-" + shot.position);
    const actions = h("div", { class: "actions" });
    const art = (shot.artifacts || [])[0];
    /* The shot's download is its chosen image; with one candidate, its image; with several
       and none chosen, none (each candidate is opened on its own). */
    const cands = shot.candidates || [];
    const chosenArt = cands.map((c) => c.artifact).find((a) => a && a.id === shot.chosen);
    const mine = chosenArt || (cands.length <= 1 ? art : null);
    if (mine) {
      actions.append(h("a", { href: mine.url, download: "", class: "button", id: "shot-download-" + shot.position,
        "data-artifact-id": mine.id }, T.t("download")));
    }
    if (shot.held_by_budget || (shot.candidates || []).some((c) => c.held_by_budget)) {
      /* The budget's form is on this page (budgetHold): take the owner to it. */
      const raise = h("button", { type: "button", id: "shot-raise-budget-" + shot.position }, T.t("set.raise_budget"));
      raise.addEventListener("click", () => {
        const box = document.getElementById("set-budget-hold");
        if (box) box.scrollIntoView({ block: "start" });
        const input = document.getElementById("budget-daily");
        if (input) input.focus();
      });
      actions.append(raise);
    }
    if (shot.status === "unknown") {
      const rec = h("button", { type: "button", id: "shot-resolve-" + shot.position }, T.t("set.resolve"));
      rec.addEventListener("click", () => T.resolveDialog(shot, () => showSet(s.id, false)));
      actions.append(rec);
    }
    const refused = shot.refused_before_sending;
    let retryPrice = null;
    if (shot.retry && shot.retry.allowed && !(refused && !refused.retry_helps)) {
      const ack = shot.retry.requires_cost_acknowledgement;
      const retry = h("button", { type: "button", id: "shot-retry-" + shot.position, class: ack ? "danger" : "" },
        ack ? T.t("set.generate_again") : T.t("job.retry"));
      retry.addEventListener("click", async () => {
        const n = await T.retry(shot, retry, err, provider);
        if (n) await showSet(s.id, false);
      });
      actions.append(retry);
      /* The price of the new request, beside the button that sends it. */
      retryPrice = h("p", { class: "hint", id: "shot-retry-price-" + shot.position }, T.priceKind(provider) === "free"
        ? T.tf("job.retry_price_free", { provider: s.provider })
        : T.tf("job.retry_price", { provider: s.provider, cost: T.priceWords(provider, 1) || T.t("job.price_not_configured") }));
    }
    const several = (shot.candidates || []).length > 1;
    if (!s.canceled) actions.append(moreButton(s, shot, provider, err));
    const edit = T.shotEditButton(s, shot, err, () => showSet(s.id, false));
    if (edit) actions.append(edit);
    const charge = T.chargeSentence(shot);
    const standing = shotStanding(shot);
    return h("li", { class: "shot s-" + standing.status, "data-task-id": shot.id, "data-status": shot.status,
      "data-standing": standing.status, "data-position": String(shot.position) },
      h("h3", {}, (shot.position + 1) + ". " + role),
      badge(standing.status),
      standing.line ? h("p", { class: "warn", id: "shot-attention-" + shot.position }, standing.line) : null,
      several ? candidateList(s, shot, provider) : (art ? T.enlargeable(art.url, T.tf("role.of", { role, product: s.product }), null, "shot") : null),
      !several && art && shot.chosen !== art.id ? chooseOnly(s, shot, art, err) : null,
      !several && art && shot.chosen === art.id ? h("strong", { class: "chosen-mark" }, T.t("cand.chosen")) : null,
      listingPreview(s, shot, role),
      h("p", { class: "message" }, T.sentence(shot)),
      refused ? h("p", { class: "fix", id: "shot-fix-" + shot.position }, h("strong", {}, T.t("refused.fix") + " "),
        T.refusalWords(refused).fix) : null,
      charge ? h("p", { class: "charge" }, charge) : null,
      h("p", { class: "hint" }, T.shotWords(shot.prompt)),
      actions, retryPrice, err,
      h("a", { href: "#/tasks/" + encodeURIComponent(shot.id), class: "more-link" }, T.t("set.details")));
  }

  /** A listing shot's chosen image as it will be delivered (a white main image composed on pure
      white, the owner's words drawn by tally): the daemon's own rendering, byte for byte the
      file a delivery with that profile writes, with the words and where they come from. */
  function listingPreview(s, shot, role) {
    const r = shot.rendering;
    const words = shot.overlay ? h("p", { class: "hint", id: "shot-words-" + shot.position },
      T.tf("set.overlay_words", { lines: shot.overlay.lines.join(" / ") })) : null;
    const photo = shot.source ? h("p", { class: "hint", id: "shot-source-" + shot.position }, T.t("set.white_from_photo")) : null;
    if (!r) return (words || photo) ? h("div", { class: "listing" }, photo, words) : null;
    return h("figure", { class: "listing-preview", id: "shot-preview-" + shot.position, "data-sha256": r.sha256 || "",
      "data-profile": r.profile },
      h("img", { src: r.url, alt: T.tf("set.preview_alt", { role, product: s.product }), loading: "lazy", width: "240" }),
      h("figcaption", {}, T.tf("set.preview_caption", { profile: r.profile }), photo, words));
  }

  /** "Use this one" for a shot with a single candidate. */
  function chooseOnly(s, shot, art, err) {
    const use = h("button", { type: "button", class: "use-this", id: "use-" + shot.position + "-0",
      "aria-label": T.tf("cand.use_label", { label: T.roleWords(shot.role) }) }, T.t("cand.use"));
    use.addEventListener("click", () => busy(use, err, async () => {
      await api("PUT", "/v1/sets/" + encodeURIComponent(s.id) + "/shots/" + shot.position + "/choice", { artifact_id: art.id });
      await showSet(s.id, false);
    }));
    return use;
  }

  // ---------------------------------------------------------------- a new set

  async function showNewSet(fresh) {
    let info;
    try { info = await T.loadProviders(); } catch (e) { if (e.code === "signed_out") return; info = { providers: [], defaultProvider: "" }; }
    const files = [];
    const product = h("input", { id: "set-product", type: "text", required: true, autocomplete: "off", placeholder: T.t("newset.product_placeholder") });
    const picker = h("input", { id: "set-refs", type: "file", multiple: true, accept: "image/png,image/jpeg,image/webp",
      class: "visually-hidden" });
    const previews = h("ul", { id: "ref-previews", class: "refs" });
    const drop = h("div", { id: "drop-zone", class: "drop" },
      h("p", {}, T.t("newset.drop")),
      h("label", { for: "set-refs", class: "button" }, T.t("newset.choose")), picker,
      h("p", { class: "hint" }, T.t("newset.formats")));
    const addFiles = (list) => {
      T.showError(refErr, "");
      for (const f of list) {
        const why = T.notAPhoto(f);
        if (why) {
          T.showError(refErr, why);
          continue;
        }
        files.push(f);
      }
      drawPreviews();
    };
    const refErr = errorSlot("refs-error");
    const drawPreviews = () => {
      previews.replaceChildren(...files.map((f, i) => {
        const url = URL.createObjectURL(f);
        const remove = h("button", { type: "button", class: "small", "aria-label": T.tf("newset.remove_file", { name: f.name }) }, T.t("newset.remove"));
        remove.addEventListener("click", () => { files.splice(i, 1); drawPreviews(); });
        return h("li", { "data-file": f.name }, h("img", { src: url, alt: T.tf("newset.ref_alt", { n: i + 1, name: f.name }), class: "thumb ref" }),
          h("span", { class: "hint" }, f.name), remove);
      }));
    };
    picker.addEventListener("change", () => { addFiles(Array.from(picker.files)); picker.value = ""; });
    drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (ev) => {
      ev.preventDefault();
      drop.classList.remove("over");
      addFiles(Array.from((ev.dataTransfer && ev.dataTransfer.files) || []));
    });

    const shots = h("ol", { id: "shot-rows", class: "shot-rows" });
    let n = 0;
    const addShot = (role, prompt) => {
      n += 1;
      const i = n;
      const select = h("select", { id: "shot-role-" + i, class: "shot-role" },
        T.ROLES.map(([v]) => h("option", { value: v, selected: v === role }, T.roleWords(v))));
      const text = h("input", { id: "shot-prompt-" + i, class: "shot-prompt", type: "text", value: prompt || "",
        placeholder: T.t("newset.prompt_placeholder") });
      /* The owner's words, drawn by tally on the image when it is delivered (a line per " / "). */
      const words = h("input", { id: "shot-words-" + i, class: "shot-words", type: "text",
        placeholder: T.t("newset.words_placeholder") });
      const white = h("p", { class: "hint", id: "shot-white-" + i, hidden: true }, T.t("newset.white_hint"));
      const what = h("span", { class: "grow" }, h("label", { for: "shot-prompt-" + i }, T.t("newset.what")), text);
      const said = h("span", { class: "grow" }, h("label", { for: "shot-words-" + i }, T.t("newset.words")), words);
      /* A white main image is cut out of the first photo: no prompt, and no words on it. */
      const kind = () => {
        const w = select.value === "main_white";
        what.hidden = w;
        said.hidden = w;
        white.hidden = !w;
      };
      select.addEventListener("change", kind);
      const remove = h("button", { type: "button", class: "small", "aria-label": T.tf("newset.remove_shot", { n: i }) }, T.t("newset.remove"));
      const li = h("li", { class: "shot-row" },
        h("span", {}, h("label", { for: "shot-role-" + i }, T.t("newset.kind")), select), what, said, white, remove);
      kind();
      remove.addEventListener("click", () => li.remove());
      shots.append(li);
      return text;
    };
    addShot("main", "");
    addShot("selling_point", "");
    addShot("scene", "");
    const add = h("button", { type: "button", id: "add-shot" }, T.t("newset.add_shot"));
    add.addEventListener("click", () => addShot("scene", "").focus());
    const style = h("textarea", { id: "set-style", rows: 2, placeholder: T.t("newset.style_placeholder") });
    const candidates = h("select", { id: "set-candidates" },
      [1, 2, 3, 4].map((n) => h("option", { value: String(n), selected: n === 1 }, String(n))));
    const provider = h("select", { id: "set-provider" },
      info.providers.map((p) => h("option", { value: p.name, selected: p.name === info.defaultProvider }, p.name)));
    const price = h("p", { id: "set-price", class: "hint" });
    const showPrice = () => {
      const p = info.providers.find((x) => x.name === provider.value);
      const per = Number(candidates.value || 1);
      const rows = shots.children.length;
      const cost = T.priceWords(p, rows * per);
      const many = T.tf(rows === 1 ? "newset.shots_one" : "newset.shots_many", { n: rows });
      price.textContent = p ? T.tf("newset.price_line", {
        shots: per > 1 ? T.tf("newset.times", { shots: many, per }) : many, provider: p.name, cost }) +
        T.tf("newset.bills", { provider: p.name, note: p.billing_note }) : "";
    };
    provider.addEventListener("change", showPrice);
    candidates.addEventListener("change", showPrice);
    add.addEventListener("click", showPrice);
    /* Removing a shot changes the total too. */
    new MutationObserver(showPrice).observe(shots, { childList: true });
    showPrice();
    const create = h("button", { type: "submit", id: "create-set", class: "primary" }, T.t("set.create"));
    const err = errorSlot("create-set-error");
    let key = null;
    const form = h("form", { id: "new-set", class: "card", novalidate: true },
      h("p", { class: "back" }, h("a", { href: "#/sets" }, T.t("set.all"))),
      h("label", { for: "set-product" }, T.t("newset.product")), product,
      h("fieldset", {}, h("legend", {}, T.t("newset.refs")), drop, previews, refErr),
      h("fieldset", {}, h("legend", {}, T.t("newset.shots")), shots, h("div", { class: "actions" }, add)),
      h("label", { for: "set-style" }, T.t("newset.style")), style,
      h("label", { for: "set-candidates" }, T.t("newset.candidates")), candidates,
      h("label", { for: "set-provider" }, T.t("job.provider")), provider, price,
      h("div", { class: "actions" }, create), err);
    form.addEventListener("input", () => { key = null; });
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      busy(create, err, async () => {
        if (!product.value.trim()) throw new Error(T.t("newset.need_name"));
        const list = Array.from(shots.querySelectorAll(".shot-row")).map((row) => {
          const shot = { role: row.querySelector(".shot-role").value, prompt: row.querySelector(".shot-prompt").value.trim(),
            candidates: Number(candidates.value || 1) };
          const lines = row.querySelector(".shot-words").value.split(" / ").map((x) => x.trim()).filter((x) => x);
          if (shot.role === "main_white") shot.prompt = "";
          else if (lines.length) shot.overlay = { template: "headline_band", lines };
          return shot;
        });
        if (!list.length) throw new Error(T.t("newset.need_shot"));
        const empty = list.findIndex((x) => !x.prompt && x.role !== "main_white");
        if (empty >= 0) throw new Error(T.tf("newset.need_words", { n: empty + 1 }));
        if (list.some((x) => x.role === "main_white") && !files.length) throw new Error(T.t("newset.white_needs_photo"));
        key = key || T.newKey();
        const references = [];
        for (const f of files) {
          const up = await api("POST", "/v1/uploads", undefined, f);
          references.push(up.id);
        }
        for (const x of list) {
          if (x.role === "main_white") x.source = { upload: references[0] };
        }
        const body = { product: product.value.trim(), references, shots: list, provider: provider.value, idempotency_key: key };
        if (style.value.trim()) body.style = style.value.trim();
        const s = await api("POST", "/v1/sets", body);
        location.hash = "#/sets/" + encodeURIComponent(s.id);
      });
    });
    T.setView("new-set", null, T.t("view.new_set"), form, fresh);
  }

  // ---------------------------------------------------------------- spend

  async function showSpend(fresh) {
    const group = h("select", { id: "spend-group" },
      [["month", T.t("spend.by_month")], ["day", T.t("spend.by_day")], ["provider", T.t("spend.by_provider")]].map(([v, w]) => h("option", { value: v }, w)));
    const out = h("div", { id: "spend-table" });
    const load = async () => {
      let r;
      try {
        r = await api("GET", "/v1/spend?group=" + encodeURIComponent(group.value));
      } catch (e) {
        if (e.code === "signed_out") return;
        out.replaceChildren(h("p", { class: "hint" }, e.status === 404
          ? T.t("spend.not_counted")
          : e.message));
        return;
      }
      const cur = r.currency;
      const rows = r.rows || [];
      /* A row: {key, currency, charged: {count, amount}, possibly_charged: {count, amount}, refused};
         each row is in its own currency (amounts are never added across currencies). */
      const cell = (a, c) => {
        const n = (a && a.count) || 0;
        const m = a && a.amount ? money(a.amount, c || cur) : null;
        return n + (m ? T.tf("money.about_paren", { amount: m }) : "");
      };
      const line = (row, head) => h("tr", {}, h("th", { scope: "row" }, head),
        h("td", {}, cell(row.charged, row.currency)), h("td", {}, cell(row.possibly_charged, row.currency)),
        h("td", {}, String(row.refused || 0)));
      const several = (r.totals_by_currency || []).length > 1;
      out.replaceChildren(rows.length ? h("table", { class: "spend", id: "spend-rows" },
        h("caption", {}, T.t("spend.caption")),
        h("thead", {}, h("tr", {}, [({ month: T.t("spend.month"), day: T.t("spend.day"), provider: T.t("job.fact_provider") })[group.value] || T.t("spend.row"),
          T.t("spend.charged"), T.t("spend.possibly"), T.t("spend.refused")].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, rows.map((row) => line(row, String(row.key)))),
        several ? h("tfoot", {}, r.totals_by_currency.map((t) => line(t, T.t("spend.total") + " (" + t.currency + ")")))
          : r.totals ? h("tfoot", {}, line(r.totals, T.t("spend.total"))) : null)
        : h("p", { class: "hint" }, T.t("spend.nothing")),
      r.totals && r.totals.recorded_by_hand
        ? h("p", { id: "spend-by-hand", class: "hint" }, T.tf("spend.by_hand", { n: r.totals.recorded_by_hand }))
        : null);
    };
    const money = T.money;
    group.addEventListener("change", load);
    const budget = await T.budgetSection(() => showSpend(false));
    if (T.view.signedOut) return;
    const shown = T.setView("spend", null, T.t("view.spend"), [budget, h("p", { class: "hint" },
      T.t("spend.intro")),
    h("p", { class: "filter" }, h("label", { for: "spend-group" }, T.t("spend.show")), group), out], fresh);
    if (!shown) return;
    T.view.onResync = load;
    await load();
  }

  T.showSets = showSets;
  T.showSet = showSet;
  T.showNewSet = showNewSet;
  T.showSpend = showSpend;
})(window.tally);
