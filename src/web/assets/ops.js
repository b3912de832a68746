/* tally's web page: operations on a finished image (issue #35) — "Edit this image…" (an
   instruction, a provider that edits, the price before the click) and "Cut out the product"
   (a provider that cuts out, the price before the click); and the image's lineage: the image
   an edit or cutout was made from, beside its result, and what was made from an image. Each
   is a new task through the same protocol as a generation (`POST /v1/tasks` with
   `operation` and `image`); a paid one asks first, naming its price. Uses core.js. */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot } = T;

  /** The URL of a task's source image (`image`: {"artifact": ID} or {"upload": ID}). */
  function sourceUrl(image) {
    if (image && image.artifact) return "/v1/artifacts/" + encodeURIComponent(image.artifact);
    if (image && image.upload) return "/v1/uploads/" + encodeURIComponent(image.upload);
    return null;
  }

  /** For an edit or cutout: the image it was made from, shown beside the result, with a link
      to the job that made it. */
  function madeFrom(t) {
    const url = sourceUrl(t.image);
    if (!url) return null;
    const alt = T.t("ops.source_image");
    return h("section", { id: "made-from", class: "made-from", "aria-labelledby": "made-from-title" },
      h("h2", { id: "made-from-title" }, T.t(`ops.made_by.${t.operation}`)),
      h("figure", { class: "image source" },
        h("img", { src: url + "/thumbnail", alt, loading: "lazy", id: "source-image" }),
        h("figcaption", {}, t.image_task
          ? h("a", { href: "#/tasks/" + encodeURIComponent(t.image_task), id: "source-job" }, T.t("ops.source_job"))
          : T.t("ops.source_upload"))));
  }

  /** What was made from this job's image: each edit or cutout, linked, with its state. */
  function derived(t) {
    if (!t.derived || !t.derived.length) return null;
    return h("section", { id: "derived", "aria-labelledby": "derived-title" },
      h("h2", { id: "derived-title" }, T.t("ops.derived")),
      h("ul", {}, t.derived.map((d) => h("li", {},
        h("a", { href: "#/tasks/" + encodeURIComponent(d.id) }, T.t(`ops.op.${d.operation}`)),
        " — ", d.status === "succeeded" ? T.t("word.succeeded") : T.t(`state.${d.status}`)))));
  }

  /** One operation's form: a provider that offers it (with its price, said before the
      button), an instruction where the operation takes one, and the button. */
  function opForm(t, artifact, op, providers) {
    const able = providers.filter((p) => (p.operations || []).includes(op));
    const err = errorSlot(`${op}-error`);
    const title = h("h3", { id: `${op}-title` }, T.t(`ops.${op}.title`));
    if (!able.length) {
      return h("section", { class: "op", id: `${op}-form`, "aria-labelledby": `${op}-title` }, title,
        h("p", { class: "hint", id: `${op}-none` }, T.t(`ops.${op}.none`)));
    }
    const select = h("select", { id: `${op}-provider` },
      able.map((p) => h("option", { value: p.name }, p.name)));
    const chosen = () => able.find((p) => p.name === select.value) || able[0];
    if (able.some((p) => p.name === t.provider)) select.value = t.provider;
    const price = h("p", { class: "hint", id: `${op}-price`, "aria-live": "polite" });
    const button = h("button", { type: "button", id: `${op}-send` });
    const say = () => {
      const p = chosen();
      const kind = T.priceKind(p);
      const cost = T.priceWords(p, 1) || T.t("job.price_not_configured");
      price.textContent = kind === "free" ? T.tf("ops.price_free", { provider: p.name })
        : T.tf("ops.price", { provider: p.name, cost });
      button.textContent = kind === "free" ? T.t(`ops.${op}.send`)
        : T.tf("ops.send_cost", { what: T.t(`ops.${op}.send`), cost });
    };
    select.addEventListener("change", say);
    say();
    let text = null;
    if (op === "edit") {
      text = h("textarea", { id: "edit-instruction", rows: 2, maxlength: 8192, placeholder: T.t("ops.edit.placeholder") });
    }
    const key = T.newKey();
    button.addEventListener("click", async () => {
      const p = chosen();
      const instruction = text ? text.value.trim() : "";
      if (text && !instruction) {
        T.showError(err, T.t("ops.edit.empty"));
        text.focus();
        return;
      }
      if (T.priceKind(p) !== "free") {
        const cost = T.priceWords(p, 1) || T.t("job.price_not_configured");
        const yes = await T.confirmDialog(T.t(`ops.${op}.title`), T.tf("ops.confirm", { provider: p.name, cost }),
          T.tf("ops.send_cost", { what: T.t(`ops.${op}.send`), cost }));
        if (!yes) return;
      }
      await busy(button, err, async () => {
        const body = { operation: op, provider: p.name, image: { artifact }, idempotency_key: key };
        if (text) body.prompt = instruction;
        const n = await api("POST", "/v1/tasks", body);
        location.hash = "#/tasks/" + encodeURIComponent(n.id);
      });
    });
    const fields = [h("label", { for: `${op}-provider` }, T.t("ops.provider")), select];
    if (text) fields.unshift(h("label", { for: "edit-instruction" }, T.t("ops.edit.instruction")), text);
    return h("section", { class: "op", id: `${op}-form`, "aria-labelledby": `${op}-title` },
      title, h("div", { class: "fields" }, fields), price, h("div", { class: "actions" }, button), err);
  }

  /** The job page's operations section: the forms on a finished image, its lineage both ways. */
  function opsSection(t, providers) {
    const parts = [madeFrom(t)];
    const a = t.status === "succeeded" && (t.artifacts || [])[0];
    if (a) {
      parts.push(h("section", { id: "make-from", class: "make-from", "aria-labelledby": "make-from-title" },
        h("h2", { id: "make-from-title" }, T.t("ops.title")),
        opForm(t, a.id, "edit", providers || []),
        opForm(t, a.id, "cutout", providers || [])));
    }
    parts.push(derived(t));
    return parts.filter(Boolean);
  }

  T.opsSection = opsSection;
})(window.tally);
