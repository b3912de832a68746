/* tally's web page: Settings — the providers, added, changed, tested and removed without a
   terminal (issue #40). Each provider shows its kind, where it is defined (the config file's
   are read-only: "defined in tally.toml"), its price and its key's last four characters,
   never the key. "Test" makes only a free call and says what it found. A change applies at
   once (the next job uses it); removing one with jobs in flight is refused with the reason.
   Uses core.js. */
"use strict";

(function (T) {
  const { h, api, busy, errorSlot } = T;

  function field(id, label, input, hint) {
    return h("div", { class: "field" }, h("label", { for: id }, label), input,
      hint ? h("p", { class: "hint", id: id + "-hint" }, hint) : null);
  }

  /** One provider: what it is, and (for one added here) its price, key, test and removal. */
  function providerCard(p, refresh) {
    const err = errorSlot(`provider-error-${p.name}`);
    const result = h("p", { class: "hint", id: `provider-test-${p.name}`, "aria-live": "polite" });
    const test = h("button", { type: "button", id: `provider-test-button-${p.name}` }, T.t("settings.test"));
    test.addEventListener("click", () => busy(test, err, async () => {
      result.textContent = "";
      const r = await api("POST", "/v1/providers/" + encodeURIComponent(p.name) + "/test", {});
      result.textContent = r.message;
    }));
    const price = T.priceWords(p, 1) || T.t("job.price_not_configured");
    const facts = h("dl", { class: "facts" },
      h("dt", {}, T.t("settings.kind")), h("dd", {}, p.kind),
      p.model ? [h("dt", {}, T.t("settings.model")), h("dd", {}, p.model)] : null,
      h("dt", {}, T.t("settings.price")), h("dd", { id: `provider-price-${p.name}` }, price),
      h("dt", {}, T.t("settings.key")), h("dd", { id: `provider-key-${p.name}` }, p.api_key_hint
        ? T.tf("settings.key_hint", { hint: p.api_key_hint })
        : p.api_key_env ? T.tf("settings.key_env", { name: p.api_key_env }) : T.t("settings.key_none")),
      h("dt", {}, T.t("settings.defined")), h("dd", { id: `provider-defined-${p.name}` },
        p.defined_in === "page" ? T.t("settings.defined_page") : T.t("settings.defined_config")));
    const parts = [h("h2", { id: `provider-title-${p.name}` }, p.name), facts];
    if (p.defined_in === "page") {
      const amount = h("input", { type: "number", id: `provider-new-price-${p.name}`, min: "0", step: "0.001",
        inputmode: "decimal", value: p.price_per_image ?? "" });
      const key = h("input", { type: "password", id: `provider-new-key-${p.name}`, autocomplete: "off" });
      const save = h("button", { type: "button", id: `provider-save-${p.name}` }, T.t("settings.save"));
      save.addEventListener("click", () => busy(save, err, async () => {
        const body = {};
        if (amount.value !== "") body.price_per_image = Number(amount.value);
        if (key.value.trim()) body.api_key = key.value.trim();
        await api("PATCH", "/v1/providers/" + encodeURIComponent(p.name), body);
        T.forgetProviders();
        await refresh();
      }));
      const remove = h("button", { type: "button", class: "danger", id: `provider-remove-${p.name}` }, T.t("settings.remove"));
      remove.addEventListener("click", async () => {
        const yes = await T.confirmDialog(T.tf("settings.remove_title", { name: p.name }), T.t("settings.remove_body"),
          T.t("settings.remove"));
        if (!yes) return;
        await busy(remove, err, async () => {
          await api("DELETE", "/v1/providers/" + encodeURIComponent(p.name));
          T.forgetProviders();
          await refresh();
        });
      });
      parts.push(h("div", { class: "fields" },
        field(`provider-new-price-${p.name}`, T.tf("settings.new_price", { currency: p.currency || "USD" }), amount),
        field(`provider-new-key-${p.name}`, T.t("settings.new_key"), key, T.t("settings.new_key_hint"))),
        h("div", { class: "actions" }, save, test, remove));
    } else {
      parts.push(h("p", { class: "hint" }, T.t("settings.read_only")), h("div", { class: "actions" }, test));
    }
    parts.push(result, err);
    return h("section", { class: "card provider", id: `provider-${p.name}`, "aria-labelledby": `provider-title-${p.name}` }, parts);
  }

  /** The form that adds a provider (its key goes to the data directory's secrets file). */
  function addForm(kinds, refresh) {
    const err = errorSlot("add-provider-error");
    const name = h("input", { type: "text", id: "new-provider-name", autocomplete: "off", required: true });
    const kind = h("select", { id: "new-provider-kind" },
      kinds.filter((k) => k.bills).map((k) => h("option", { value: k.name }, k.name)));
    const model = h("input", { type: "text", id: "new-provider-model", autocomplete: "off" });
    const base = h("input", { type: "url", id: "new-provider-base-url", autocomplete: "off", placeholder: "https://" });
    const price = h("input", { type: "number", id: "new-provider-price", min: "0", step: "0.001", inputmode: "decimal" });
    const currency = h("input", { type: "text", id: "new-provider-currency", value: "USD", maxlength: 3, autocomplete: "off" });
    const console_ = h("input", { type: "url", id: "new-provider-dashboard", autocomplete: "off", placeholder: "https://" });
    const key = h("input", { type: "password", id: "new-provider-key", autocomplete: "off" });
    const add = h("button", { type: "button", id: "add-provider" }, T.t("settings.add"));
    add.addEventListener("click", () => busy(add, err, async () => {
      const body = { name: name.value.trim(), kind: kind.value };
      if (model.value.trim()) body.model = model.value.trim();
      if (base.value.trim()) body.base_url = base.value.trim();
      if (price.value !== "") body.price_per_image = Number(price.value);
      if (currency.value.trim()) body.currency = currency.value.trim();
      if (console_.value.trim()) body.dashboard_url = console_.value.trim();
      if (key.value.trim()) body.api_key = key.value.trim();
      await api("POST", "/v1/providers", body);
      key.value = "";
      T.forgetProviders();
      await refresh();
    }));
    return h("section", { class: "card", id: "add-provider-form", "aria-labelledby": "add-provider-title" },
      h("h2", { id: "add-provider-title" }, T.t("settings.add_title")),
      h("div", { class: "fields" },
        field("new-provider-name", T.t("settings.name"), name),
        field("new-provider-kind", T.t("settings.kind"), kind),
        field("new-provider-model", T.t("settings.model"), model),
        field("new-provider-base-url", T.t("settings.base_url"), base, T.t("settings.base_url_hint")),
        field("new-provider-price", T.t("settings.price_each"), price),
        field("new-provider-currency", T.t("settings.currency"), currency),
        field("new-provider-dashboard", T.t("settings.dashboard"), console_, T.t("settings.dashboard_hint")),
        field("new-provider-key", T.t("settings.api_key"), key, T.t("settings.api_key_hint"))),
      h("div", { class: "actions" }, add), err);
  }

  /** "Use it on your phone": a one-time pairing QR code, its link and short code. */
  function phoneCard() {
    const err = errorSlot("pair-error");
    const out = h("div", { id: "pair-result", "aria-live": "polite" });
    const make = h("button", { type: "button", id: "pair-make" }, T.t("settings.pair_make"));
    make.addEventListener("click", () => busy(make, err, async () => {
      const p = await api("POST", "/v1/session/pair", {});
      out.replaceChildren(
        h("img", { class: "pair-qr", id: "pair-qr", width: "240", height: "240", alt: T.t("settings.pair_qr_alt"),
          src: "data:image/svg+xml;charset=utf-8," + encodeURIComponent(p.svg) }),
        h("p", {}, T.t("settings.pair_code"), " ", h("strong", { id: "pair-code-shown", class: "pair-code" }, p.code)),
        h("p", { class: "hint" }, T.t("settings.pair_link"), " ", h("code", { id: "pair-link" }, p.url)),
        h("p", { class: p.lan ? "hint" : "warn", id: "pair-hint" }, p.hint));
    }));
    return h("section", { class: "card", id: "phone", "aria-labelledby": "phone-title" },
      h("h2", { id: "phone-title" }, T.t("settings.pair_title")),
      h("p", { class: "hint" }, T.t("settings.pair_intro")),
      h("div", { class: "actions" }, make), out, err);
  }

  /** "Signed-in devices": every browser session, its device and last use, each with Sign out. */
  async function devicesCard() {
    const err = errorSlot("devices-error");
    const list = h("ul", { class: "devices", id: "devices" });
    const card = h("section", { class: "card", id: "signed-in-devices", "aria-labelledby": "devices-title" },
      h("h2", { id: "devices-title" }, T.t("settings.devices_title")), list, err);
    async function draw() {
      const r = await api("GET", "/v1/sessions");
      list.replaceChildren(...(r.sessions || []).map((s, i) => {
        const name = s.device || T.t("settings.device_unnamed");
        const out = h("button", { type: "button", class: "danger", id: `device-end-${i}`, "data-session": s.id },
          s.current ? T.t("settings.device_end_self") : T.t("settings.device_end"));
        out.addEventListener("click", () => busy(out, err, async () => {
          await api("DELETE", "/v1/sessions/" + encodeURIComponent(s.id));
          if (s.current) { location.reload(); return; }
          await draw();
        }));
        return h("li", { class: "device", id: `device-${i}` },
          h("strong", {}, name), s.current ? [" ", h("span", { class: "hint" }, T.t("settings.device_this"))] : null,
          h("p", { class: "hint" }, T.t("settings.device_last_used"), " ", T.time(s.last_used_at)), out);
      }));
    }
    try { await draw(); } catch (e) { err.textContent = e.message; err.hidden = false; }
    return card;
  }

  /** "The shop's time zone": where budget days begin and whose times the page shows. The
      choices are the browser's IANA zones (the daemon checks the name); "use the computer's"
      goes back to the configuration's. The page reloads after a change, so every time in it
      is shown in the new zone. */
  async function zoneCard() {
    const err = errorSlot("time-zone-error");
    const card = h("section", { class: "card", id: "time-zone", "aria-labelledby": "time-zone-title" },
      h("h2", { id: "time-zone-title" }, T.t("settings.zone_title")));
    let z;
    try {
      z = await api("GET", "/v1/time-zone");
    } catch (e) {
      err.textContent = e.message; err.hidden = false;
      card.append(err);
      return card;
    }
    let names = [];
    try { names = Intl.supportedValuesOf("timeZone"); } catch (_) { names = []; }
    if (!names.includes(z.time_zone) && z.time_zone !== "local") names = [z.time_zone, ...names];
    if (!names.includes("UTC")) names = [...names, "UTC"];
    const pick = names.length > 1
      ? h("select", { id: "time-zone-name" }, names.map((n) => h("option", { value: n, selected: n === z.time_zone }, n)))
      : h("input", { id: "time-zone-name", type: "text", value: z.time_zone, autocomplete: "off", spellcheck: "false" });
    const save = h("button", { type: "submit", id: "time-zone-save", class: "primary" }, T.t("settings.zone_save"));
    const form = h("form", { id: "time-zone-form", novalidate: true },
      field("time-zone-name", T.t("settings.zone_label"), pick, T.t("settings.zone_hint")),
      h("div", { class: "actions" }, save));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      busy(save, err, async () => {
        await api("PUT", "/v1/time-zone", { time_zone: pick.value.trim() });
        location.reload();
      });
    });
    card.append(
      h("p", { id: "time-zone-now" }, T.tf("settings.zone_now", { zone: z.time_zone, time: T.time(z.now).textContent })),
      h("p", { class: "hint", id: "time-zone-source" },
        z.source === "set" ? T.t("settings.zone_source_set") : T.tf("settings.zone_source_config", { zone: z.configured })),
      form);
    if (z.source === "set") {
      const reset = h("button", { type: "button", id: "time-zone-reset" }, T.tf("settings.zone_reset", { zone: z.configured }));
      reset.addEventListener("click", () => busy(reset, err, async () => {
        await api("DELETE", "/v1/time-zone");
        location.reload();
      }));
      card.append(h("div", { class: "actions" }, reset));
    }
    card.append(err);
    return card;
  }

  /** The database file: the background check `tally serve` runs after start-up (`check` in
      /healthz: not_run, running, passed or failed). */
  async function dbCheckCard() {
    const card = h("section", { class: "card", id: "db-check", "aria-labelledby": "db-check-title" },
      h("h2", { id: "db-check-title" }, T.t("settings.check_title")));
    let c = null;
    try {
      const r = await fetch("/healthz", { credentials: "same-origin" });
      c = (await r.json()).check || null;
    } catch (_) { c = null; }
    const at = (ms) => (ms ? T.time(new Date(ms).toISOString()).textContent : "");
    const state = !c ? "" : c.state === "running" ? T.tf("settings.check_running", { time: at(c.started_at) })
      : c.state === "passed" ? T.tf("settings.check_passed", { time: at(c.finished_at) })
      : c.state === "failed" ? T.tf("settings.check_failed", { time: at(c.finished_at), problem: (c.problems || [])[0] || "" })
      : T.t("settings.check_not_run");
    card.append(h("p", { id: "db-check-state", "data-state": c ? c.state : "" }, state),
      h("p", { class: "hint" }, T.t("settings.check_hint")));
    return card;
  }

  async function showSettings(fresh) {
    let r;
    try {
      r = await api("GET", "/v1/providers");
    } catch (e) {
      if (e.code === "signed_out") return;
      T.setView("settings", null, T.t("settings.title"), [h("p", {}, e.message)], fresh);
      return;
    }
    const refresh = () => showSettings(false);
    T.setView("settings", null, T.t("settings.title"), [
      phoneCard(),
      await devicesCard(),
      await zoneCard(),
      await dbCheckCard(),
      h("p", { class: "hint" }, T.t("settings.intro")),
      ...(r.providers || []).map((p) => providerCard(p, refresh)),
      addForm(r.kinds || [], refresh),
    ], fresh);
  }

  T.showSettings = showSettings;
})(window.tally);
