// DOM helpers. Every text from a model, a user or the server goes in with textContent
// (never as HTML markup): `<script>` in a completion shows as the characters it is.

/** An element: h("button", {type: "button", onclick: fn}, "text", child, ...). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "value") el.value = value;
    else if (name === "checked") el.checked = Boolean(value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A labelled form field. */
export function field(label, input) {
  return h("label", { class: "field" }, h("span", {}, label), input);
}

/** A table of rows; `columns` are [header, row => cell text or Node]. */
export function table(columns, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, columns.map(([name]) => h("th", {}, name)))),
    h(
      "tbody",
      {},
      rows.map((row) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(row) ?? "")))),
    ),
  );
}

/** A status line that shows errors in red. */
export function status() {
  const el = h("p", { class: "status", role: "status" });
  el.ok = (text) => { el.className = "status ok"; el.textContent = text; };
  el.error = (err) => { el.className = "status error"; el.textContent = String(err.message ?? err); };
  el.busy = (text) => { el.className = "status busy"; el.textContent = text; };
  return el;
}

export function fmt(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return typeof value === "number" ? value.toFixed(digits) : String(value);
}
