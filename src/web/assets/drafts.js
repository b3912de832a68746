/* tally's web page: "Start from photos" (issue #36). #/drafts/new: drop or pick 1 to 6 photos,
   name the product, add what you know (optional facts), pick the marketplace, the copy's
   language and who drafts, and see the price of drafting before anything is sent (free on the
   demo; else at most the provider's price per million tokens for the photos, the request and
   the longest answer it allows). #/drafts/{id}: the draft — its facts (with where each came
   from, editable and confirmable), its questions (answering one is an edit), its shots and
   listing copy (editable), "Draft again" with its price first, and "Confirm" with the set's
   total price first. Every edit is a new revision through `PATCH /v1/drafts/{id}` naming the
   revision it was made on; a stale one is said in plain words and the latest is shown.
   Confirming makes the image set (the API's 409 with the estimated cost is shown as a question
   before the charge is acknowledged) and opens it, where it generates. The image sets page
   lists the drafts not confirmed yet (T.draftsSection). */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot } = T;

  /* What the API accepts (`domain::draft`). */
  const MARKETPLACES = ["taobao", "tmall", "jd", "pinduoduo", "amazon", "shopify", "etsy"];
  const FACT_KEYS = ["material", "size", "colour", "price", "selling_points", "audience"];
  const ROLES = ["main", "selling_point", "scene", "detail", "size"];
  const MAX_PHOTOS = 6;
  const draftPath = (id) => "/v1/drafts/" + encodeURIComponent(id);

  /** A fact's name in the page's language (the six the form asks for, and the demo's
      `category`); any other key as the model wrote it. */
  function factName(key) {
    return FACT_KEYS.includes(key) || key === "category" ? T.t(`draft.fact.${key}`) : String(key).replace(/_/g, " ");
  }

  function roleName(role) {
    return T.roleWords(role);
  }

  function marketName(m) {
    return MARKETPLACES.includes(m) ? T.t(`market.${m}`) : m;
  }

  /** The providers that draft, from `GET /v1/providers`. */
  function drafting(providers) {
    return providers.filter((p) => (p.operations || []).includes("draft"));
  }

  /** The most a drafting call can cost, in words, from the daemon's own estimate
      (`POST /v1/drafts/estimate`, or a draft's `redraft_estimated_cost`): "free", "at most
      about $0.01", or a price tally does not know. */
  function priceWords(e) {
    if (!e) return "";
    if (e.billable === false) return T.tf("draft.price_free", { provider: e.provider });
    const c = e.estimated_cost;
    if (!c || c.amount === null || c.amount === undefined) return T.tf("draft.price_unknown", { provider: e.provider });
    return T.tf("draft.price_amount", { provider: e.provider, amount: T.money(c.amount, c.currency), tokens: e.max_output_tokens });
  }

  /** The daemon's estimate for a new draft of `input` with `photos` photos on `provider`. */
  function estimate(provider, photos, input) {
    const facts = {};
    for (const f of input.facts) facts[f.key] = f.value;
    return api("POST", "/v1/drafts/estimate", { product: input.product, photo_count: Math.min(Math.max(photos, 1), MAX_PHOTOS),
      facts, marketplace: input.marketplace, language: input.language, provider });
  }

  /** An option list with `value` selected. */
  function options(list, value) {
    return list.map(([v, words, lang]) => h("option", { value: v, selected: v === value, lang }, words));
  }

  // ---------------------------------------------------------------- the form

  async function showNewDraft(fresh) {
    let info;
    try { info = await T.loadProviders(); } catch (e) { if (e.code === "signed_out") return; info = { providers: [], defaultProvider: "" }; }
    const providers = drafting(info.providers);
    const files = [];
    const refErr = errorSlot("draft-photos-error");
    const picker = h("input", { id: "draft-photos", type: "file", multiple: true, accept: "image/png,image/jpeg,image/webp",
      class: "visually-hidden" });
    const previews = h("ul", { id: "draft-previews", class: "refs" });
    const count = h("p", { id: "draft-photo-count", class: "hint", "aria-live": "polite" });
    const drop = h("div", { id: "draft-drop", class: "drop" },
      h("p", {}, T.t("newset.drop")),
      h("label", { for: "draft-photos", class: "button" }, T.t("newset.choose")), picker,
      h("p", { class: "hint" }, T.t("draft.photos_hint")));
    const product = h("input", { id: "draft-product", type: "text", required: true, autocomplete: "off",
      maxlength: 200, placeholder: T.t("draft.product_placeholder") });
    const facts = FACT_KEYS.map((k) => h("input", { id: "draft-fact-" + k, type: "text", autocomplete: "off", maxlength: 300,
      "data-key": k }));
    const market = h("select", { id: "draft-marketplace" },
      options([["", T.t("draft.marketplace_none")]].concat(MARKETPLACES.map((m) => [m, marketName(m)])), ""));
    const language = h("select", { id: "draft-language" },
      options([["en", "English", "en"], ["zh-CN", "简体中文", "zh-CN"]], document.documentElement.lang === "zh-CN" ? "zh-CN" : "en"));
    const provider = h("select", { id: "draft-provider" },
      options(providers.map((p) => [p.name, p.name]), (providers.find((p) => p.billable === false) || providers[0] || {}).name));
    const price = h("p", { id: "draft-price", class: "hint" });
    const create = h("button", { type: "submit", id: "draft-create", class: "primary", disabled: !providers.length }, T.t("draft.create"));
    const err = errorSlot("draft-create-error");

    /** What the daemon will send as data. */
    const input = () => ({
      product: product.value.trim(),
      facts: facts.filter((f) => f.value.trim()).map((f) => ({ key: f.dataset.key, value: f.value.trim() })),
      marketplace: market.value || null,
      language: language.value,
      answers: [],
    });
    /* The price line follows the form; an answer that a later change overtook is dropped. */
    let asked = 0;
    const showPrice = async () => {
      const n = ++asked;
      if (!providers.some((x) => x.name === provider.value)) { price.textContent = T.t("draft.no_provider"); return; }
      try {
        const e = await estimate(provider.value, files.length, input());
        if (n === asked) price.textContent = priceWords(e);
      } catch (e) {
        if (n === asked) price.textContent = e.message || "";
      }
    };
    const drawPreviews = () => {
      previews.replaceChildren(...files.map((f, i) => {
        const remove = h("button", { type: "button", class: "small", id: "draft-photo-remove-" + i,
          "aria-label": T.tf("newset.remove_file", { name: f.name }) }, T.t("newset.remove"));
        remove.addEventListener("click", () => { files.splice(i, 1); drawPreviews(); picker.focus(); });
        return h("li", { "data-file": f.name },
          h("img", { src: URL.createObjectURL(f), alt: T.tf("newset.ref_alt", { n: i + 1, name: f.name }), class: "thumb ref" }),
          h("span", { class: "hint" }, f.name), remove);
      }));
      count.textContent = files.length ? T.tf("draft.photo_count", { n: files.length, max: MAX_PHOTOS }) : "";
      showPrice();
    };
    const addFiles = (list) => {
      T.showError(refErr, "");
      for (const f of list) {
        const why = T.notAPhoto(f);
        if (why) { T.showError(refErr, why); continue; }
        if (files.length >= MAX_PHOTOS) { T.showError(refErr, T.tf("draft.too_many", { max: MAX_PHOTOS })); break; }
        files.push(f);
      }
      drawPreviews();
    };
    picker.addEventListener("change", () => { addFiles(Array.from(picker.files)); picker.value = ""; });
    drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (ev) => {
      ev.preventDefault();
      drop.classList.remove("over");
      addFiles(Array.from((ev.dataTransfer && ev.dataTransfer.files) || []));
    });

    let key = null;
    const form = h("form", { id: "new-draft", class: "card", novalidate: true },
      h("p", { class: "back" }, h("a", { href: "#/sets" }, T.t("set.all"))),
      h("p", { class: "hint" }, T.t("draft.intro")),
      h("fieldset", {}, h("legend", {}, T.t("draft.photos")), drop, previews, count, refErr),
      h("label", { for: "draft-product" }, T.t("newset.product")), product,
      h("fieldset", { class: "draft-facts-in" }, h("legend", {}, T.t("draft.facts_optional")),
        FACT_KEYS.map((k, i) => [h("label", { for: "draft-fact-" + k }, factName(k)), facts[i]])),
      h("label", { for: "draft-marketplace" }, T.t("draft.marketplace")), market,
      h("label", { for: "draft-language" }, T.t("draft.language")), language,
      h("label", { for: "draft-provider" }, T.t("draft.provider")), provider,
      price,
      h("div", { class: "actions" }, create), err);
    form.addEventListener("input", () => { key = null; showPrice(); });
    form.addEventListener("change", showPrice);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const p = providers.find((x) => x.name === provider.value);
      const go = async () => {
        const body = input();
        if (!files.length) throw new Error(T.t("draft.need_photo"));
        if (!body.product) throw new Error(T.t("newset.need_name"));
        /* A provider that bills: its price, asked first (nothing is sent before "yes"). */
        if (p && p.billable !== false) {
          const words = priceWords(await estimate(p.name, files.length, body));
          const yes = await T.confirmDialog(T.tf("draft.ask_title", { provider: p.name }), words, T.t("draft.ask_yes"));
          if (!yes) return;
        }
        key = key || T.newKey();
        const photos = [];
        for (const f of files) photos.push((await api("POST", "/v1/uploads", undefined, f)).id);
        const facts = {};
        for (const f of body.facts) facts[f.key] = f.value;
        const d = await api("POST", "/v1/drafts", { product: body.product, photos, facts, marketplace: body.marketplace,
          language: body.language, provider: provider.value, idempotency_key: key });
        location.hash = "#/drafts/" + encodeURIComponent(d.id);
      };
      busy(create, err, go);
    });
    if (!T.setView("new-draft", null, T.t("view.new_draft"), form, fresh)) return;
    showPrice();
  }

  // ---------------------------------------------------------------- one draft

  /* Polls a draft that is still being drafted, besides the live stream's task events. */
  let pollTimer = null;

  async function showDraft(id, fresh, said) {
    clearTimeout(pollTimer);
    const mine = T.ticket();
    let d;
    let info = { providers: [], defaultProvider: "" };
    try {
      d = await api("GET", draftPath(id));
      try { info = await T.loadProviders(); } catch (e) { if (e.code === "signed_out") return; }
    } catch (e) {
      if (e.code === "signed_out" || !T.latest(mine)) return;
      T.setView("draft", id, T.t("draft.not_found"), [h("p", {}, h("a", { href: "#/sets" }, T.t("set.all"))), h("p", {}, e.message)], fresh);
      return;
    }
    if (location.hash !== "#/drafts/" + encodeURIComponent(id) && location.hash !== "#/drafts/" + id) return;
    /* A newer read is on its way: it draws. */
    if (!T.latest(mine)) return;
    const focused = document.activeElement && document.activeElement.id;
    if (!T.setView("draft", id, d.product, draftView(d, info), fresh)) return;
    if (said) T.showError(document.getElementById("draft-error"), said);
    else if (!fresh && focused && document.getElementById(focused)) document.getElementById(focused).focus();
    T.view.onTask = (changed) => { if (changed === d.task_id) showDraft(id, false); };
    T.view.onResync = () => showDraft(id, false);
    if (d.status === "drafting") {
      pollTimer = setTimeout(() => { if (T.view.name === "draft" && T.view.id === id) showDraft(id, false); }, 1500);
    }
  }

  /** Save an edit as a new revision on the one shown; a stale revision reloads the latest and
      says so. Once saved, the focus goes to `focusId` (the button that opened the form). */
  async function edit(d, body, focusId) {
    try {
      await api("PATCH", draftPath(d.id), Object.assign({ revision: d.revision }, body));
    } catch (e) {
      if (e.code === "stale_revision") return showDraft(d.id, false, T.t("draft.stale"));
      throw e;
    }
    await showDraft(d.id, false);
    const back = focusId && document.getElementById(focusId);
    if (back) back.focus();
  }

  /** A POST that a provider's price may stop (409 `cost_acknowledgement_required`): asked with
      the daemon's own estimate (`words(amount, estimate)` says it; the amount is null when
      tally does not know it), then sent again acknowledging it. Resolves with the answer, or
      null when the owner said no. */
  async function withPrice(path, body, title, yes, words) {
    try {
      return await api("POST", path, body);
    } catch (e) {
      if (e.code !== "cost_acknowledgement_required") throw e;
      const est = e.estimatedCost || {};
      const ok = await T.confirmDialog(title, words(T.money(est.amount, est.currency), est), yes);
      if (!ok) return null;
      return api("POST", path, Object.assign({}, body, { acknowledge_possible_charge: true }));
    }
  }

  function statusWords(d) {
    return T.t(`draft.status.${d.status}`) + (d.message ? " " + d.message : "");
  }

  function draftView(d, info) {
    const open = d.status === "ready";
    const err = errorSlot("draft-error");
    const photos = h("ul", { id: "draft-photo-list", class: "refs" }, (d.photos || []).map((u, i) =>
      h("li", {}, T.enlargeable("/v1/uploads/" + encodeURIComponent(u), T.tf("set.ref_alt", { n: i + 1, product: d.product }), null, "ref"))));
    const p = info.providers.find((x) => x.name === d.provider);
    const charge = p && p.billable === false ? T.tf("draft.charge_free", { provider: d.provider })
      : d.charge ? T.chargeSentence({ charge: d.charge }) : null;
    const facts = [
      h("dt", {}, T.t("draft.marketplace")), h("dd", {}, d.marketplace ? marketName(d.marketplace) : T.t("draft.marketplace_none")),
      h("dt", {}, T.t("draft.language")), h("dd", { lang: d.language }, d.language === "zh-CN" ? "简体中文" : "English"),
      h("dt", {}, T.t("draft.provider")), h("dd", {}, d.provider),
      h("dt", {}, T.t("draft.revision")), h("dd", { id: "draft-revision" }, String(d.revision)),
    ];
    return h("article", { class: "detail draft", "data-draft-id": d.id, "data-status": d.status, "data-revision": String(d.revision) },
      h("p", { class: "back" }, h("a", { href: "#/sets" }, T.t("set.all"))),
      h("p", { id: "draft-status", class: "status-line", role: "status" }, statusWords(d)),
      d.set_id ? h("p", {}, h("a", { href: "#/sets/" + encodeURIComponent(d.set_id), id: "draft-set-link", class: "button primary" },
        T.t("draft.open_set"))) : null,
      err,
      photos,
      h("dl", { class: "facts" }, facts),
      charge ? h("p", { class: "charge", id: "draft-charge" }, charge) : null,
      d.raw_answer ? h("details", { class: "technical" }, h("summary", {}, T.t("draft.raw")), h("pre", {}, h("code", {}, d.raw_answer))) : null,
      (d.questions || []).length ? questionsSection(d, open) : null,
      (d.facts || []).length ? factsSection(d, open) : null,
      (d.shots || []).length ? shotsSection(d, open) : null,
      d.copy && d.copy.title ? copySection(d, open) : null,
      d.set_id ? null : nextSection(d, info));
  }

  // ---------------------------------------------------------------- questions

  function questionsSection(d, open) {
    return h("section", { "aria-labelledby": "draft-questions-title", id: "draft-questions" },
      h("h2", { id: "draft-questions-title" }, T.t("draft.questions")),
      h("p", { class: "hint" }, T.t("draft.questions_hint")),
      d.questions.map((q, i) => {
        const answered = q.answer !== null && q.answer !== undefined;
        if (!open) {
          return h("div", { class: "card question" }, h("h3", {}, q.question),
            h("p", {}, answered ? T.tf("draft.answered", { answer: q.answer }) : T.t("draft.unanswered")));
        }
        const qErr = errorSlot("draft-q-error-" + i);
        const radios = (q.options || []).map((o, j) => {
          const r = h("input", { type: "radio", name: "draft-q-" + i, id: "draft-q-" + i + "-" + j, value: o, checked: q.answer === o });
          return h("label", { class: "check", for: "draft-q-" + i + "-" + j }, r, " " + o);
        });
        const own = h("input", { type: "text", id: "draft-q-own-" + i, maxlength: 300, autocomplete: "off",
          value: answered && !(q.options || []).includes(q.answer) ? q.answer : "" });
        const save = h("button", { type: "submit", id: "draft-q-save-" + i }, T.t("draft.answer_save"));
        const form = h("form", { class: "card question", id: "draft-q-form-" + i },
          h("fieldset", {}, h("legend", {}, q.question), radios,
            h("label", { for: "draft-q-own-" + i }, T.t(radios.length ? "draft.answer_other" : "draft.answer_own")), own),
          answered ? h("p", { class: "hint", id: "draft-q-answer-" + i }, T.tf("draft.answered", { answer: q.answer })) : null,
          h("div", { class: "actions" }, save), qErr);
        own.addEventListener("input", () => { if (own.value) form.querySelectorAll("input[type=radio]").forEach((r) => { r.checked = false; }); });
        form.addEventListener("submit", (ev) => {
          ev.preventDefault();
          busy(save, qErr, async () => {
            const picked = form.querySelector("input[type=radio]:checked");
            const answer = own.value.trim() || (picked && picked.value) || "";
            if (!answer) throw new Error(T.t("draft.answer_need"));
            await edit(d, { answers: { [q.id]: answer } }, "draft-q-save-" + i);
          });
        });
        return form;
      }));
  }

  // ---------------------------------------------------------------- facts

  function sourceWords(s) {
    return ["owner", "photo", "inferred"].includes(s) ? T.t(`draft.source.${s}`) : s;
  }

  function factsSection(d, open) {
    const list = h("ul", { class: "plain draft-facts", id: "draft-fact-list" }, d.facts.map((f) =>
      h("li", { "data-key": f.key, "data-source": f.source, "data-confirmed": String(!!f.confirmed) },
        h("strong", {}, T.tf("draft.fact_name", { name: factName(f.key) })), h("span", { class: "fact-value" }, f.value), " ",
        h("span", { class: "hint" }, T.tf(f.confirmed ? "draft.fact_from_confirmed" : "draft.fact_from", { source: sourceWords(f.source) })))));
    const section = h("section", { "aria-labelledby": "draft-facts-title", id: "draft-facts" },
      h("h2", { id: "draft-facts-title" }, T.t("draft.facts")),
      h("p", { class: "hint" }, T.t("draft.facts_hint")), list);
    if (!open) return section;
    const fErr = errorSlot("draft-facts-error");
    const editBtn = h("button", { type: "button", id: "draft-facts-edit" }, T.t("draft.facts_edit"));
    editBtn.addEventListener("click", () => {
      const values = d.facts.map((f, i) => h("input", { type: "text", id: "draft-fact-value-" + i, value: f.value, maxlength: 300 }));
      const checks = d.facts.map((f, i) => h("input", { type: "checkbox", id: "draft-fact-ok-" + i, checked: f.confirmed }));
      const save = h("button", { type: "submit", class: "primary", id: "draft-facts-save" }, T.t("edit.save"));
      const cancel = h("button", { type: "button", id: "draft-facts-cancel" }, T.t("edit.keep"));
      const form = h("form", { class: "card", id: "draft-facts-form" },
        d.facts.map((f, i) => h("div", { class: "fact-edit" },
          h("label", { for: "draft-fact-value-" + i }, T.tf("draft.fact_label", { name: factName(f.key), source: sourceWords(f.source) })), values[i],
          h("label", { class: "check", for: "draft-fact-ok-" + i }, checks[i], " " + T.t("draft.fact_confirm")))),
        h("div", { class: "actions" }, save, cancel), fErr);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        busy(save, fErr, async () => {
          const facts = d.facts.map((f, i) => ({ key: f.key, value: values[i].value.trim(), source: f.source, confirmed: checks[i].checked }));
          await edit(d, { facts }, "draft-facts-edit");
        });
      });
      cancel.addEventListener("click", () => { form.remove(); editBtn.hidden = false; editBtn.focus(); });
      editBtn.hidden = true;
      editBtn.parentNode.after(form);
      values[0].focus();
    });
    section.append(h("div", { class: "actions" }, editBtn), fErr);
    return section;
  }

  // ---------------------------------------------------------------- shots

  function shotsSection(d, open) {
    return h("section", { "aria-labelledby": "draft-shots-title", id: "draft-shots-section" },
      h("h2", { id: "draft-shots-title" }, T.t("draft.shots")),
      h("ol", { class: "shots", id: "draft-shots" }, d.shots.map((s, i) => shotCard(d, s, i, open))));
  }

  function shotCard(d, s, i, open) {
    const sErr = errorSlot("draft-shot-error-" + i);
    const card = h("li", { class: "shot", "data-position": String(i), "data-role": s.role },
      h("h3", {}, (i + 1) + ". " + roleName(s.role)),
      h("p", { id: "draft-shot-purpose-" + i }, s.purpose),
      s.selling_point ? h("p", {}, h("strong", {}, T.t("draft.shot_point") + " "), s.selling_point) : null,
      h("p", { class: "hint", id: "draft-shot-prompt-" + i }, s.prompt),
      h("p", { class: "hint" }, T.tf(s.candidates === 1 ? "draft.shot_candidates_one" : "draft.shot_candidates", { n: s.candidates }),
        s.profile && s.profile !== "original" ? " · " + T.tf("draft.shot_profile", { profile: marketName(s.profile) }) : ""));
    if (!open) return card;
    const editBtn = h("button", { type: "button", id: "draft-shot-edit-" + i, "aria-label": T.tf("draft.shot_edit_label", { n: i + 1 }) }, T.t("edit.edit"));
    const actions = h("div", { class: "actions" }, editBtn);
    if (d.shots.length > 1) {
      const remove = h("button", { type: "button", id: "draft-shot-remove-" + i, "aria-label": T.tf("newset.remove_shot", { n: i + 1 }) }, T.t("newset.remove"));
      remove.addEventListener("click", () => busy(remove, sErr, () => edit(d, { shots: d.shots.filter((_, j) => j !== i) })));
      actions.append(remove);
    }
    editBtn.addEventListener("click", () => {
      const id = (x) => "draft-shot-" + x + "-" + i;
      const role = h("select", { id: id("role") }, options(ROLES.map((r) => [r, roleName(r)]), s.role));
      const purpose = h("input", { type: "text", id: id("purpose-in"), value: s.purpose, maxlength: 300 });
      const point = h("input", { type: "text", id: id("point-in"), value: s.selling_point || "", maxlength: 300 });
      const prompt = h("textarea", { id: id("prompt-in"), rows: 4 });
      prompt.value = s.prompt;
      const cands = h("select", { id: id("candidates-in") }, options([1, 2, 3, 4].map((n) => [String(n), String(n)]), String(s.candidates)));
      const save = h("button", { type: "submit", class: "primary", id: id("save") }, T.t("edit.save_shot"));
      const cancel = h("button", { type: "button", id: id("cancel") }, T.t("edit.keep"));
      const form = h("form", { class: "edit-shot", id: id("form") },
        h("label", { for: id("role") }, T.t("edit.shot_kind")), role,
        h("label", { for: id("purpose-in") }, T.t("draft.shot_purpose")), purpose,
        h("label", { for: id("point-in") }, T.t("draft.shot_point")), point,
        h("label", { for: id("prompt-in") }, T.t("edit.shot_prompt")), prompt,
        h("label", { for: id("candidates-in") }, T.t("newset.candidates")), cands,
        h("div", { class: "actions" }, save, cancel));
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        busy(save, sErr, async () => {
          const shots = d.shots.map((x, j) => j !== i ? x : Object.assign({}, x, { role: role.value, purpose: purpose.value.trim(),
            selling_point: point.value.trim(), prompt: prompt.value.trim(), candidates: Number(cands.value) }));
          await edit(d, { shots }, "draft-shot-edit-" + i);
        });
      });
      cancel.addEventListener("click", () => { form.remove(); actions.hidden = false; editBtn.focus(); });
      actions.hidden = true;
      actions.after(form);
      prompt.focus();
    });
    card.append(actions, sErr);
    return card;
  }

  // ---------------------------------------------------------------- copy

  function copySection(d, open) {
    const c = d.copy;
    const section = h("section", { "aria-labelledby": "draft-copy-title", id: "draft-copy" },
      h("h2", { id: "draft-copy-title" }, T.t("draft.copy")),
      h("p", { id: "draft-copy-title-text", class: "copy-title", lang: c.language }, c.title),
      (c.bullets || []).length ? h("ul", { id: "draft-bullets", lang: c.language }, c.bullets.map((b) => h("li", {}, b.text))) : null);
    if (!open) return section;
    const cErr = errorSlot("draft-copy-error");
    const editBtn = h("button", { type: "button", id: "draft-copy-edit" }, T.t("draft.copy_edit"));
    editBtn.addEventListener("click", () => {
      const title = h("input", { type: "text", id: "draft-copy-title-in", value: c.title, maxlength: 300, lang: c.language });
      const bullets = (c.bullets || []).map((b, i) => {
        const t = h("textarea", { id: "draft-copy-bullet-" + i, rows: 2, maxlength: 300, lang: c.language });
        t.value = b.text;
        return t;
      });
      const save = h("button", { type: "submit", class: "primary", id: "draft-copy-save" }, T.t("edit.save"));
      const cancel = h("button", { type: "button", id: "draft-copy-cancel" }, T.t("edit.keep"));
      const form = h("form", { class: "card", id: "draft-copy-form" },
        h("label", { for: "draft-copy-title-in" }, T.t("draft.copy_title")), title,
        bullets.map((b, i) => [h("label", { for: "draft-copy-bullet-" + i }, T.tf("draft.copy_bullet", { n: i + 1 })), b]),
        h("div", { class: "actions" }, save, cancel), cErr);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        busy(save, cErr, async () => {
          const copy = Object.assign({}, c, { title: title.value.trim(),
            bullets: (c.bullets || []).map((b, i) => Object.assign({}, b, { text: bullets[i].value.trim() })) });
          await edit(d, { copy }, "draft-copy-edit");
        });
      });
      cancel.addEventListener("click", () => { form.remove(); editBtn.hidden = false; editBtn.focus(); });
      editBtn.hidden = true;
      editBtn.parentNode.after(form);
      title.focus();
    });
    section.append(h("div", { class: "actions" }, editBtn), cErr);
    return section;
  }

  // ---------------------------------------------------------------- draft again, confirm

  function nextSection(d, info) {
    const out = [];
    const p = info.providers.find((x) => x.name === d.provider);
    if (d.status !== "drafting") {
      const rErr = errorSlot("draft-redraft-error");
      const again = h("button", { type: "button", id: "draft-redraft" }, T.t("draft.redraft"));
      again.addEventListener("click", () => busy(again, rErr, async () => {
        let r;
        try {
          r = await withPrice(draftPath(d.id) + "/redraft", { revision: d.revision },
            T.tf("draft.ask_title", { provider: d.provider }), T.t("draft.ask_yes"),
            (amount) => amount ? T.tf("draft.redraft_ask", { provider: d.provider, amount })
              : T.tf("draft.redraft_ask_unknown", { provider: d.provider }));
        } catch (e) {
          if (e.code === "stale_revision") return showDraft(d.id, false, T.t("draft.stale"));
          throw e;
        }
        if (r) await showDraft(d.id, false);
      }));
      out.push(h("section", { "aria-labelledby": "draft-again-title", id: "draft-again" },
        h("h2", { id: "draft-again-title" }, T.t("draft.again_title")),
        h("p", { class: "hint" }, T.t("draft.again_hint")),
        h("p", { class: "hint", id: "draft-redraft-price" }, priceWords(p && { provider: d.provider, billable: p.billable, estimated_cost: d.redraft_estimated_cost,
          max_output_tokens: p.max_output_tokens })),
        h("div", { class: "actions" }, again), rErr));
    }
    if (d.status !== "ready") return out;
    /* The set's provider: the draft's own when it generates, else the default. */
    const makers = info.providers.filter((x) => (x.operations || ["generate"]).includes("generate"));
    const own = makers.find((x) => x.name === d.provider);
    const chosen = own ? own.name : (makers.find((x) => x.name === info.defaultProvider) || makers[0] || {}).name;
    const maker = h("select", { id: "draft-set-provider" }, options(makers.map((x) => [x.name, x.name]), chosen));
    const images = (d.shots || []).reduce((n, s) => n + Math.max(1, Number(s.candidates) || 1), 0);
    const total = h("p", { id: "draft-confirm-price", class: "price-total" });
    const showTotal = () => {
      const m = makers.find((x) => x.name === maker.value);
      const cost = T.priceWords(m, images) || T.t("job.price_not_configured");
      total.textContent = T.tf("draft.confirm_price", { shots: (d.shots || []).length, images, provider: maker.value, cost });
    };
    maker.addEventListener("change", showTotal);
    showTotal();
    const cErr = errorSlot("draft-confirm-error");
    const confirm = h("button", { type: "button", id: "draft-confirm", class: "primary" }, T.t("draft.confirm"));
    confirm.addEventListener("click", () => busy(confirm, cErr, async () => {
      let r;
      try {
        r = await withPrice(draftPath(d.id) + "/confirm", { revision: d.revision, provider: maker.value },
          T.t("draft.confirm_ask_title"), T.t("draft.confirm_ask_yes"),
          (amount, est) => amount ? T.tf("draft.confirm_ask", { provider: maker.value, images: est.images || images, amount })
            : T.tf("draft.confirm_ask_unknown", { provider: maker.value, images: est.images || images }));
      } catch (e) {
        if (e.code === "stale_revision") return showDraft(d.id, false, T.t("draft.stale"));
        throw e;
      }
      if (r && r.set_id) location.hash = "#/sets/" + encodeURIComponent(r.set_id);
    }));
    out.push(h("section", { "aria-labelledby": "draft-confirm-title", id: "draft-confirm-section", class: "card" },
      h("h2", { id: "draft-confirm-title" }, T.t("draft.confirm_title")),
      h("p", { class: "hint" }, T.t("draft.confirm_hint")),
      h("label", { for: "draft-set-provider" }, T.t("draft.set_provider")), maker,
      total,
      h("div", { class: "actions" }, confirm), cErr));
    return out;
  }

  // ---------------------------------------------------------------- drafts not confirmed yet

  /** For the image sets page: the drafts not confirmed yet, newest first, each a link back to
      it (null when there is none, or the list cannot be read). */
  async function draftsSection() {
    let page;
    try { page = await api("GET", "/v1/drafts?limit=20"); } catch (e) { return null; }
    const open = (page.drafts || []).filter((d) => !d.set_id);
    if (!open.length) return null;
    return h("section", { "aria-labelledby": "open-drafts-title", id: "open-drafts" },
      h("h2", { id: "open-drafts-title" }, T.t("draft.open_drafts")),
      h("ul", { class: "plain", id: "open-draft-list" }, open.map((d) => h("li", { "data-draft-id": d.id },
        h("a", { href: "#/drafts/" + encodeURIComponent(d.id) }, d.product), " ",
        h("span", { class: "hint" }, T.tf("draft.open_line", { status: T.t(`draft.state.${d.status}`), n: d.revision }), " · ",
          T.time(d.updated_at))))));
  }

  T.showNewDraft = showNewDraft;
  T.draftsSection = draftsSection;
  T.showDraft = showDraft;
})(window.tally);
