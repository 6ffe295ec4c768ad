// Playground: a streamed chat with /v1/chat/completions (the same call as any client).
// Calls: one GET /v1/models when the page opens, one POST per message sent.
import { call, get, readSse } from "./api.js";
import { field, fill, fmt, h, status } from "./dom.js";

function numberInput(id, value, step, min, max) {
  return h("input", { id, type: "number", value, step, min, max });
}

function parseJson(text, what) {
  if (!text.trim()) return undefined;
  try { return JSON.parse(text); } catch (err) { throw new Error(`${what} is not valid JSON: ${err.message}`); }
}

/** The chat request the form describes (without `stream`). */
function buildRequest(form, messages) {
  const body = {
    model: form.model.value || undefined,
    messages,
    temperature: Number(form.temperature.value),
    top_p: Number(form.top_p.value),
    max_tokens: Number(form.max_tokens.value),
    priority: form.priority.value,
  };
  if (form.adapter.value.trim()) body.adapter = form.adapter.value.trim();
  if (form.seed.value !== "") body.seed = Number(form.seed.value);
  if (form.json_mode.checked) {
    const schema = parseJson(form.schema.value, "The JSON schema");
    body.response_format = schema
      ? { type: "json_schema", json_schema: { name: "output", schema } }
      : { type: "json_object" };
  }
  const tools = parseJson(form.tools.value, "Tools");
  if (tools) body.tools = tools;
  const extra = parseJson(form.extra.value, "Extra fields");
  if (extra) Object.assign(body, extra);
  return body;
}

function curlOf(body) {
  const url = `${location.origin}/v1/chat/completions`;
  const json = JSON.stringify({ ...body, stream: true }, null, 2).replaceAll("'", "'\\''");
  return `curl ${url} \\\n  -H "Authorization: Bearer $INFERFLUX_API_KEY" \\\n  -H "Content-Type: application/json" \\\n  -d '${json}'`;
}

