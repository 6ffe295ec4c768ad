// The one way the console calls the server: the same HTTP API as any client, with the
// session cookie (sent by the browser, unreadable here) and, on every call that may
// change state, the session's CSRF token as X-CSRF-Token.

export const session = { csrf: null, base: "" };

export class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error ? body.error : {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || null;
  }
}

/** fetch() with the CSRF header on non-GET calls; throws ApiError on a non-2xx answer.
 * A 401 also fires "inferflux:signed-out" (the session expired or was revoked). */
export async function call(method, path, body, { raw = false, signal } = {}) {
  const headers = { Accept: raw ? "*/*" : "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
    signal,
  });
  if (!response.ok) {
    let data = null;
    try { data = await response.json(); } catch { data = null; }
    const err = new ApiError(response.status, data);
    if (response.status === 401 && !path.endsWith("/session")) {
      window.dispatchEvent(new CustomEvent("inferflux:signed-out", { detail: err.message }));
    }
    throw err;
  }
  if (raw) return response;
  return response.status === 204 ? null : response.json();
}

export const get = (path, opts) => call("GET", path, undefined, opts);
export const post = (path, body, opts) => call("POST", path, body, opts);
export const put = (path, body) => call("PUT", path, body);
export const del = (path) => call("DELETE", path);

/** Read a `text/event-stream` response: onEvent(parsed JSON) per `data:` line. */
export async function readSse(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}
