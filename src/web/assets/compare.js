/* tally's web page: choosing among a shot's candidates by keyboard and side by side. A shot's
   candidate list (sets.js) is enhanced here: the arrow keys move between the candidates (one
   tab stop for the list), Enter uses the focused one, and a "Compare" box on each candidate
   lets the owner tick two and see them enlarged side by side, each with "Use this one". */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot } = T;
  /* The ticked candidates per shot ("set/position" → artifact ids), kept while the set view is
     drawn again by a live update. */
  const ticks = new Map();

  /** The comparison dialog, made once and kept in the page. */
  function dialog() {
    let d = document.getElementById("compare-dialog");
    if (d) return d;
    d = h("dialog", { id: "compare-dialog", class: "image-dialog compare-dialog", "aria-labelledby": "compare-title" },
      h("h2", { id: "compare-title" }, T.t("compare.title")),
      h("div", { id: "compare-body", class: "compare" }),
      errorSlot("compare-error"),
      h("div", { class: "actions" }, h("button", { type: "button", id: "compare-close" }, T.t("close"))));
    d.querySelector("#compare-close").addEventListener("click", () => d.close());
    document.body.append(d);
    /* Going elsewhere closes it, as app.js closes the page's other dialogs. */
    window.addEventListener("hashchange", () => { if (d.open) d.close(); });
    return d;
  }

  /** Show two candidates of a shot side by side, enlarged, each with "Use this one". */
  function openCompare(s, shot, picks, path) {
    const d = dialog();
    const err = d.querySelector("#compare-error");
    T.showError(err, "");
    const role = T.roleWords(shot.role);
    d.querySelector("#compare-title").textContent = T.tf("compare.title_role", { role });
    d.querySelector("#compare-body").replaceChildren(...picks.map(({ c, n }) => {
      const a = c.artifact;
      const chosen = a.id === shot.chosen;
      const label = T.tf("cand.label", { role, n, total: shot.candidates.length });
      const use = chosen ? h("strong", { class: "chosen-mark" }, T.t("cand.chosen"))
        : h("button", { type: "button", class: "use-this", id: "compare-use-" + n, "aria-label": T.tf("cand.use_label", { label }) }, T.t("cand.use"));
      if (!chosen) {
        use.addEventListener("click", () => busy(use, err, async () => {
          await api("PUT", path, { artifact_id: a.id });
          d.close();
          await T.showSet(s.id, false);
        }));
      }
      return h("figure", { class: "compare-one" },
        h("img", { src: a.url, alt: label, "data-artifact-id": a.id }),
        h("figcaption", {}, T.tf("compare.candidate", { n })), use);
    }));
    d.showModal();
    d.querySelector("#compare-close").focus();
  }

  /** Enhance shot `shot`'s candidate list `ul` (items with data-artifact-id, in order):
      arrow keys and Enter, and the "Compare" boxes with their button. Returns the compare
      line to put after the list. */
  function enhanceCandidates(s, shot, ul) {
    const path = "/v1/sets/" + encodeURIComponent(s.id) + "/shots/" + shot.position + "/choice";
    const cands = shot.candidates || [];
    const items = Array.from(ul.children);
    const err = errorSlot("keys-error-" + shot.position);
    const hintId = "candidate-keys-" + shot.position;
    /* One tab stop: the chosen candidate, else the first. */
    const start = Math.max(0, items.findIndex((li) => li.dataset.chosen === "true"));
    items.forEach((li, i) => {
      li.tabIndex = i === start ? 0 : -1;
      li.setAttribute("aria-describedby", hintId);
    });
    ul.addEventListener("keydown", (ev) => {
      const li = ev.target;
      const i = items.indexOf(li);
      if (i < 0) return; /* a key on a button inside a candidate is the button's */
      let next = null;
      if (ev.key === "ArrowRight" || ev.key === "ArrowDown") next = Math.min(items.length - 1, i + 1);
      else if (ev.key === "ArrowLeft" || ev.key === "ArrowUp") next = Math.max(0, i - 1);
      else if (ev.key === "Home") next = 0;
      else if (ev.key === "End") next = items.length - 1;
      if (next !== null) {
        ev.preventDefault();
        items.forEach((x, k) => { x.tabIndex = k === next ? 0 : -1; });
        items[next].focus();
        return;
      }
      if (ev.key === "Enter") {
        ev.preventDefault();
        const id = li.dataset.artifactId;
        if (!id || li.dataset.chosen === "true") return;
        T.showError(err, "");
        api("PUT", path, { artifact_id: id })
          .then(() => T.showSet(s.id, false))
          .catch((e) => { if (e.code !== "signed_out") T.showError(err, e.message); });
      }
    });
    /* "Compare": tick two, then open them side by side. */
    const open = h("button", { type: "button", id: "compare-open-" + shot.position, disabled: true }, T.t("compare.open"));
    const ticked = () => items.map((li, i) => ({ li, i })).filter(({ li }) => {
      const box = li.querySelector(".compare-box input");
      return box && box.checked;
    });
    const key = s.id + "/" + shot.position;
    const update = () => {
      ticks.set(key, new Set(ticked().map(({ li }) => li.dataset.artifactId)));
      const n = ticked().length;
      open.disabled = n !== 2;
      open.textContent = n === 2 ? T.t("compare.open") : T.tf("compare.tick", { n });
    };
    items.forEach((li, i) => {
      const c = cands[i];
      if (!c || !c.artifact) return;
      const id = "compare-" + shot.position + "-" + i;
      const box = h("input", { type: "checkbox", id, checked: (ticks.get(key) || new Set()).has(c.artifact.id) });
      box.addEventListener("change", () => {
        /* At most two: ticking a third unticks the oldest. */
        const on = ticked();
        if (on.length > 2) {
          const other = on.find(({ li: x }) => x !== li);
          if (other) other.li.querySelector(".compare-box input").checked = false;
        }
        update();
      });
      const slot = li.querySelector(".actions") || li;
      slot.append(h("label", { class: "check compare-box", for: id }, box, T.t("compare.box")));
    });
    open.addEventListener("click", () => {
      const on = ticked();
      if (on.length !== 2) return;
      openCompare(s, shot, on.map(({ i }) => ({ c: cands[i], n: i + 1 })), path);
    });
    update();
    return h("div", { class: "compare-line" },
      h("p", { class: "hint", id: hintId }, T.t("compare.keys")),
      h("div", { class: "actions" }, open), err);
  }

  T.enhanceCandidates = enhanceCandidates;
})(window.tally);
