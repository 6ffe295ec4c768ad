// Keys, tenants, rate limits, guardrails: the /v1/admin API, one call per action; a
// refresh is 4 GETs (api_keys, tenants, rate_limit, guardrails). The API validates every
// change (its 400/422 message is shown as it is).
import { del, get, post, put } from "./api.js";
import { field, fill, h, status, table } from "./dom.js";

const SCOPES = ["generate", "read", "admin", "adapter-manager"];

function date(unix) {
  return unix ? new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19) : "–";
}

export function keysPage(main) {
  const line = status();
  const keys = h("div", { id: "keys-table" });
  const tenants = h("div", { id: "tenants-table" });
  const secret = h("div", { id: "key-secret" });
  const limits = h("textarea", { id: "limits-json", rows: 8, class: "mono" });
  const guardrails = h("textarea", { id: "guardrails-json", rows: 8, class: "mono" });
  const name = h("input", { id: "key-name", placeholder: "name" });
  const tenant = h("input", { id: "key-tenant", value: "default" });
  const scopeBoxes = SCOPES.map((s) => h("input", { type: "checkbox", value: s, id: `key-scope-${s}`, checked: s === "generate" }));
  const tenantName = h("input", { id: "tenant-name", placeholder: "tenant name" });

  const act = (label, fn) => async () => {
    line.busy(`${label}…`);
    try { await fn(); line.ok(`${label}: done.`); await refresh(); } catch (err) { line.error(err); }
  };

  function showSecret(created) {
    fill(secret, h("div", { class: "card secret" },
      h("strong", {}, `New key ${created.id} — copy it now, it is shown this once:`),
      h("code", { id: "key-secret-value" }, created.key)));
  }

  async function refresh() {
    const [k, t, r, g] = await Promise.all([
      get("/v1/admin/api_keys"), get("/v1/admin/tenants"), get("/v1/admin/rate_limit"), get("/v1/admin/guardrails"),
    ]);
    fill(keys, table([
      ["Id", (x) => x.id], ["Name", (x) => x.name], ["Tenant", (x) => x.tenant],
      ["Scopes", (x) => x.scopes.join(", ")], ["Created", (x) => date(x.created_at)],
      ["State", (x) => (x.revoked ? "revoked" : "active")], ["Source", (x) => x.source],
      ["", (x) => (x.revoked || x.source !== "store" ? "" : h("span", { class: "row" },
        h("button", { type: "button", class: "rotate", "data-key": x.id, onclick: act(`Rotate ${x.id}`, async () => showSecret(await post(`/v1/admin/api_keys/${encodeURIComponent(x.id)}/rotate`))) }, "Rotate"),
        h("button", { type: "button", class: "danger revoke", "data-key": x.id, onclick: act(`Revoke ${x.id}`, () => del(`/v1/admin/api_keys/${encodeURIComponent(x.id)}`)) }, "Revoke")))],
    ], k.data, { id: "keys-rows" }));
    fill(tenants, table([
      ["Tenant", (x) => x.name ?? x.tenant], ["Active keys", (x) => String(x.num_active_keys ?? "–")],
      ["Priority cap", (x) => x.priority_cap ?? "–"], ["Models", (x) => (x.allowed_models ? x.allowed_models.join(", ") : "all")],
      ["", (x) => h("button", { type: "button", class: "danger", onclick: act(`Delete tenant ${x.name ?? x.tenant}`, () => del(`/v1/admin/tenants/${encodeURIComponent(x.name ?? x.tenant)}`)) }, "Delete")],
    ], t.data, { id: "tenants-rows" }));
    limits.value = JSON.stringify(r, null, 2);
    guardrails.value = JSON.stringify(g, null, 2);
  }

  const createKey = act("Create key", async () => {
    const scopes = scopeBoxes.filter((b) => b.checked).map((b) => b.value);
    showSecret(await post("/v1/admin/api_keys", { name: name.value, tenant: tenant.value, scopes }));
  });
  const parse = (area, what) => { try { return JSON.parse(area.value); } catch (err) { throw new Error(`${what}: ${err.message}`); } };

  fill(main, h("h1", {}, "Keys, tenants and limits"), line, secret,
    h("section", { class: "card" }, h("h2", {}, "API keys"),
      h("div", { class: "row" }, field("Name", name), field("Tenant", tenant),
        h("span", { class: "scopes" }, scopeBoxes.map((b) => h("label", { class: "check" }, b, ` ${b.value}`))),
        h("button", { type: "button", id: "key-create", onclick: createKey }, "Create key")),
      keys),
    h("section", { class: "card" }, h("h2", {}, "Tenants"),
      h("div", { class: "row" }, tenantName,
        h("button", { type: "button", id: "tenant-create", onclick: act("Create tenant", () => post("/v1/admin/tenants", { name: tenantName.value })) }, "Create tenant")),
      tenants),
    h("div", { class: "columns" },
      h("section", { class: "card" }, h("h2", {}, "Rate limits"), limits,
        h("button", { type: "button", id: "limits-save", onclick: act("Save rate limits", () => put("/v1/admin/rate_limit", parse(limits, "Rate limits"))) }, "Save")),
      h("section", { class: "card" }, h("h2", {}, "Guardrails"), guardrails,
        h("button", { type: "button", id: "guardrails-save", onclick: act("Save guardrails", () => put("/v1/admin/guardrails", parse(guardrails, "Guardrails"))) }, "Save"))));
  refresh().catch((err) => line.error(err));
}
