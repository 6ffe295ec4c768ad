// Live requests: GET /debug/requests (1 call per refresh; auto-refresh every POLL_S s
// when on), rendered PAGE_SIZE rows at a time whatever the history's length; a row's
// token trace comes from GET /debug/requests/{id} on click (text only when the server
// runs with observability.debug_prompts, else "redacted").
import { get } from "./api.js";
import { fill, fmt, h, status, table } from "./dom.js";

export const PAGE_SIZE = 50;
const POLL_S = 5;

export function requestsPage(main) {
  let rows = [], page = 0, timer = null, stopped = false;
  const tenant = h("input", { id: "rq-tenant", placeholder: "all tenants" });
  const auto = h("input", { id: "rq-auto", type: "checkbox", checked: true });
  const summary = h("p", { id: "rq-summary", class: "muted" });
  const body = h("div", { id: "rq-table" });
  const detail = h("pre", { id: "rq-detail", class: "code" });
  const pager = h("span", { id: "rq-page" });
  const line = status();

  async function refresh() {
    clearTimeout(timer);
    try {
      const query = tenant.value.trim() ? `?tenant=${encodeURIComponent(tenant.value.trim())}` : "";
      const data = await get(`/debug/requests${query}`);
      rows = [...data.active, ...data.recent];
      summary.textContent = `${data.active.length} running or queued, ${data.recent.length} recent`;
      page = Math.min(page, Math.max(0, Math.ceil(rows.length / PAGE_SIZE) - 1));
      render();
      line.ok("");
    } catch (err) { line.error(err); }
    if (!stopped && auto.checked) timer = setTimeout(refresh, POLL_S * 1000);
  }

  function render() {
    const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
    const shown = rows.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
    pager.textContent = `page ${page + 1} of ${pages}`;
    fill(body, table([
      ["Request", (r) => h("a", { href: "#requests", onclick: (e) => { e.preventDefault(); open(r.request_id); } }, r.request_id)],
      ["Tenant", (r) => r.tenant ?? "–"],
      ["Model", (r) => r.model ?? "–"],
      ["Phase", (r) => r.phase],
      ["Priority", (r) => r.priority],
      ["Queue s", (r) => fmt(r.queue_wait_s, 3)],
      ["TTFT s", (r) => fmt(r.time_to_first_token_s, 3)],
      ["Elapsed s", (r) => fmt(r.elapsed_s, 2)],
      ["Prompt / cached / output", (r) => `${r.num_prompt_tokens} / ${r.num_cached_tokens} / ${r.num_output_tokens}`],
      ["Finish", (r) => r.finish_reason ?? r.error ?? "–"],
    ], shown, { id: "rq-rows" }));
  }

  async function open(id) {
    try {
      const d = await get(`/debug/requests/${encodeURIComponent(id)}`);
      const text = d.trace.map((e) => e.text).join("");
      const redacted = d.trace.length > 0 && d.trace.every((e) => e.text === null);
      detail.textContent = `${id}: ${d.trace.length} trace events, ${d.num_dropped_events} dropped\n` +
        (redacted ? "(transcript redacted: the server runs without observability.debug_prompts)" : text);
    } catch (err) { line.error(err); }
  }

  const move = (step) => () => {
    page = Math.min(Math.max(0, page + step), Math.max(0, Math.ceil(rows.length / PAGE_SIZE) - 1));
    render();
  };
  fill(main, h("h1", {}, "Live requests"),
    h("div", { class: "row" },
      tenant,
      h("button", { type: "button", id: "rq-refresh", onclick: refresh }, "Refresh"),
      h("label", { class: "check" }, auto, ` auto (${POLL_S} s)`),
      h("button", { type: "button", id: "rq-prev", onclick: move(-1) }, "‹ Newer"),
      pager,
      h("button", { type: "button", id: "rq-next", onclick: move(1) }, "Older ›")),
    summary, line, body, h("h2", {}, "Transcript"), detail);
  auto.addEventListener("change", () => { if (auto.checked) refresh(); else clearTimeout(timer); });
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
