// Entry: who am I (GET {base}/session), sign-in when needed, the pages the scopes allow.
import { call, get, post, session } from "./api.js";
import { fill, h, status } from "./dom.js";
import { dashboardPage } from "./dashboard.js";
import { keysPage } from "./keys.js";
import { modelsPage } from "./models.js";
import { playgroundPage } from "./playground.js";
import { requestsPage } from "./requests.js";
import { usagePage } from "./usage.js";

// The console's path: this module is served at {base}/static/app.js.
session.base = new URL(import.meta.url).pathname.replace(/\/static\/app\.js$/, "");

// Page id, title, scope it needs, builder (main element, principal) => stop function.
const PAGES = [
  ["playground", "Playground", "generate", playgroundPage],
  ["dashboard", "Dashboard", "read", dashboardPage],
  ["requests", "Live requests", "admin", requestsPage],
  ["models", "Models", "admin", modelsPage],
  ["keys", "Keys & limits", "admin", keysPage],
  ["usage", "Usage", "admin", usagePage],
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const signOut = document.getElementById("sign-out");
let principal = null;
let stopPage = null;

function allowed(p) {
  return PAGES.filter(([, , scope]) => p.scopes.includes(scope));
}

function show(pageId) {
  if (stopPage) { stopPage(); stopPage = null; }
  const pages = allowed(principal);
  const page = pages.find(([id]) => id === pageId) || pages[0];
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("active", page && link.dataset.page === page[0]);
  }
  if (!page) {
    fill(main, h("p", { class: "muted" }, "This credential holds no scope the console can use."));
    return;
  }
  fill(main);
  main.dataset.page = page[0];
  stopPage = page[3](main, principal) || null;
}

function signedIn(view, message) {
  principal = view;
  session.csrf = view.csrf_token;
  fill(
    nav,
    allowed(view).map(([id, title]) =>
      h("a", { href: `#${id}`, "data-page": id, id: `nav-${id}` }, title)),
  );
  fill(who, view.auth_enabled ? `${view.subject} · ${view.tenant} · ${view.scopes.join(", ")}` : "authentication off");
  signOut.hidden = !view.auth_enabled || !view.csrf_token;
  show(location.hash.slice(1));
  if (message) main.prepend(h("p", { class: "status ok" }, message));
}

function signInForm(message) {
  if (stopPage) { stopPage(); stopPage = null; }
  principal = null;
  session.csrf = null;
  fill(nav);
  fill(who);
  signOut.hidden = true;
  const credential = h("input", { id: "credential", type: "password", autocomplete: "off", placeholder: "sk-… or an OIDC token", required: true });
  const kind = h("select", { id: "credential-kind" }, h("option", { value: "api_key" }, "API key"), h("option", { value: "token" }, "OIDC token"));
  const line = status();
  if (message) line.error(message);
  const form = h(
    "form",
    { id: "sign-in", class: "card narrow", onsubmit: async (event) => {
      event.preventDefault();
      line.busy("Signing in…");
      try {
        const view = await post(`${session.base}/session`, { [kind.value]: credential.value });
        credential.value = "";
        signedIn(view);
      } catch (err) {
        line.error(err);
      }
    } },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "The key stays on the server side: this browser keeps only a session cookie it cannot read."),
    kind, credential,
    h("button", { type: "submit", id: "sign-in-button" }, "Sign in"),
    line,
  );
  fill(main, form);
  main.dataset.page = "sign-in";
  credential.focus();
}

async function start() {
  try {
    signedIn(await get(`${session.base}/session`));
  } catch (err) {
    signInForm(err.status === 401 ? null : err.message);
  }
}

window.addEventListener("hashchange", () => { if (principal) show(location.hash.slice(1)); });
window.addEventListener("inferflux:signed-out", (event) => {
  if (principal) signInForm(`Signed out: ${event.detail}`);
});
signOut.addEventListener("click", async () => {
  try { await call("DELETE", `${session.base}/session`); } catch { /* already gone */ }
  signInForm("Signed out.");
});
start();
