// Building the page: every value from the API becomes a text node (never HTML), so a message or a state
// value holding markup or a script is shown as the characters it is.

export function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") element.className = value;
    else if (name.startsWith("on") && typeof value === "function") element.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  add(element, children);
  return element;
}

export function add(element, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

export function clear(element, ...children) {
  element.replaceChildren();
  return add(element, children);
}

/** A link inside the page: followed without a reload (app.js listens for data-nav). */
export function link(href, ...children) {
  return h("a", { href, "data-nav": true }, ...children);
}

export function sessionPath(id) {
  return `/inspect/sessions/${encodeURIComponent(id)}`;
}

export function eventPath(id, index) {
  return `${sessionPath(id)}?at=${index}`;
}

export function auditPath(id, scope, key) {
  const query = new URLSearchParams({ scope, key });
  return `${sessionPath(id)}/audit?${query}`;
}

/** JSON as text: a short form for one line, the whole value indented in a <pre>. */
export function short(value, limit = 80) {
  const text = value === undefined ? "undefined" : JSON.stringify(value);
  return text.length > limit ? `${text.slice(0, limit - 1)}…` : text;
}

export function json(value, className = "json") {
  return h("pre", { class: className }, JSON.stringify(value, null, 2));
}

/** JSON inline when it is short, else indented. */
export function compact(value, limit = 90) {
  const text = JSON.stringify(value);
  return text !== undefined && text.length <= limit ? h("code", { class: "json inline" }, text) : json(value);
}

/** A value as it reads best: a string as itself, anything else as JSON. */
export function value(v) {
  if (typeof v === "string") return h("span", { class: "value string" }, v);
  if (v !== null && typeof v === "object") return json(v, "value json");
  return h("span", { class: "value" }, JSON.stringify(v));
}

/** Epoch milliseconds in UTC, to the second (the same for everyone reading a shared link). */
export function time(ms) {
  if (typeof ms !== "number") return "";
  return `${new Date(ms).toISOString().slice(0, 19).replace("T", " ")}Z`;
}

export const STATUS_TEXT = {
  awaiting_input: "waiting on a human",
  resumable: "answered, ready to resume",
};

export function badge(status) {
  return h("span", { class: `badge status-${status}`, title: status }, STATUS_TEXT[status] || status);
}

export function errorText(error) {
  if (error && error.status) {
    const field = error.field ? ` (${error.field})` : "";
    return `${error.status} ${error.kind || "error"}${field}: ${error.message}`;
  }
  return String(error && error.message ? error.message : error);
}
