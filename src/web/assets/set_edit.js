/* tally's web page: changing a set before anything was sent for it (a queued shot's prompt and
   role; the product and style notes while no shot of the set was sent; its reference photos,
   added or removed, while no request of the set left), duplicating a set as a copy to edit
   (which sends nothing), starting a copy ("Start generating": asking first, with the price when
   tally knows it) and deleting a set whose every shot failed or was canceled, or a copy never
   started (asking first; jobs that reached the provider stay in Jobs and Spend).
   sets.js calls T.setEditActions for the set's buttons and T.shotEditButton for each shot;
   every change goes through the API (PATCH, POST …/duplicate, POST …/start, DELETE /v1/sets/{id}), whose
   refusals are shown as they are worded. */
"use strict";

(function (T) {
  const { h, api, busy } = T;

  /** Every task of a shot (its candidates, or the shot itself), as {status}. */
  function tasksOf(shot) {
    return (shot.candidates && shot.candidates.length) ? shot.candidates : [shot];
  }

  /** Nothing was sent for this shot as far as the page can tell (the daemon decides). */
  function unsent(shot) {
    return tasksOf(shot).every((c) => c.status === "queued" || c.status === "waiting");
  }

  function roleSelect(id, value) {
    /* A white main image is made from a photo, never by changing a generated shot's role. */
    return h("select", { id: id }, T.ROLES.filter(([v]) => v !== "main_white")
      .map(([v]) => h("option", { value: v, selected: v === value }, T.roleWords(v))));
  }

  /* An open form's words, by "set id:shot position" (or "set id:set"), so that a live update
     that draws the set again (another shot finishing) reopens the form as it was. */
  const drafts = new Map();

  /** Open `open(draft)` again after the view is drawn, when a form for `key` was open. */
  function reopen(key, open) {
    const draft = drafts.get(key);
    if (draft) queueMicrotask(() => open(draft));
  }

  /** Note in `draft` whether one of `fields` has the focus (a redraw removes the field without
      a blur, so a reopened form takes the focus back only when it had it). */
  function watchFocus(fields, draft) {
    for (const f of fields) {
      f.addEventListener("focus", () => { draft.focus = true; });
      f.addEventListener("blur", () => { draft.focus = false; });
    }
  }

  /** Whether nothing on the page has the focus (a reopened form may then take it). */
  function idle() {
    return !document.activeElement || document.activeElement === document.body;
  }

  /** "Edit" for a shot nothing was sent for: opens a small form under the shot's actions. */
  function shotEditButton(s, shot, err, reload) {
    if (s.canceled || !unsent(shot)) return null;
    const p = shot.position;
    const key = s.id + ":" + p;
    const edit = h("button", { type: "button", id: "shot-edit-" + p }, T.t("edit.edit"));
    const open = (draft) => {
      if (!edit.isConnected || document.getElementById("shot-edit-form-" + p)) return;
      const prompt = h("textarea", { id: "shot-edit-prompt-" + p, rows: "3", required: true });
      prompt.value = draft.prompt;
      const role = roleSelect("shot-edit-role-" + p, draft.role);
      const keep = () => { draft.prompt = prompt.value; draft.role = role.value; };
      prompt.addEventListener("input", keep);
      role.addEventListener("change", keep);
      watchFocus([prompt, role], draft);
      drafts.set(key, draft);
      const save = h("button", { type: "submit", class: "primary", id: "shot-edit-save-" + p }, T.t("edit.save_shot"));
      const cancel = h("button", { type: "button", id: "shot-edit-cancel-" + p }, T.t("edit.keep"));
      const form = h("form", { class: "edit-shot", id: "shot-edit-form-" + p },
        h("p", { class: "hint" }, T.t("edit.shot_hint")),
        h("label", { for: "shot-edit-prompt-" + p }, T.t("edit.shot_prompt")), prompt,
        h("label", { for: "shot-edit-role-" + p }, T.t("edit.shot_kind")), role,
        h("div", { class: "actions" }, save, cancel));
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        busy(save, err, async () => {
          await api("PATCH", "/v1/sets/" + encodeURIComponent(s.id),
            { shots: [{ position: p, prompt: prompt.value, role: role.value }] });
          drafts.delete(key);
          await reload();
        });
      });
      cancel.addEventListener("click", () => { drafts.delete(key); form.remove(); edit.hidden = false; edit.focus(); });
      edit.hidden = true;
      edit.parentNode.after(form);
      if (draft.focus || idle()) prompt.focus();
    };
    edit.addEventListener("click", () => open({ prompt: T.shotWords(shot.prompt), role: shot.role, focus: true }));
    reopen(key, open);
    return edit;
  }

  /** How many images a set's shots make (every candidate of every shot). */
  function imagesOf(s) {
    return (s.shots || []).reduce((n, x) => n + tasksOf(x).length, 0);
  }

  /** What starting a copy costs, in words: free, about an amount, or a price tally does not know. */
  function startWords(s, provider) {
    const images = imagesOf(s);
    if (provider && provider.billable === false) return T.tf("dup.free", { provider: s.provider });
    const price = provider && provider.price_per_image;
    const total = (price !== null && price !== undefined && price !== "") ? T.money(Number(price) * images, provider.currency) : null;
    return total
      ? T.tf("dup.cost", { provider: s.provider, total })
      : T.tf("dup.unknown", { provider: s.provider });
  }

  /** "Start generating" for a copy to edit (`status` draft), with its price beside it; on a
      provider that charges, the price is asked first (as other spending is), then the start
      acknowledges it. */
  function startButton(s, provider, err, reload) {
    const start = h("button", { type: "button", class: "primary", id: "start-set" }, T.t("start.button"));
    start.addEventListener("click", async () => {
      if (T.priceKind(provider) !== "free") {
        const yes = await T.confirmDialog(T.t("start.title"),
          T.tf("start.made", { images: imagesOf(s) }) + startWords(s, provider), T.t("start.yes"));
        if (!yes) return;
      }
      busy(start, err, async () => {
        await api("POST", "/v1/sets/" + encodeURIComponent(s.id) + "/start", { acknowledge_possible_charge: true });
        await reload();
      });
    });
    return [start, h("span", { class: "hint", id: "start-price" }, startWords(s, provider))];
  }

  /** The set's own buttons: start a copy to edit, edit the product and style, duplicate, delete. */
  function setEditActions(s, provider, err, reload) {
    const out = [];
    const shots = s.shots || [];
    const draft = s.status === "draft";
    if (draft) out.push(...startButton(s, provider, err, reload));
    if (!s.canceled && shots.length && shots.every(unsent)) {
      const key = s.id + ":set";
      const edit = h("button", { type: "button", id: "set-edit" }, T.t("edit.set"));
      const open = (draft) => {
        if (!edit.isConnected || document.getElementById("set-edit-form")) return;
        const product = h("input", { id: "set-edit-product", type: "text", required: true });
        product.value = draft.product;
        const style = h("textarea", { id: "set-edit-style", rows: "2" });
        style.value = draft.style;
        const keep = () => { draft.product = product.value; draft.style = style.value; };
        product.addEventListener("input", keep);
        style.addEventListener("input", keep);
        watchFocus([product, style], draft);
        drafts.set(key, draft);
        const save = h("button", { type: "submit", class: "primary", id: "set-edit-save" }, T.t("edit.save"));
        const cancel = h("button", { type: "button", id: "set-edit-cancel" }, T.t("edit.keep"));
        const form = h("form", { class: "edit-set", id: "set-edit-form" },
          h("p", { class: "hint" }, T.t("edit.set_hint")),
          h("label", { for: "set-edit-product" }, T.t("edit.product")), product,
          h("label", { for: "set-edit-style" }, T.t("edit.style")), style,
          h("div", { class: "actions" }, save, cancel));
        form.addEventListener("submit", (ev) => {
          ev.preventDefault();
          busy(save, err, async () => {
            await api("PATCH", "/v1/sets/" + encodeURIComponent(s.id), { product: product.value, style: style.value });
            drafts.delete(key);
            await reload();
          });
        });
        cancel.addEventListener("click", () => { drafts.delete(key); form.remove(); edit.hidden = false; edit.focus(); });
        edit.hidden = true;
        edit.parentNode.after(form);
        if (draft.focus || idle()) product.focus();
      };
      edit.addEventListener("click", () => open({ product: s.product, style: s.style || "", focus: true }));
      reopen(key, open);
      out.push(edit);
    }
    const dup = h("button", { type: "button", id: "duplicate-set" }, T.t("dup.button"));
    dup.addEventListener("click", async () => {
      /* A copy costs nothing until it is started: the question says so, and names no price. */
      const made0 = T.tf("dup.made", { shots: shots.length, images: imagesOf(s) });
      const yes = await T.confirmDialog(T.t("dup.title"), made0, T.t("dup.yes"));
      if (!yes) return;
      let made = null;
      await busy(dup, err, async () => {
        made = await api("POST", "/v1/sets/" + encodeURIComponent(s.id) + "/duplicate", { idempotency_key: T.newKey() });
      });
      if (made) location.hash = "#/sets/" + encodeURIComponent(made.id);
    });
    out.push(dup);
    const all = shots.flatMap(tasksOf);
    if (draft || (s.status !== "running" && all.length && all.every((c) => c.status === "failed" || c.status === "canceled"))) {
      const del = h("button", { type: "button", id: "delete-set", class: "danger" }, T.t("del.button"));
      del.addEventListener("click", async () => {
        const yes = await T.confirmDialog(T.t("del.title"), T.t("del.body"), T.t("del.yes"));
        if (!yes) return;
        let gone = false;
        await busy(del, err, async () => {
          await api("DELETE", "/v1/sets/" + encodeURIComponent(s.id));
          gone = true;
        });
        if (gone) location.hash = "#/sets";
      });
      out.push(del);
    }
    return out;
  }

  /** Whether the set's reference photos may still change, as far as the page can tell: not
      canceled, and no job of it has an image, an unknown outcome, a charge record or a hold.
      The daemon decides (`ops::set_edit`: no request of the set ever left and no worker holds
      a shot); its refusal is shown as it is worded. */
  function photosMayChange(s) {
    if (s.canceled) return false;
    return (s.shots || []).every((shot) => shot.held === null || shot.held === undefined) &&
      (s.shots || []).flatMap(tasksOf).every((c) => !c.artifact && !(c.artifacts && c.artifacts.length) &&
        c.status !== "succeeded" && c.status !== "unknown" && (!c.charge || c.charge.state === "none"));
  }

  /** The set's reference photos: each with the shots it is sent with and, while they may
      change, "Remove"; and "Add photos" by file picker or drag and drop (uploaded, then the
      set's list changed through `PATCH /v1/sets/{id}` with `references`). */
  function referencesSection(s, reload) {
    const refs = s.references || [];
    const editable = photosMayChange(s);
    if (!refs.length && !editable) return null;
    const err = T.errorSlot("refs-error");
    const ids = refs.map((u) => u.id);
    const change = (button, next) => busy(button, err, async () => {
      await api("PATCH", "/v1/sets/" + encodeURIComponent(s.id), { references: next });
      await reload();
    });
    /* Every shot is sent with every photo of its set. */
    const shots = (s.shots || []).map((x) => (x.position + 1) + ". " + T.roleWords(x.role)).join(", ");
    const items = refs.map((u, i) => {
      const alt = T.tf("set.ref_alt", { n: i + 1, product: s.product });
      let remove = null;
      if (editable) {
        remove = h("button", { type: "button", class: "small", id: "ref-remove-" + i,
          "aria-label": T.tf("refs.remove_label", { n: i + 1 }) }, T.t("newset.remove"));
        remove.addEventListener("click", () => change(remove, ids.filter((_, j) => j !== i)));
      }
      return h("li", { "data-upload-id": u.id, "data-sha256": u.sha256 },
        T.enlargeable(u.url, alt, null, "ref"),
        h("span", { class: "hint", id: "ref-used-" + i }, shots ? T.tf("refs.used_by", { shots }) : ""),
        remove);
    });
    let add = null;
    if (editable) {
      const picker = h("input", { id: "ref-add", type: "file", multiple: true, accept: "image/png,image/jpeg,image/webp",
        class: "visually-hidden" });
      const label = h("label", { for: "ref-add", class: "button", id: "ref-add-label" }, T.t("refs.add"));
      /* Upload the photos, then make them the set's last ones; the picker is disabled while
         they go up, so they cannot be added twice. */
      const addFiles = (files) => {
        if (!files.length) return;
        const bad = files.find((f) => T.notAPhoto(f));
        if (bad) { T.showError(err, T.notAPhoto(bad)); return; }
        busy(picker, err, async () => {
          const added = [];
          for (const f of files) added.push((await api("POST", "/v1/uploads", undefined, f)).id);
          await api("PATCH", "/v1/sets/" + encodeURIComponent(s.id), { references: ids.concat(added) });
          await reload();
        });
      };
      picker.addEventListener("change", () => {
        const files = Array.from(picker.files || []);
        picker.value = "";
        addFiles(files);
      });
      /* Dropped photos too, as in the new-set form. */
      add = h("div", { class: "drop", id: "ref-drop" }, h("p", {}, T.t("refs.drop")),
        h("div", { class: "actions" }, label, picker));
      add.addEventListener("dragover", (ev) => { ev.preventDefault(); add.classList.add("over"); });
      add.addEventListener("dragleave", () => add.classList.remove("over"));
      add.addEventListener("drop", (ev) => {
        ev.preventDefault();
        add.classList.remove("over");
        addFiles(Array.from((ev.dataTransfer && ev.dataTransfer.files) || []));
      });
    }
    return h("section", { "aria-labelledby": "refs-title", id: "refs-section" },
      h("h2", { id: "refs-title" }, T.t("set.refs_title")),
      h("p", { class: "hint", id: "refs-hint" }, editable
        ? T.t(refs.length ? "refs.hint_editable" : "refs.hint_none")
        : T.t("refs.hint_fixed")),
      refs.length ? h("ul", { id: "references", class: "refs" }, items) : null,
      add, err);
  }

  T.shotEditButton = shotEditButton;
  T.setEditActions = setEditActions;
  T.referencesSection = referencesSection;
})(window.tally);