function sdkOf(body) {
  const { model, messages, ...rest } = body;
  const args = Object.entries(rest).map(([k, v]) => `    ${k}=${JSON.stringify(v).replaceAll("true", "True").replaceAll("false", "False").replaceAll("null", "None")},`);
  return [
    "import os",
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url="${location.origin}/v1", api_key=os.environ["INFERFLUX_API_KEY"])`,
    "stream = client.chat.completions.create(",
    `    model=${JSON.stringify(model ?? "default")},`,
    `    messages=${JSON.stringify(messages)},`,
    ...args,
    "    stream=True,",
    ")",
    "for chunk in stream:",
    '    print(chunk.choices[0].delta.content or "", end="")',
  ].join("\n");
}

export function playgroundPage(main, principal) {
  const messages = [];
  const form = {
    model: h("select", { id: "pg-model" }),
    adapter: h("input", { id: "pg-adapter", placeholder: "none" }),
    system: h("textarea", { id: "pg-system", rows: 2, placeholder: "You are a helpful assistant." }),
    temperature: numberInput("pg-temperature", "0", "0.1", "0", "2"),
    top_p: numberInput("pg-top-p", "1", "0.05", "0.05", "1"),
    max_tokens: numberInput("pg-max-tokens", "64", "1", "1", "8192"),
    seed: numberInput("pg-seed", "", "1"),
    priority: h("select", { id: "pg-priority" }, ["normal", "high", "low"].map((p) => h("option", { value: p }, p))),
    json_mode: h("input", { id: "pg-json", type: "checkbox" }),
    schema: h("textarea", { id: "pg-schema", rows: 3, placeholder: '{"type": "object", ...} (empty: any JSON object)' }),
    tools: h("textarea", { id: "pg-tools", rows: 3, placeholder: '[{"type": "function", "function": {...}}]' }),
    extra: h("textarea", { id: "pg-extra", rows: 2, placeholder: '{"stop": ["\\n"], "logit_bias": {...}}' }),
  };
  const prompt = h("textarea", { id: "pg-prompt", rows: 3, placeholder: "Message" });
  const transcript = h("div", { id: "pg-transcript", class: "transcript" });
  const stats = h("p", { id: "pg-stats", class: "muted" });
  const code = h("pre", { id: "pg-code", class: "code" });
  const line = status();
  let abort = null;

  function addMessage(role, text) {
    const body = h("div", { class: "text" }, text);
    transcript.append(h("div", { class: `message ${role}` }, h("span", { class: "role" }, role), body));
    transcript.scrollTop = transcript.scrollHeight;
    return body;
  }

  async function send(event) {
    event.preventDefault();
    if (!prompt.value.trim()) return;
    const history = [...messages, { role: "user", content: prompt.value }];
    const system = form.system.value.trim();
    let body;
    try {
      body = buildRequest(form, system ? [{ role: "system", content: system }, ...history] : history);
    } catch (err) { line.error(err); return; }
    messages.push({ role: "user", content: prompt.value });
    addMessage("user", prompt.value);
    prompt.value = "";
    fill(code, curlOf(body));
    const reply = addMessage("assistant", "");
    reply.classList.add("streaming");
    line.busy("Generating…");
    abort = new AbortController();
    const sentAt = performance.now();
    let firstAt = null, usage = null, text = "", finish = null;
    try {
      const response = await fetchStream(body, abort.signal);
      await readSse(response, (chunk) => {
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          const piece = (delta.content || "") + (delta.tool_calls ? JSON.stringify(delta.tool_calls) : "");
          if (piece && firstAt === null) firstAt = performance.now();
          text += piece;
          reply.textContent = text;
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      });
      messages.push({ role: "assistant", content: text });
      const ttft = firstAt === null ? null : (firstAt - sentAt) / 1000;
      const decodeS = firstAt === null ? null : (performance.now() - firstAt) / 1000;
      const tokens = usage ? usage.completion_tokens : null;
      const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
      fill(stats, `TTFT ${fmt(ttft, 3)} s · ${fmt(tokens && decodeS ? tokens / decodeS : null)} tokens/s · ${tokens ?? "–"} tokens · ${cached ?? 0} cached prompt tokens · finish: ${finish ?? "–"}`);
      line.ok("Done.");
    } catch (err) {
      line.error(err);
    } finally {
      reply.classList.remove("streaming");
      abort = null;
    }
  }

  // Listing models needs the read scope: a generate-only key gets the default model.
  const models = principal.scopes.includes("read") ? get("/v1/models") : Promise.resolve({ data: [] });
  models.then((list) => {
    fill(form.model, h("option", { value: "" }, "(default model)"),
      list.data.map((m) => h("option", { value: m.id }, m.id)));
  }).catch((err) => line.error(err));

  const codeButtons = h("div", { class: "row" },
    h("button", { type: "button", id: "pg-show-curl", onclick: () => { try { fill(code, curlOf(buildRequest(form, messages))); } catch (e) { line.error(e); } } }, "Show curl"),
    h("button", { type: "button", id: "pg-show-sdk", onclick: () => { try { fill(code, sdkOf(buildRequest(form, messages))); } catch (e) { line.error(e); } } }, "Show OpenAI SDK"),
    h("button", { type: "button", onclick: () => navigator.clipboard && navigator.clipboard.writeText(code.textContent) }, "Copy"),
  );
  fill(
    main,
    h("h1", {}, "Playground"),
    h("div", { class: "columns" },
      h("form", { class: "card settings", onsubmit: (e) => e.preventDefault() },
        field("Model", form.model), field("Adapter", form.adapter), field("System prompt", form.system),
        h("div", { class: "row" }, field("Temperature", form.temperature), field("top_p", form.top_p)),
        h("div", { class: "row" }, field("Max tokens", form.max_tokens), field("Seed", form.seed)),
        field("Priority", form.priority),
        h("label", { class: "check" }, form.json_mode, " JSON output"), field("JSON schema", form.schema),
        field("Tools", form.tools), field("Extra request fields (JSON)", form.extra)),
      h("section", { class: "card chat" },
        transcript,
        h("form", { id: "pg-form", onsubmit: send }, prompt,
          h("div", { class: "row" },
            h("button", { type: "submit", id: "pg-send" }, "Send"),
            h("button", { type: "button", onclick: () => abort && abort.abort() }, "Stop"),
            h("button", { type: "button", onclick: () => { messages.length = 0; fill(transcript); } }, "Clear"))),
        stats, line, codeButtons, code)),
  );
  return () => abort && abort.abort();
}

function fetchStream(body, signal) {
  return call("POST", "/v1/chat/completions", { ...body, stream: true, stream_options: { include_usage: true } }, { raw: true, signal });
}

