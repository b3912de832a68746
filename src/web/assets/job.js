/* tally's web page: one job — its image, what happened as sentences, what to do next (cancel,
   retry with the cost said first, "Generate another" asking first, send a held job again), for
   an unknown job what it means and where to look at the provider (`where_to_look`) with the
   form that records what was found, for a job refused before sending the reason and the fix
   with no retry that cannot help, and the technical details behind a disclosure. Uses core.js
   and the words jobs.js shares (T.sentence, T.unknownCause, T.failureWords). */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot, badge, time } = T;
  /** The configured providers (`GET /v1/providers`), for the price of one more request. */
  let providers = [];

  async function showTask(id, fresh) {
    const mine = T.ticket();
    let t, ev;
    try { providers = (await T.loadProviders()).providers; } catch (e) { /* the price line then says less */ }
    try {
      [t, ev] = await Promise.all([api("GET", "/v1/tasks/" + encodeURIComponent(id)),
        api("GET", "/v1/tasks/" + encodeURIComponent(id) + "/events")]);
    } catch (e) {
      if (e.code === "signed_out" || !T.latest(mine)) return;
      T.setView("task", id, T.t("job.not_found"), [h("p", {}, h("a", { href: "#/" }, T.t("job.all"))), h("p", {}, e.message)], fresh);
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
    /* A newer read is on its way: it draws. */
    if (!T.latest(mine)) return;
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
      /* The new job's id, in whatever language the line is in. */
      const m = e.kind === "retried" && /([0-9a-f]{8}-[0-9a-f-]{20,})/.exec(e.message);
      if (m) return m[1];
    }
    return null;
  }

  function unknownExplainer(t) {
    return h("section", { id: "unknown-explainer", class: "unknown-box", "aria-labelledby": "unknown-title" },
      h("h2", { id: "unknown-title" }, h("span", { class: "icon", "aria-hidden": "true" }, "?"), " " + T.t("unknown.title")),
      h("ul", {},
        h("li", {}, T.tf("unknown.cannot_confirm", { cause: T.unknownCause(t) })),
        h("li", {}, T.t("unknown.stopped")),
        h("li", {}, T.t("unknown.new_operation"))),
      t.billing_note ? h("p", { id: "billing-note" }, h("strong", {}, T.tf("unknown.bills", { provider: t.provider })), t.billing_note) : null,
      h("p", {}, T.tf("unknown.look_first", { provider: t.provider })),
      whereToLook(t, ""));
  }

  /** A job a check stopped before anything was sent: what was wrong, and the fix. */
  function refusalBox(t) {
    const r = t.refused_before_sending;
    const words = refusalWords(r);
    return h("section", { id: "refusal", class: "refusal-box", "aria-labelledby": "refusal-title" },
      h("h2", { id: "refusal-title" }, T.t("refused.title")),
      h("p", { id: "refusal-problem" }, words.problem.charAt(0).toUpperCase() + words.problem.slice(1)),
      h("p", { id: "refusal-fix" }, h("strong", {}, T.t("refused.fix") + " "), words.fix),
      r.retry_helps ? null : h("p", { class: "hint", id: "refusal-no-retry" }, T.t("refused.no_retry")));
  }

  function taskView(t, events, product, retried) {
    const parts = [];
    parts.push(h("p", { class: "back" }, t.set_id
      ? h("a", { href: "#/sets/" + encodeURIComponent(t.set_id), id: "back-to-set" },
        T.tf("job.back_to_set", { product: product || T.t("job.back_to_set_unnamed") }))
      : h("a", { href: "#/" }, T.t("job.all"))));
    const charge = T.chargeSentence(t);
    parts.push(h("p", { class: "status-line" }, badge(t.status), " ", h("span", { id: "task-message" }, T.sentence(t)),
      charge ? h("span", { id: "charge", class: "charge" }, charge) : null));
    if (retried && retried.id) {
      parts.push(h("p", { id: "retried-as", class: "note" }, T.t("job.retried_as"),
        h("a", { href: "#/tasks/" + encodeURIComponent(retried.id) }, T.t("job.the_new_job")),
        retried.status ? " (" + (retried.status === "succeeded" ? T.t("word.succeeded") : T.t(`state.${retried.status}`)) + ")" : ""));
    }
    if (t.refused_before_sending) parts.push(refusalBox(t));
    if (t.status === "unknown") {
      parts.push(unknownExplainer(t));
      parts.push(T.resolveForm(t, "resolve-", () => showTask(t.id, false)));
    }
    for (const a of t.artifacts || []) {
      const alt = T.tf("job.generated_image", { prompt: t.prompt });
      const img = h("img", { id: "task-image", src: a.url, alt, loading: "lazy" });
      const open = h("button", { type: "button", class: "image-button", "aria-label": T.t("job.enlarge") }, img);
      open.addEventListener("click", () => T.openImage(a.url, alt, null));
      parts.push(h("figure", { class: "image" }, open,
        h("figcaption", {}, h("a", { href: a.url, download: "", class: "button", id: "download-image" }, T.t("job.download_image")))));
    }
    parts.push(h("dl", { class: "facts" },
      t.operation && t.operation !== "generate"
        ? [h("dt", {}, T.t("job.fact_operation")), h("dd", { id: "task-operation" }, T.t(`ops.op.${t.operation}`))] : null,
      t.prompt ? [h("dt", {}, T.t("job.fact_prompt")), h("dd", { id: "task-prompt" }, t.prompt)] : null,
      h("dt", {}, T.t("job.fact_provider")), h("dd", {}, t.provider),
      h("dt", {}, T.t("job.fact_created")), h("dd", {}, time(t.created_at)),
      t.retry_of ? [h("dt", {}, T.t("job.fact_retry_of")), h("dd", {}, h("a", { href: "#/tasks/" + encodeURIComponent(t.retry_of) }, T.t("job.the_earlier_job")))] : null));
    parts.push(actions(t, retried));
    if (T.opsSection) parts.push(...T.opsSection(t, providers));
    parts.push(h("section", { class: "timeline", "aria-labelledby": "timeline-title" },
      h("h2", { id: "timeline-title" }, T.t("job.what_happened")),
      h("ol", { id: "timeline" }, events.map((e) => h("li", { class: "ev ev-" + e.kind }, time(e.at), " ", h("span", {}, eventSentence(e, t)))))));
    parts.push(technical(t, events));
    return h("article", { class: "detail s-" + t.status + (t.operation === "cutout" ? " cutout" : ""),
      "data-task-id": t.id, "data-status": t.status }, parts);
  }

  function actions(t, retried) {
    const box = h("div", { class: "actions" });
    const err = errorSlot("task-action-error");
    if (!T.SETTLED.includes(t.status) && !t.cancel_requested) {
      const cancel = h("button", { type: "button", id: "cancel-task" }, T.t("job.cancel"));
      cancel.addEventListener("click", () => busy(cancel, err, async () => {
        await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/cancel", {});
        await showTask(t.id, false);
      }));
      box.append(cancel);
    }
    if (t.held) {
      /* Held because the database was an older copy: the owner decides, knowing the cost. */
      const send = h("button", { type: "button", id: "release-held", class: "danger" }, T.t("job.send_again"));
      send.addEventListener("click", async () => {
        const yes = await T.confirmDialog(T.t("job.send_again_title"), t.held.reason + " " + t.held.note, T.t("job.send_again_yes"));
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
    const cost = T.priceWords(p, 1) || T.t("job.price_not_configured");
    /* What the code decides by: "free", "amount" or "unknown" (never the words above). */
    const kind = T.priceKind(p) || "unknown";
    let hint = null;
    /* A request refused before sending is refused the same way again: no retry that cannot help. */
    const hopeless = t.refused_before_sending && !t.refused_before_sending.retry_helps;
    if (t.retry && t.retry.allowed && !hopeless) {
      const ack = t.retry.requires_cost_acknowledgement;
      const again = retried && retried.id ? "_again" : "";
      const retry = h("button", { type: "button", id: "retry-task", class: ack ? "danger" : "" },
        T.t((ack ? "job.generate_new" : "job.retry") + again));
      retry.addEventListener("click", async () => {
        const n = await T.retry(t, retry, err, p);
        if (n && n.id) location.hash = "#/tasks/" + encodeURIComponent(n.id);
      });
      box.append(retry);
      hint = h("p", { id: "retry-price", class: "hint" }, kind === "free"
        ? T.tf("job.retry_price_free", { provider: t.provider })
        : T.tf("job.retry_price", { provider: t.provider, cost }));
    }
    if (t.status === "succeeded") {
      const another = h("button", { type: "button", id: "generate-another" }, T.t("job.another"));
      const key = T.newKey();
      const free = kind === "free";
      const shot = t.set_id && t.shot_index !== null && t.shot_index !== undefined;
      another.addEventListener("click", async () => {
        /* One more image may cost money: say what, and ask first (like retry). A shot's image gets
           one more candidate of that shot (it stays in the set and its zip); a loose job a new job. */
        const yes = await T.confirmDialog(shot ? T.t("another.title_candidate") : T.t("another.title"),
          (shot ? T.t("another.shot") : T.t("another.job")) + (free ? T.tf("another.free", { provider: t.provider })
            : kind === "amount" ? T.tf("another.cost", { provider: t.provider, cost })
              : T.tf("another.unknown", { provider: t.provider, cost })),
          free ? T.t("job.generate") : T.tf("another.yes_cost", { cost }));
        if (!yes) return;
        busy(another, err, async () => {
          if (shot) {
            await api("POST", "/v1/sets/" + encodeURIComponent(t.set_id) + "/shots/" + t.shot_index + "/candidates",
              { count: 1, acknowledge_possible_charge: true });
            location.hash = "#/sets/" + encodeURIComponent(t.set_id);
            return;
          }
          /* The same operation on the same image for an edit or a cutout. */
          const body = { provider: t.provider, idempotency_key: key };
          if (t.prompt) body.prompt = t.prompt;
          if (t.operation && t.operation !== "generate") Object.assign(body, { operation: t.operation, image: t.image });
          const n = await api("POST", "/v1/tasks", body);
          location.hash = "#/tasks/" + encodeURIComponent(n.id);
        });
      });
      box.append(another);
      hint = h("p", { id: "retry-hint", class: "hint" }, free
        ? T.tf("another.hint_free", { provider: t.provider })
        : T.tf("another.hint", { cost }));
    }
    if (hint) return h("div", { class: "next" }, box, hint, err);
    return h("div", { class: "next" }, box, err);
  }

  /** One entry of the history as a sentence for people, in the page's language (the
      catalogue's `event.*`); the daemon's own line for it is under "Technical details". */
  function eventSentence(e, t) {
    const m = e.message || "";
    const p = { provider: t.provider };
    switch (e.kind) {
      case "submitted": return T.t(t.retry_of ? "event.submitted_retry" : (t.set_id ? "event.submitted_shot" : "event.submitted"));
      case "scheduled": return T.t("event.scheduled");
      case "busy": return T.tf("event.busy", p);
      case "claimed": { const n = /(\d+)/.exec(m); return n && n[1] !== "1" ? T.tf("event.claimed_try", { n: n[1] }) : T.t("event.claimed"); }
      case "resumed": return T.t("event.resumed");
      case "calling": return T.tf("event.calling", p);
      case "accepted": return T.tf("event.accepted", p);
      case "succeeded": return T.t("event.succeeded");
      case "failed": return t.refused_before_sending
        ? T.t("refused.event") + " " + refusalWords(t.refused_before_sending).problem
        : T.tf("event.failed", { why: T.failureWords(t) });
      case "unknown": return T.tf("event.unknown", { cause: T.unknownCause(t) });
      case "retry_scheduled": return T.t("event.retry_scheduled");
      case "canceled": return T.t("event.canceled");
      case "cancel_requested": return T.tf("event.cancel_requested", p);
      case "retried": return T.t("event.retried");
      case "resolved": {
        /* The owner's note: after "resolved as succeeded with an image: " or "resolved as
           failed: " in the stored line, which the API may have translated ("："). */
        const note = /[:：] ?(.*)$/.exec(m.replace(/^(resolved as (succeeded with an image|failed)|手动处理为(成功，并附上了图片|失败))/, ""));
        const what = T.t(/succeeded|成功/.test(m) ? "event.resolved_found" : "event.resolved_failed");
        return note ? T.tf("event.note", { what, note: note[1] }) : what;
      }
      case "recovering": return T.t("event.recovering");
      case "late_result": return T.t("event.late_result");
      case "requeued": return T.t("event.requeued");
      case "held": return T.tf("event.held", { why: m });
      case "released": return T.t("event.released");
      case "found_at_provider": return T.tf("event.found_at_provider", p);
      case "looked_up": return T.tf("event.looked_up", { provider: t.provider, found: m.replace(/^looked up at the provider: /, "") });
      default: return T.t("event.other");
    }
  }

  function technical(t, events) {
    const rows = [[T.t("tech.job_id"), t.id], [T.t("tech.status"), t.status], [T.t("tech.message"), t.message]];
    if (t.reason) rows.push([T.t("tech.words"), t.reason]);
    if (t.failure_kind) rows.push([T.t("tech.failure_kind"), t.failure_kind]);
    if (t.idempotency_key) rows.push([T.t("tech.idempotency_key"), t.idempotency_key]);
    if (t.set_id) rows.push([T.t("tech.set_id"), t.set_id]);
    rows.push([T.t("tech.attempts"), String(t.attempts)]);
    for (const a of t.artifacts || []) {
      rows.push([T.t("tech.image_id"), a.id], ["sha256", a.sha256], [T.t("tech.size"), T.tf("tech.size_value", { bytes: a.bytes, type: a.media_type })]);
    }
    return h("details", { class: "technical", id: "technical" },
      h("summary", {}, T.t("tech.summary")),
      h("dl", { class: "facts" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, h("code", {}, v))])),
      h("table", { class: "raw-events" },
        h("caption", {}, T.t("tech.raw")),
        h("thead", {}, h("tr", {}, [T.t("tech.time"), T.t("tech.actor"), T.t("tech.kind"), T.t("tech.message"), T.t("tech.execution")].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, events.map((e) => h("tr", {}, h("td", {}, time(e.at)), h("td", {}, e.actor), h("td", {}, e.kind),
          h("td", {}, e.message), h("td", {}, h("code", {}, e.execution || "")))))));
  }

  /** Where to look for an unknown job at the provider (the task's `where_to_look`): a link to
      the provider's page (or that it has none), what the page shows, and the details to match
      the request by. `prefix` keeps ids unique when a dialog shows it too. */
  function whereToLook(task, prefix) {
    const w = task.where_to_look;
    if (!w) return null;
    const id = (s) => (prefix || "") + s;
    /* The page's own words for a page it knows (its catalogue), else the API's. */
    const known = (kind, fallback) => {
      const key = "where." + kind + "." + w.page;
      const v = T.t(key);
      return v !== key ? v : fallback;
    };
    const label = known("label", w.label);
    const how = known("how", w.how);
    const link = w.url
      ? h("p", {}, h("a", { id: id("where-to-look-link"), class: "button", href: w.url, target: "_blank", rel: "noopener noreferrer" },
        T.tf("where.open", { page: label }), h("span", { "aria-hidden": "true" }, " ↗"),
        h("span", { class: "visually-hidden" }, " " + T.t("where.new_tab"))))
      : h("p", { id: id("where-to-look-none") }, T.t("where.none"));
    const rows = (w.match_by || []).map((m) => [
      h("dt", {}, ({ request_id: T.t("match.request_id"), sent_at: T.t("match.sent_at"), model: T.t("match.model"),
        prompt: T.t("match.prompt") })[m.what] || m.label),
      h("dd", { "data-what": m.what }, m.what === "sent_at" ? [time(m.value), " (" + m.value + ")"]
        : m.what === "request_id" ? h("code", {}, m.value) : m.value)]);
    return h("section", { id: id("where-to-look"), class: "where", "aria-labelledby": id("where-title") },
      h("h3", { id: id("where-title") }, T.t("where.title")),
      link,
      h("p", { class: "hint" }, how),
      rows.length ? [h("p", { class: "hint" }, T.t("where.match")), h("dl", { class: "facts", id: id("match-by") }, rows)] : null);
  }

  /** A job refused before anything was sent (`refused_before_sending`): what was wrong and the
      fix, in the page's language when tally knows the kind of refusal. */
  function refusalWords(r) {
    const taken = r.references_taken;
    const given = r.references_given;
    /* Once the set's photos were changed to a number the model takes (`retry_helps`), the
       fix is the API's: generate it again. */
    if (r.kind === "too_many_references" && taken !== null && taken !== undefined && given &&
      (!r.retry_helps || (typeof r.references_now === "number" && r.references_now <= taken))) {
      const fixed = r.retry_helps ? r.fix : null;
      if (taken === 0) return { problem: T.tf("refused.takes_none", { given }), fix: fixed || T.t("refused.fix_remove_all") };
      const problem = taken === 1 ? T.tf("refused.takes_one", { given }) : T.tf("refused.takes_max", { taken, given });
      return { problem, fix: fixed || T.tf("refused.fix_remove", { n: given - taken }) };
    }
    if (r.kind === "needs_references") return { problem: T.t("refused.needs"), fix: r.retry_helps ? r.fix : T.t("refused.fix_add") };
    return { problem: r.problem, fix: r.fix };
  }

  T.showTask = showTask;
  T.whereToLook = whereToLook;
  T.refusalWords = refusalWords;
  T.eventSentence = eventSentence;
})(window.tally);
