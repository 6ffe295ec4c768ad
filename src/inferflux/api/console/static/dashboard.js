// Dashboard: polls GET /server/stats and GET /metrics every POLL_S seconds (2 calls per
// refresh, never overlapping: the next poll starts only after both answered; none while
// the tab is hidden).
import { get } from "./api.js";
import { fill, fmt, h, status, table } from "./dom.js";

export const POLL_S = 2;

/** Prometheus text → [{name, labels, value}] (comments and blank lines skipped). */
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    samples.push({ name: match[1], labels, value: Number(match[4]) });
  }
  return samples;
}

function sum(samples, name, where = () => true) {
  return samples.filter((s) => s.name === name && where(s.labels)).reduce((a, s) => a + s.value, 0);
}

/** A quantile of a (cumulative, since start) Prometheus histogram, summed over labels. */
function quantile(samples, name, q) {
  const buckets = new Map();
  for (const s of samples) {
    if (s.name !== `${name}_bucket`) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) + s.value);
  }
  const sorted = [...buckets.entries()].sort((a, b) => a[0] - b[0]);
  const total = sorted.length ? sorted[sorted.length - 1][1] : 0;
  if (!total) return null;
  for (const [le, count] of sorted) if (count >= q * total) return le;
  return null;
}

function tile(label, value, id) {
  return h("div", { class: "tile", id }, h("span", { class: "label" }, label), h("span", { class: "value" }, value));
}

export function dashboardPage(main) {
  const tiles = h("div", { class: "tiles", id: "dash-tiles" });
  const workers = h("div", { id: "dash-workers" });
  const updated = h("p", { class: "muted", id: "dash-updated" });
  const line = status();
  let previous = null, timer = null, stopped = false, refreshes = 0;

  async function refresh() {
    if (document.hidden) { // a background tab makes no calls
      timer = setTimeout(refresh, POLL_S * 1000);
      return;
    }
    try {
      const [stats, text] = await Promise.all([
        get("/server/stats"),
        get("/metrics", { raw: true }).then((r) => r.text()).catch(() => ""),
      ]);
      render(stats, parseMetrics(text));
      line.ok("");
    } catch (err) {
      line.error(err);
    }
    if (!stopped) timer = setTimeout(refresh, POLL_S * 1000);
  }

  function render(stats, samples) {
    const now = performance.now();
    const requests = sum(samples, "inferflux_requests_total");
    const rps = previous ? (requests - previous.requests) / ((now - previous.at) / 1000) : null;
    previous = { requests, at: now };
    refreshes += 1;
    const kv = stats.kv_cells_total ? (100 * stats.kv_cells_used) / stats.kv_cells_total : null;
    const q = stats.queue_depth_by_priority || {};
    const ttft = ["0.5", "0.95", "0.99"].map((p) => fmt(quantile(samples, "inferflux_time_to_first_token_seconds", Number(p)), 3));
    const itl = ["0.5", "0.95", "0.99"].map((p) => fmt(quantile(samples, "inferflux_inter_token_latency_seconds", Number(p)), 3));
    fill(tiles,
      tile("Requests/s", fmt(rps, 2), "dash-rps"),
      tile("Generated tokens/s (10 s)", fmt(stats.throughput["10s"].generation_tokens_per_s), "dash-tps"),
      tile("Prompt tokens/s (10 s)", fmt(stats.throughput["10s"].prompt_tokens_per_s), "dash-pps"),
      tile("TTFT p50/p95/p99 ≤ s (since start)", ttft.join(" / "), "dash-ttft"),
      tile("ITL p50/p95/p99 ≤ s (since start)", itl.join(" / "), "dash-itl"),
      tile("Queue high/normal/low", `${q.high ?? 0} / ${q.normal ?? 0} / ${q.low ?? 0}`, "dash-queue"),
      tile("Running", String(stats.num_running), "dash-running"),
      tile("KV cache used", kv === null ? "–" : `${kv.toFixed(1)} %`, "dash-kv"),
      tile("Prefix hit rate", stats.prefix_cache ? `${(100 * stats.prefix_cache.hit_rate).toFixed(1)} %` : "off", "dash-prefix"),
      tile("Rate-limit rejections", String(sum(samples, "inferflux_rate_limit_decisions_total", (l) => l.outcome === "rejected")), "dash-ratelimited"),
      tile("Guardrail blocks", String(sum(samples, "inferflux_guardrail_decisions_total", (l) => l.action === "block")), "dash-blocks"),
      tile("Errors (HTTP ≥ 400)", String(sum(samples, "inferflux_request_errors_total")), "dash-errors"),
      tile("Requests answered", String(requests), "dash-requests"),
    );
    fill(workers, table([
      ["Worker", (w) => String(w.worker_id)],
      ["Role", (w) => String(w.role ?? "unified")],
      ["PID", (w) => String(w.pid ?? "–")],
      ["State", (w) => (w.draining ? "draining" : !w.ready ? "starting" : w.busy ? "busy" : "idle")],
      ["In flight", (w) => String(w.num_in_flight)],
      ["Restarts", (w) => String(w.restarts)],
      ["Hangs", (w) => String(w.hangs)],
      ["Backend", (w) => (w.fallback_reason ? `${w.backend} (fallback from ${w.requested_backend})` : String(w.backend ?? "cpu"))],
    ], stats.workers, { id: "dash-worker-table" }));
    fill(updated, `Model ${stats.model.id} · ${stats.num_workers} worker(s) · refresh #${refreshes} every ${POLL_S} s (2 calls)`);
    updated.dataset.refreshes = String(refreshes);
  }

  fill(main, h("h1", {}, "Dashboard"), updated, line, tiles, h("h2", {}, "Workers"), workers);
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
