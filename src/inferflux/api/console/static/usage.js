// Usage: GET /v1/admin/usage?window=…&group_by=… (1 call per refresh, on demand).
import { get } from "./api.js";
import { fill, h, status, table } from "./dom.js";

const WINDOW_MINUTES = { "5m": 5, "1h": 60, "24h": 1440 };
const MAX_BARS = 120;

/** One bar per minute of the window (per few minutes past MAX_BARS), empty ones too. */
function bars(data) {
  const span = WINDOW_MINUTES[data.window];
  const per = Math.ceil(span / MAX_BARS);
  const slots = Array.from({ length: Math.ceil(span / per) }, () => ({ tokens: 0, requests: 0 }));
  const last = Math.floor(data.now / 60);
  for (const m of data.series) {
    const index = slots.length - 1 - Math.floor((last - m.minute / 60) / per);
    if (index >= 0 && index < slots.length) {
      slots[index].tokens += m.total_tokens;
      slots[index].requests += m.requests;
    }
  }
  return { slots, per };
}

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
      drawChart(data);
      line.ok(data.data.length ? "" : "No requests in this window.");
    } catch (err) { line.error(err); }
  }

  function drawChart(data) {
    const { slots, per } = bars(data);
    const peak = Math.max(1, ...slots.map((b) => b.tokens));
    fill(chart, slots.map((b, i) => {
      const ago = (slots.length - 1 - i) * per;
      const bar = h("span", { class: "bar", title: `${ago} min ago: ${b.tokens} tokens, ${b.requests} requests` });
      bar.style.height = `${b.tokens ? Math.max(2, (100 * b.tokens) / peak) : 0}%`;
      return bar;
    }));
  }

  windowSel.addEventListener("change", refresh);
  groupSel.addEventListener("change", refresh);
  fill(main, h("h1", {}, "Usage"),
    h("p", { class: "muted" }, "Tokens and requests of this server process per key, tenant and model."),
    h("div", { class: "row" }, windowSel, groupSel, h("button", { type: "button", id: "us-refresh", onclick: refresh }, "Refresh")),
    line, h("h2", {}, "Tokens per minute"), chart, out);
  refresh();
}
