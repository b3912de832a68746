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
    let t, ev;
    try { providers = (await T.loadProviders()).providers; } catch (e) { /* the price line then says less */ }
    try {
      [t, ev] = await Promise.all([api("GET", "/v1/tasks/" + encodeURIComponent(id)),
        api("GET", "/v1/tasks/" + encodeURIComponent(id) + "/events")]);
    } catch (e) {
      if (e.code === "signed_out") return;
      T.setView("task", id, "Job not found", [h("p", {}, h("a", { href: "#/" }, "← All jobs")), h("p", {}, e.message)], fresh);
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
      const m = e.kind === "retried" && /retried as task ([0-9a-f-]{20,})/.exec(e.message);
      if (m) return m[1];
    }
    return null;
  }

  function unknownExplainer(t) {
    return h("section", { id: "unknown-explainer", class: "unknown-box", "aria-labelledby": "unknown-title" },
      h("h2", { id: "unknown-title" }, h("span", { class: "icon", "aria-hidden": "true" }, "?"), " The outcome is unknown"),
      h("ul", {},
        h("li", {}, "The result cannot be confirmed: " + T.unknownCause(t) + "."),
        h("li", {}, "Automatic retries have stopped: tally will not send this job again on its own."),
        h("li", {}, "Generating again is a new operation that may be charged again.")),
      t.billing_note ? h("p", { id: "billing-note" }, h("strong", {}, "How " + t.provider + " bills: "), t.billing_note) : null,
      h("p", {}, "First look in " + t.provider + "'s dashboard and record below what you found. Only if the image is not there, generate again."),
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
      ? h("a", { href: "#/sets/" + encodeURIComponent(t.set_id), id: "back-to-set" }, "← Image set: " + (product || "back to the set"))
      : h("a", { href: "#/" }, "← All jobs")));
    const charge = T.chargeSentence(t);
    parts.push(h("p", { class: "status-line" }, badge(t.status), " ", h("span", { id: "task-message" }, T.sentence(t)),
      charge ? h("span", { id: "charge", class: "charge" }, charge) : null));
    if (retried && retried.id) {
      parts.push(h("p", { id: "retried-as", class: "note" }, "Retried as → ",
        h("a", { href: "#/tasks/" + encodeURIComponent(retried.id) }, "the new job"),
        retried.status ? " (" + (retried.status === "succeeded" ? "ready" : retried.status) + ")" : ""));
    }
    if (t.refused_before_sending) parts.push(refusalBox(t));
    if (t.status === "unknown") {
      parts.push(unknownExplainer(t));
      parts.push(T.resolveForm(t, "resolve-", () => showTask(t.id, false)));
    }
    for (const a of t.artifacts || []) {
      const alt = "Generated image: " + t.prompt;
      const img = h("img", { id: "task-image", src: a.url, alt, loading: "lazy" });
      const open = h("button", { type: "button", class: "image-button", "aria-label": "Enlarge the image" }, img);
      open.addEventListener("click", () => T.openImage(a.url, alt, null));
      parts.push(h("figure", { class: "image" }, open,
        h("figcaption", {}, h("a", { href: a.url, download: "", class: "button", id: "download-image" }, "Download the image"))));
    }
    parts.push(h("dl", { class: "facts" },
      h("dt", {}, "Prompt"), h("dd", { id: "task-prompt" }, t.prompt),
      h("dt", {}, "Provider"), h("dd", {}, t.provider),
      h("dt", {}, "Created"), h("dd", {}, time(t.created_at)),
      t.retry_of ? [h("dt", {}, "Retry of"), h("dd", {}, h("a", { href: "#/tasks/" + encodeURIComponent(t.retry_of) }, "the earlier job"))] : null));
    parts.push(actions(t, retried));
    parts.push(h("section", { class: "timeline", "aria-labelledby": "timeline-title" },
      h("h2", { id: "timeline-title" }, "What happened"),
      h("ol", { id: "timeline" }, events.map((e) => h("li", { class: "ev ev-" + e.kind }, time(e.at), " ", h("span", {}, eventSentence(e, t)))))));
    parts.push(technical(t, events));
    return h("article", { class: "detail s-" + t.status, "data-task-id": t.id, "data-status": t.status }, parts);
  }

  function actions(t, retried) {
    const box = h("div", { class: "actions" });
    const err = errorSlot("task-action-error");
    if (!T.SETTLED.includes(t.status) && !t.cancel_requested) {
      const cancel = h("button", { type: "button", id: "cancel-task" }, "Cancel job");
      cancel.addEventListener("click", () => busy(cancel, err, async () => {
        await api("POST", "/v1/tasks/" + encodeURIComponent(t.id) + "/cancel", {});
        await showTask(t.id, false);
      }));
      box.append(cancel);
    }
    if (t.held) {
      /* Held because the database was an older copy: the owner decides, knowing the cost. */
      const send = h("button", { type: "button", id: "release-held", class: "danger" }, "Send it again…");
      send.addEventListener("click", async () => {
        const yes = await T.confirmDialog("Send this job again?", t.held.reason + " " + t.held.note, "Send it again");
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
    const cost = T.priceWords(p, 1) || "price not configured";
    let hint = null;
    /* A request refused before sending is refused the same way again: no retry that cannot help. */
    const hopeless = t.refused_before_sending && !t.refused_before_sending.retry_helps;
    if (t.retry && t.retry.allowed && !hopeless) {
      const ack = t.retry.requires_cost_acknowledgement;
      const again = retried && retried.id ? " again" : "";
      const retry = h("button", { type: "button", id: "retry-task", class: ack ? "danger" : "" },
        ack ? "Generate" + again + " as a new job…" : "Retry" + again);
      retry.addEventListener("click", async () => {
        const n = await T.retry(t, retry, err);
        if (n && n.id) location.hash = "#/tasks/" + encodeURIComponent(n.id);
      });
      box.append(retry);
      hint = h("p", { id: "retry-price", class: "hint" }, "Trying again sends a new request to " + t.provider +
        ": " + (cost === "free" ? "free, " + t.provider + " never charges." : cost + "."));
    }
    if (t.status === "succeeded") {
      const another = h("button", { type: "button", id: "generate-another" }, "Generate another like this…");
      const key = T.newKey();
      const free = cost === "free";
      const shot = t.set_id && t.shot_index !== null && t.shot_index !== undefined;
      another.addEventListener("click", async () => {
        /* One more image may cost money: say what, and ask first (like retry). A shot's image gets
           one more candidate of that shot (it stays in the set and its zip); a loose job a new job. */
        const yes = await T.confirmDialog(shot ? "Generate another candidate?" : "Generate another like this?",
          (shot ? "This adds one more candidate image to this shot of the set. "
            : "This is a new job with the same prompt. ") + (free ? t.provider + " never charges: it is free."
            : cost.startsWith("about ") ? t.provider + " will charge " + cost + " for it."
              : t.provider + " may charge for it; tally does not know how much (" + cost + ")."),
          free ? "Generate" : "Generate (" + cost + ")");
        if (!yes) return;
        busy(another, err, async () => {
          if (shot) {
            await api("POST", "/v1/sets/" + encodeURIComponent(t.set_id) + "/shots/" + t.shot_index + "/candidates",
              { count: 1, acknowledge_possible_charge: true });
            location.hash = "#/sets/" + encodeURIComponent(t.set_id);
            return;
          }
          const n = await api("POST", "/v1/tasks", { prompt: t.prompt, provider: t.provider, idempotency_key: key });
          location.hash = "#/tasks/" + encodeURIComponent(n.id);
        });
      });
      box.append(another);
      hint = h("p", { id: "retry-hint", class: "hint" }, "Generating another is a new job with the same prompt: " +
        (free ? "free, " + t.provider + " never charges." : cost + "."));
    }
    if (hint) return h("div", { class: "next" }, box, hint, err);
    return h("div", { class: "next" }, box, err);
  }

  /** One entry of the history as a sentence for people. */
  function eventSentence(e, t) {
    const m = e.message || "";
    const who = t.provider;
    switch (e.kind) {
      case "submitted": return t.retry_of ? "You asked for it again, as a new job." : (t.set_id ? "Added as a shot of the image set." : "You asked for this image.");
      case "scheduled": return "Its turn in the set came.";
      case "busy": return "Waited for " + who + " to have room.";
      case "claimed": { const n = /attempt (\d+)/.exec(m); return n && n[1] !== "1" ? "Started try " + n[1] + "." : "Started."; }
      case "resumed": return "tally picked it up again after an interruption.";
      case "calling": return "Sent to " + who + ".";
      case "accepted": return who + " accepted it and is working on it.";
      case "succeeded": return "The image arrived and was saved.";
      case "failed": return t.refused_before_sending
        ? T.t("refused.event") + " " + refusalWords(t.refused_before_sending).problem
        : "It failed: " + T.failureWords(t);
      case "unknown": return "The outcome cannot be proven: " + T.unknownCause(t) + " — it may have been charged.";
      case "retry_scheduled": return "It will be tried again automatically.";
      case "canceled": return "Canceled before anything was sent.";
      case "cancel_requested": return "You asked to cancel; " + who + " was already working on it.";
      case "retried": return "You generated it again, as a new job.";
      case "resolved": {
        const note = /: (.*)$/.exec(m.replace(/^resolved as (succeeded with an image|failed)/, ""));
        const what = /succeeded/.test(m) ? "You recorded: found the image." : "You recorded: it failed.";
        return note ? what + " Your note: " + note[1] : what;
      }
      case "recovering": return "tally was interrupted and is finding out what happened.";
      case "late_result": return "A late answer arrived and settled the unknown outcome.";
      case "requeued": return "tally was interrupted before sending; it will start again (nothing was sent).";
      case "held": return "Held, not sent: the database was an older copy, and this job may have been sent already. " + m;
      case "released": return "You asked to send it again.";
      case "found_at_provider": return who + " shows it was sent already (by the daemon the copy came from): tally fetches its result, nothing is sent again.";
      case "looked_up": return "tally asked " + who + " whether it was sent already: " + m.replace(/^looked up at the provider: /, "");
      default: return "tally updated this job.";
    }
  }

  function technical(t, events) {
    const rows = [["Job id", t.id], ["Status", t.status], ["Message", t.message]];
    if (t.reason) rows.push(["Provider's or tally's words", t.reason]);
    if (t.failure_kind) rows.push(["Failure kind", t.failure_kind]);
    if (t.idempotency_key) rows.push(["Idempotency key", t.idempotency_key]);
    if (t.set_id) rows.push(["Set id", t.set_id]);
    rows.push(["Attempts", String(t.attempts)]);
    for (const a of t.artifacts || []) {
      rows.push(["Image id", a.id], ["sha256", a.sha256], ["Size", a.bytes + " bytes, " + a.media_type]);
    }
    return h("details", { class: "technical", id: "technical" },
      h("summary", {}, "Technical details"),
      h("dl", { class: "facts" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, h("code", {}, v))])),
      h("table", { class: "raw-events" },
        h("caption", {}, "The raw timeline"),
        h("thead", {}, h("tr", {}, ["Time", "Actor", "Kind", "Message", "Execution"].map((c) => h("th", { scope: "col" }, c)))),
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
    if (r.kind === "too_many_references" && !r.retry_helps && taken !== null && taken !== undefined && given) {
      if (taken === 0) return { problem: T.tf("refused.takes_none", { given }), fix: T.t("refused.fix_remove_all") };
      const problem = taken === 1 ? T.tf("refused.takes_one", { given }) : T.tf("refused.takes_max", { taken, given });
      return { problem, fix: T.tf("refused.fix_remove", { n: given - taken }) };
    }
    if (r.kind === "needs_references") return { problem: T.t("refused.needs"), fix: T.t("refused.fix_add") };
    return { problem: r.problem, fix: r.fix };
  }

  T.showTask = showTask;
  T.whereToLook = whereToLook;
  T.refusalWords = refusalWords;
  T.eventSentence = eventSentence;
})(window.tally);
