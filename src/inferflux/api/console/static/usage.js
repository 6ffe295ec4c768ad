// Usage: GET /v1/admin/usage?window=…&group_by=… (1 call per refresh, on demand).
import { get } from "./api.js";
import { fill, h, status, table } from "./dom.js";

export function usagePage(main) {
  const windowSel = h("select", { id: "us-window" }, ["5m", "1h", "24h"].map((w) => h("option", { value: w, selected: w === "1h" }, w)));
  const groupSel = h("select", { id: "us-group" },
    [["key,tenant,model", "key · tenant · model"], ["key", "key"], ["tenant", "tenant"], ["model", "model"]]
      .map(([v, t]) => h("option", { value: v }, t)));
  const out = h("div", { id: "us-table" });
  const chart = h("div", { id: "us-chart", class: "bars" });
  const line = status();

  async function refresh() {
    try {
      const data = await get(`/v1/admin/usage?window=${windowSel.value}&group_by=${groupSel.value}`);
      fill(out, table([
        ["Key", (r) => r.key ?? "·"],
        ["Tenant", (r) => r.tenant ?? "·"],
        ["Model", (r) => r.model ?? "·"],
        ["Requests", (r) => String(r.requests)],
        ["Prompt tokens", (r) => String(r.prompt_tokens)],
        ["Completion tokens", (r) => String(r.completion_tokens)],
        ["Total tokens", (r) => String(r.total_tokens)],
      ], data.data, { id: "us-rows" }));
      const peak = Math.max(1, ...data.series.map((m) => m.total_tokens));
      fill(chart, data.series.map((m) => {
        const bar = h("span", { class: "bar", title: `${new Date(m.minute * 1000).toLocaleTimeString()}: ${m.total_tokens} tokens, ${m.requests} requests` });
        bar.style.height = `${Math.max(2, (100 * m.total_tokens) / peak)}%`;
        return bar;
      }));
      line.ok(data.data.length ? "" : "No requests in this window.");
    } catch (err) { line.error(err); }
  }

  windowSel.addEventListener("change", refresh);
  groupSel.addEventListener("change", refresh);
  fill(main, h("h1", {}, "Usage"),
    h("p", { class: "muted" }, "Tokens and requests of this server process per key, tenant and model."),
    h("div", { class: "row" }, windowSel, groupSel, h("button", { type: "button", id: "us-refresh", onclick: refresh }, "Refresh")),
    line, h("h2", {}, "Tokens per minute"), chart, out);
  refresh();
}
