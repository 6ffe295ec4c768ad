// Models and adapters: GET /v1/admin/models and GET /v1/admin/adapters per refresh (2
// calls; the adapters list only for principals with adapter-manager), POST
// /v1/admin/models per action. A load or swap answers once the new model serves.
import { get, post } from "./api.js";
import { field, fill, h, status, table } from "./dom.js";

export function modelsPage(main, principal) {
  const line = status();
  const models = h("div", { id: "models-table" });
  const adapters = h("div", { id: "adapters-table" });
  const action = h("select", { id: "model-action" }, ["swap", "load"].map((a) => h("option", { value: a }, a)));
  const id = h("input", { id: "model-id", placeholder: "model id" });
  const path = h("input", { id: "model-path", placeholder: "file in the models folder, e.g. gemma.gguf" });
  const sha = h("input", { id: "model-sha256", placeholder: "sha256 of the file" });

  const adapterForm = {
    action: h("select", { id: "adapter-action" }, ["load", "swap"].map((x) => h("option", { value: x }, x))),
    id: h("input", { id: "adapter-id", placeholder: "adapter id" }),
    base: h("input", { id: "adapter-base", placeholder: "base model id" }),
    path: h("input", { id: "adapter-path", placeholder: "LoRA GGUF in the models folder" }),
    sha: h("input", { id: "adapter-sha256", placeholder: "sha256" }),
  };
  const adapterAct = (label, body) => async () => {
    line.busy(`${label}…`);
    try { await post("/v1/admin/adapters", body()); line.ok(`${label}: done.`); } catch (err) { line.error(err); }
    await refresh();
  };

  const act = (label, body) => async () => {
    line.busy(`${label}… (a load or swap returns once the model serves)`);
    try { await post("/v1/admin/models", body()); line.ok(`${label}: done.`); } catch (err) { line.error(err); }
    await refresh();
  };

  async function refresh() {
    try {
      const data = await get("/v1/admin/models");
      fill(models, table([
        ["Id", (m) => m.id], ["State", (m) => m.state], ["Default", (m) => (m.default ? "yes" : "")],
        ["Path", (m) => m.path], ["Workers", (m) => String(m.workers.length)],
        ["In flight", (m) => String(m.num_in_flight)], ["Error", (m) => m.error ?? ""],
        ["", (m) => (m.state === "retiring" ? "" : h("span", { class: "row" },
          m.default ? "" : h("button", { type: "button", onclick: act(`Set default ${m.id}`, () => ({ action: "set_default", id: m.id })) }, "Set default"),
          m.default ? "" : h("button", { type: "button", class: "danger", onclick: act(`Unload ${m.id}`, () => ({ action: "unload", id: m.id })) }, "Unload")))],
      ], data.data, { id: "models-rows" }));
      if (principal.scopes.includes("adapter-manager")) {
        const list = await get("/v1/admin/adapters");
        fill(adapters, table([
          ["Adapter", (a) => a.id], ["Base", (a) => a.base], ["Served as", (a) => a.model],
          ["State", (a) => a.state], ["Scale", (a) => String(a.scale ?? 1)], ["Error", (a) => a.error ?? ""],
          ["", (a) => h("button", { type: "button", class: "danger", onclick: adapterAct(`Unload ${a.model}`, () => ({ action: "unload", id: a.id, base: a.base })) }, "Unload")],
        ], list.data, { id: "adapters-rows" }));
      }
    } catch (err) { line.error(err); }
  }

  fill(main, h("h1", {}, "Models and adapters"), line, models,
    h("section", { class: "card" }, h("h2", {}, "Load or swap"),
      h("div", { class: "row" }, field("Action", action), field("Id", id), field("Path", path), field("SHA-256", sha),
        h("button", { type: "button", id: "model-apply", onclick: act("Apply", () => ({ action: action.value, id: id.value, path: path.value || undefined, sha256: sha.value || undefined })) }, "Apply"))),
    h("h2", {}, "Adapters"),
    principal.scopes.includes("adapter-manager")
      ? h("section", { class: "card" }, adapters,
        h("div", { class: "row" }, field("Action", adapterForm.action), field("Id", adapterForm.id),
          field("Base", adapterForm.base), field("Path", adapterForm.path), field("SHA-256", adapterForm.sha),
          h("button", { type: "button", id: "adapter-apply", onclick: adapterAct("Apply adapter", () => ({
            action: adapterForm.action.value, id: adapterForm.id.value, base: adapterForm.base.value,
            path: adapterForm.path.value, sha256: adapterForm.sha.value })) }, "Apply")))
      : h("p", { class: "muted" }, "Adapters need the adapter-manager scope."));
  refresh();
}
