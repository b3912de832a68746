/* tally's budget in the page: "Today $0.38 of $0.40 · this month $3.10 of $20", per provider
   too, where the limits come from (the config file, or set here), and a form that sets, raises
   or removes a daily or monthly limit for all providers or one (PUT /v1/budget; stored by the
   daemon, so it survives a restart). Uses core.js (window.tally). */
(function (T) {
  "use strict";
  const h = T.h;

  /** "$0.38 of $0.40" or "$0.38 (no limit)". */
  function used(spent, limit, cur) {
    const s = T.money(spent || 0, cur);
    return limit === null || limit === undefined ? s + " " + T.t("budget.no_limit") : s + " " + T.t("budget.of") + " " + T.money(limit, cur);
  }

  /** The whole daemon's line: "Today $0.38 of $0.40 · this month $3.10 of $20". */
  function line(b) {
    return T.t("budget.today") + " " + used(b.spent_today, b.daily, b.currency) + " · " + T.t("budget.this_month") + " " + used(b.spent_this_month, b.monthly, b.currency);
  }

  /** Where the limits in force come from, in words. */
  function sourceWords(b) {
    return T.t(b.source === "set" ? "budget.source_set" : "budget.source_config");
  }

  /** One line for the top of the jobs page, or nothing when no limit is set. */
  async function budgetLine() {
    const p = h("p", { id: "budget-line", class: "hint" });
    try {
      const b = await T.api("GET", "/v1/budget");
      const any = b.daily !== null || b.monthly !== null ||
        Object.values(b.providers || {}).some((x) => x.daily !== null || x.monthly !== null);
      if (!any) return null;
      p.append(T.t("budget.line_label") + " " + line(b) + " ", h("a", { href: "#/spend" }, T.t("budget.change")));
      return p;
    } catch (e) {
      return null;
    }
  }

  /** The budget section of the Spend view; `reload` redraws the view after a change. */
  async function budgetSection(reload) {
    let b;
    try {
      b = await T.api("GET", "/v1/budget");
    } catch (e) {
      if (e.code === "signed_out") return null;
      return h("section", { class: "card", id: "budget" }, h("h2", {}, T.t("budget.title")),
        h("p", { class: "hint" }, e.status === 404 ? T.t("budget.unavailable") : e.message));
    }
    const names = Object.keys(b.providers || {});
    const rows = [h("li", { id: "budget-all" }, line(b))];
    for (const n of names) {
      const p = b.providers[n];
      if (p.daily === null && p.monthly === null && !p.spent_this_month) continue;
      rows.push(h("li", { "data-provider": n }, T.tf("budget.provider_line", { provider: n,
        today: used(p.spent_today, p.daily, p.currency), month: used(p.spent_this_month, p.monthly, p.currency) })));
    }
    const scope = h("select", { id: "budget-scope" },
      h("option", { value: "" }, T.t("budget.all")), names.map((n) => h("option", { value: n }, n)));
    const daily = h("input", { id: "budget-daily", type: "number", min: "0", step: "0.01", inputmode: "decimal" });
    const monthly = h("input", { id: "budget-monthly", type: "number", min: "0", step: "0.01", inputmode: "decimal" });
    const fill = () => {
      const x = scope.value ? b.providers[scope.value] : b;
      daily.value = x && x.daily !== null && x.daily !== undefined ? String(x.daily) : "";
      monthly.value = x && x.monthly !== null && x.monthly !== undefined ? String(x.monthly) : "";
    };
    scope.addEventListener("change", fill);
    fill();
    const save = h("button", { type: "submit", id: "budget-save", class: "primary" }, T.t("budget.save"));
    const err = T.errorSlot("budget-error");
    const amount = (input, key) => {
      const v = input.value.trim();
      if (!v) return null;
      const n = Number(v);
      if (!isFinite(n) || n < 0) throw new Error(T.t(key));
      return n;
    };
    const form = h("form", { id: "budget-form", novalidate: true },
      h("label", { for: "budget-scope" }, T.t("budget.scope")), scope,
      h("div", { class: "inline" },
        h("span", { class: "grow" }, h("label", { for: "budget-daily" }, T.t("budget.daily") + " (" + b.currency + ", " + T.t("budget.empty_none") + ")"), daily),
        h("span", { class: "grow" }, h("label", { for: "budget-monthly" }, T.t("budget.monthly") + " (" + b.currency + ", " + T.t("budget.empty_none") + ")"), monthly)),
      h("div", { class: "actions" }, save), err);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      T.busy(save, err, async () => {
        const limits = { daily: amount(daily, "budget.bad_daily"), monthly: amount(monthly, "budget.bad_monthly") };
        const body = scope.value ? { providers: { [scope.value]: limits } } : limits;
        await T.api("PUT", "/v1/budget", body);
        await reload();
      });
    });
    const parts = [h("h2", { id: "budget-title" }, T.t("budget.title")), h("ul", { id: "budget-summary", class: "plain" }, rows),
      h("p", { id: "budget-source", class: "hint" }, sourceWords(b)),
      h("p", { class: "hint" }, T.tf("budget.counts", { zone: b.time_zone || "UTC" })),
      form];
    if (b.source === "set") {
      const reset = h("button", { type: "button", id: "budget-reset" }, T.t("budget.reset"));
      const rerr = T.errorSlot("budget-reset-error");
      reset.addEventListener("click", () => T.busy(reset, rerr, async () => {
        await T.api("DELETE", "/v1/budget");
        await reload();
      }));
      parts.push(h("div", { class: "actions" }, reset), rerr);
    }
    return h("section", { class: "card", id: "budget", "aria-labelledby": "budget-title" }, parts);
  }

  T.budgetLine = budgetLine;
  T.budgetSection = budgetSection;
})(window.tally);
