// The HTTP API, as the page calls it: the same routes, the same JSON, the same errors as over curl.

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.kind = body && body.error;
    this.field = body && body.field;
    this.body = body;
  }
}

export async function api(method, path, body) {
  const init = { method, headers: { Accept: "application/json" } };
  // A turn runs after its request answers (202); the page shows its outcome, so it asks the server to wait.
  if (method === "POST" && /\/(runs|tools)$/.test(path)) init.headers.Prefer = "wait=25";
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: "NotJSON", message: text.slice(0, 200) };
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body);

export function sessionApi(id) {
  return `/sessions/${encodeURIComponent(id)}`;
}
