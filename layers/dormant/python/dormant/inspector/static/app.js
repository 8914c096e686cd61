// The inspector: a page per URL, each view read from the HTTP API (see dormant/inspector/__init__.py).
//   /inspect/sessions                     the caller's sessions (?status=, ?cursor=)
//   /inspect/sessions/{id}                a session: waiting calls, a new message, its invocations and timeline
//   /inspect/sessions/{id}?at=N[&since=M] time travel: the state after event N, what N changed (or the diff since M)
//   /inspect/sessions/{id}/audit?scope=&key=   every change to one key
// Why one module: the router and its four pages, which share the page frame and its state; what they draw
// with is in timeline.js (one rendering per event), form.js (an answer form from a tool's schema), dom.js and api.js.

import { get, post, sessionApi } from "./api.js";
import {
  auditPath,
  badge,
  clear,
  errorText,
  eventPath,
  h,
  link,
  sessionPath,
  short,
  time,
  value,
} from "./dom.js";
import { schemaForm } from "./form.js";
import { EVENT_TYPES, eventRow, invocationTree } from "./timeline.js";

const PAGE = 20;
const EVENTS_PAGE = 100;
const STATUSES = ["idle", "running", "awaiting_input", "resumable", "completed", "error", "max_steps"];
const main = document.getElementById("main");
let current = null; // the view on screen: { key, update(url), dispose() }
let generation = 0;

export function navigate(href, { replace = false } = {}) {
  history[replace ? "replaceState" : "pushState"](null, "", href);
  render();
}

document.addEventListener("click", (event) => {
  const anchor = event.target.closest("a[data-nav]");
  if (!anchor || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  navigate(anchor.getAttribute("href"));
});
window.addEventListener("popstate", () => render());

async function render() {
  const url = new URL(location.href);
  const parts = url.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const mine = ++generation;
  const stale = () => mine !== generation;
  let key;
  let build;
  if (parts.length === 0 || (parts[0] === "inspect" && (parts.length === 1 || (parts.length === 2 && parts[1] === "sessions")))) {
    key = `list ${url.search}`;
    build = () => sessionsView(url, stale);
  } else if (parts[0] === "inspect" && parts[1] === "sessions" && parts.length === 3) {
    key = `session ${parts[2]}`;
    build = () => sessionView(parts[2], url, stale);
  } else if (parts[0] === "inspect" && parts[1] === "sessions" && parts.length === 4 && parts[3] === "audit") {
    key = `audit ${parts[2]} ${url.search}`;
    build = () => auditView(parts[2], url, stale);
  } else {
    dispose();
    clear(main, h("h1", null, "Not found"), h("p", null, "No view at this address. "), link("/inspect/sessions", "Sessions"));
    return;
  }
  if (current && current.key === key && current.update) {
    await current.update(url);
    return;
  }
  dispose();
  current = { key };
  try {
    const view = await build();
    if (!stale()) current = { key, ...view };
    else if (view.dispose) view.dispose(); // a view replaced while it loaded lets go of what it opened
  } catch (error) {
    if (!stale()) clear(main, h("h1", null, "Could not load this view"), h("p", { class: "error" }, errorText(error)));
  }
}

/** Let the view on screen go: it closes what it holds open (a live feed). */
function dispose() {
  if (current && current.dispose) current.dispose();
  current = null;
}

// -- sessions ---------------------------------------------------------------------------------------------

async function sessionsView(url, stale) {
  const status = url.searchParams.get("status") || "";
  const cursor = url.searchParams.get("cursor") || "";
  const query = new URLSearchParams({ limit: String(PAGE) });
  if (status) query.set("status", status);
  if (cursor) query.set("cursor", cursor);
  const page = await get(`/sessions?${query}`);
  if (stale()) return {};
  document.title = "Sessions · dormant inspector";

  const select = h(
    "select",
    { id: "status-filter", name: "status", "aria-label": "status" },
    h("option", { value: "" }, "every status"),
    STATUSES.map((s) => h("option", { value: s }, s)),
  );
  select.value = status;
  select.addEventListener("change", () => {
    const next = new URLSearchParams(select.value ? { status: select.value } : {});
    navigate(`/inspect/sessions${next.size ? `?${next}` : ""}`);
  });

  const rows = page.sessions.map((s) =>
    h(
      "tr",
      { class: s.status === "awaiting_input" ? "waiting" : null, dataset: { id: s.id, status: s.status || "" } },
      h("td", null, link(sessionPath(s.id), s.id)),
      h("td", null, badge(s.status)),
      h("td", { class: "num" }, String(s.version)),
      h("td", null, time(s.updated_at)),
      h("td", null, time(s.created_at)),
    ),
  );
  const pager = h("nav", { class: "pager" });
  if (cursor) pager.append(link(`/inspect/sessions${status ? `?status=${encodeURIComponent(status)}` : ""}`, "← first page"));
  if (page.cursor) {
    const next = new URLSearchParams({ ...(status ? { status } : {}), cursor: page.cursor });
    pager.append(link(`/inspect/sessions?${next}`, "next page →"));
  }
  clear(
    main,
    h("h1", null, "Sessions"),
    h("p", { class: "muted" }, "Newest first. Sessions waiting on a human are marked."),
    h("div", { class: "toolbar" }, h("label", null, "Status ", select)),
    rows.length
      ? h(
          "table",
          { id: "sessions", class: "grid" },
          h("thead", null, h("tr", null, ["session", "status", "version", "updated", "created"].map((t) => h("th", null, t)))),
          h("tbody", null, rows),
        )
      : h("p", { class: "empty" }, status ? `No ${status} sessions on this page.` : "No sessions yet."),
    pager,
    newSessionForm(),
  );
  return {};
}

function newSessionForm() {
  const id = h("input", { id: "new-session-id", name: "session_id", placeholder: "generated if empty" });
  const scopes = h("input", { id: "new-session-scopes", name: "scopes", placeholder: "user=alex-doe" });
  const problem = h("p", { class: "form-error", role: "alert" });
  const form = h(
    "form",
    { id: "new-session", class: "card" },
    h("h2", null, "New session"),
    h("label", null, "Session id ", id),
    h("label", null, "Scopes ", scopes),
    h("button", { type: "submit" }, "Create"),
    problem,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {};
    if (id.value.trim()) body.session_id = id.value.trim();
    const bound = {};
    for (const pair of scopes.value.split(/[,\s]+/).filter(Boolean)) {
      const [scope, ...rest] = pair.split("=");
      if (!scope || !rest.length) {
        problem.textContent = `scopes are scope=id pairs, not ${JSON.stringify(pair)}`;
        return;
      }
      bound[scope] = rest.join("=");
    }
    if (Object.keys(bound).length) body.scopes = bound;
    try {
      const created = await post("/sessions", body);
      navigate(sessionPath(created.id));
    } catch (error) {
      problem.textContent = errorText(error);
    }
  });
  return form;
}

// -- one session ------------------------------------------------------------------------------------------

async function sessionView(id, url, stale) {
  let session = await get(sessionApi(id));
  const timeline = new Timeline(id);
  await timeline.more();
  // The invocations as the fold knows them (a session with no events has none, and no state to travel to).
  let latest = timeline.events.length ? await get(`${sessionApi(id)}/state`) : null;
  if (stale()) return {};
  document.title = `${id} · dormant inspector`;
  const side = h("aside", { id: "state-panel", class: "side" });
  const tree = h("section", { class: "card" }, h("h2", null, "Invocations"));
  const facts = h("p", { class: "facts" });
  const waiting = h("div", { class: "waiting-slot" });
  const showSession = () => {
    clear(
      facts,
      badge(session.status),
      ` version ${session.version} · updated ${time(session.updated_at)}`,
      Object.keys(session.scopes).length
        ? ` · scopes ${Object.entries(session.scopes).map(([s, v]) => `${s}=${v}`).join(", ")}`
        : "",
    );
    clear(waiting, waitingCalls(session));
  };
  showSession();
  const header = h("header", { class: "session-head" }, h("h1", null, "Session ", h("span", { class: "id" }, session.id)), facts);
  clear(
    main,
    header,
    h(
      "div",
      { class: "layout" },
      h(
        "div",
        { class: "primary" },
        waiting,
        messageForm(session),
        tree,
        h("section", { class: "card" }, h("h2", null, "Timeline"), timeline.element),
      ),
      side,
    ),
  );
  let at = url.searchParams.get("at");
  const update = async (next) => {
    at = next.searchParams.get("at");
    const since = next.searchParams.get("since");
    if (at !== null && /^\d+$/.test(at)) await timeline.ensure(Number(at));
    timeline.select(at === null ? null : Number(at));
    if (at === null) showCurrentState(side, session);
    else await showStateAt(side, session, at, since);
    renderTree();
  };
  const renderTree = () => {
    clear(tree, h("h2", null, "Invocations"));
    tree.append(latest ? invocationTree(id, latest.invocations, timeline.events) : h("p", { class: "muted" }, "No invocations yet."));
  };
  await update(url);
  const selected = url.searchParams.get("at");
  if (selected !== null) document.getElementById(`event-${selected}`)?.scrollIntoView({ block: "center" });
  timeline.onLoad = renderTree;

  // A running turn is followed live: its events join the timeline as they land, and when it ends (or
  // yields) the session is read again, so the status, the waiting calls and the state are the new ones.
  let follower = null;
  const stop = () => {
    if (follower) follower.close();
    follower = null;
    timeline.list.dataset.follow = "";
  };
  const refresh = async () => {
    session = await get(sessionApi(id));
    latest = timeline.events.length ? await get(`${sessionApi(id)}/state`) : null;
    showSession();
    if (at === null) showCurrentState(side, session);
    renderTree();
    if (session.status !== "running") stop();
  };
  const arrived = async (index, event) => {
    if (timeline.next === null) {
      if (index === timeline.events.length) timeline.add([event]);
      else if (index > timeline.events.length) await timeline.more(timeline.events.length); // one we missed
    } // else: the timeline is not read that far yet; its pages will show this event
    if (event.type === "invocation_end" || event.type === "invocation_yield") await refresh();
    else renderTree();
  };
  if (session.status === "running") {
    const from = timeline.next === null ? timeline.events.length : latest ? latest.index + 1 : 0;
    follower = new Follower(`${sessionApi(id)}/events?after=${from}`, arrived, (live) => {
      timeline.list.dataset.follow = live ? "live" : "";
    });
  }
  return { update, dispose: stop };
}

/** A session's ledger as server-sent events (dormant serve's feed): each event handed on in order, as it lands.
 *  The browser reconnects on its own, from the last event it got (Last-Event-ID). */
class Follower {
  constructor(url, onEvent, onState) {
    this.queue = Promise.resolve();
    this.source = new EventSource(url);
    const take = (message) => {
      const index = Number(message.lastEventId);
      const event = JSON.parse(message.data);
      this.queue = this.queue.then(() => onEvent(index, event)).catch((error) => console.warn("follow:", error));
    };
    for (const type of [...EVENT_TYPES(), "message"]) this.source.addEventListener(type, take);
    this.source.addEventListener("open", () => onState(true));
    this.source.addEventListener("error", () => onState(false));
  }

  close() {
    this.source.close();
  }
}

class Timeline {
  constructor(id) {
    this.id = id;
    this.events = [];
    this.next = 0;
    this.list = h("ol", { id: "timeline", class: "timeline", start: "0" });
    this.button = h("button", { type: "button", id: "load-more", class: "more" }, "Load more events");
    this.button.addEventListener("click", () => this.more());
    this.element = h("div", null, this.list, this.button);
    this.selected = null;
    this.onLoad = null;
    this.loading = null;
    // Long sessions load a page at a time, as the end of the list scrolls into view.
    this.observer = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.more();
    });
    this.observer.observe(this.button);
  }

  /** The next page of the ledger (``from``: read on from there, where a live feed found a gap). */
  async more(from = this.next) {
    if (from === null) return;
    if (this.loading) return this.loading;
    this.loading = (async () => {
      const page = await get(`${sessionApi(this.id)}/events?after=${from}&limit=${EVENTS_PAGE}`);
      this.add(page.events);
      this.next = page.next;
      this.button.hidden = page.next === null;
      if (!this.events.length) this.list.append(h("li", { class: "empty" }, "No events yet."));
      if (this.onLoad) this.onLoad();
    })();
    try {
      await this.loading;
    } finally {
      this.loading = null;
    }
  }

  /** Events that follow the last one shown. */
  add(events) {
    if (!events.length) return;
    const start = this.events.length;
    this.events.push(...events);
    for (const row of this.list.querySelectorAll("li.empty")) row.remove();
    this.list.append(...events.map((e, n) => eventRow(this.id, e, start + n)));
    if (this.selected !== null) this.select(this.selected);
  }

  async ensure(index) {
    while (this.next !== null && this.events.length <= index) await this.more();
  }

  select(index) {
    this.selected = index;
    for (const row of this.list.querySelectorAll("li.selected")) row.classList.remove("selected");
    if (index !== null) document.getElementById(`event-${index}`)?.classList.add("selected");
  }
}

function waitingCalls(session) {
  if (!session.yielded_tools.length) return null;
  return h(
    "section",
    { class: "card waiting", id: "waiting" },
    h("h2", null, "Waiting on a human"),
    session.yielded_tools.map((call) =>
      h(
        "div",
        { class: "yielded", dataset: { callId: call.call_id, name: call.name } },
        h("h3", null, h("code", { class: "tool" }, call.name), " ", h("span", { class: "call-id" }, call.call_id)),
        value(call.args),
        // What the API would refuse, the page does not offer: who may answer, and why this caller may not.
        call.answerable === false
          ? h(
              "p",
              { class: "refused", role: "note" },
              "You may not answer this call: it is answerable by ",
              h("code", null, (call.answerable_by || []).join(" and ")),
              ".",
            )
          : schemaForm(call.answer_schema, {
              submitLabel: "Answer and resume",
              onSubmit: async (input) => {
                await post(`${sessionApi(session.id)}/tools`, { answers: [{ call_id: call.call_id, input }] });
                reload();
              },
            }),
      ),
    ),
  );
}

function messageForm(session) {
  const text = h("textarea", { id: "message", name: "message", rows: 2, placeholder: "A new turn for the agent" });
  const problem = h("p", { class: "form-error", role: "alert" });
  const button = h("button", { type: "submit" }, "Send");
  const form = h("form", { id: "message-form", class: "card" }, h("h2", null, "Send a message"), text, button, problem);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    button.disabled = true;
    button.textContent = "Running…";
    try {
      await post(`${sessionApi(session.id)}/runs`, { message: text.value });
      reload();
    } catch (error) {
      problem.textContent = errorText(error);
    } finally {
      button.disabled = false;
      button.textContent = "Send";
    }
  });
  return form;
}

function reload() {
  dispose();
  render();
}

function showCurrentState(side, session) {
  clear(
    side,
    h("h2", null, "State now"),
    h("p", { class: "muted" }, "Select an event to see the state as it stood then."),
    Object.entries(session.state).map(([scope, values]) => scopeTable(session.id, scope, values, new Map())),
  );
  side.dataset.at = "";
}

async function showStateAt(side, session, at, since) {
  const query = new URLSearchParams({ at });
  if (since !== null && since !== "") query.set("since", since);
  let view;
  try {
    view = await get(`${sessionApi(session.id)}/state?${query}`);
  } catch (error) {
    clear(side, h("h2", null, `State after event #${at}`), h("p", { class: "error" }, errorText(error)));
    side.dataset.at = at;
    return;
  }
  const index = view.index;
  const changed = new Map(view.changes.map((c) => [`${c.scope}\u0000${c.key}`, c]));
  const compare = h("input", { id: "since", name: "since", type: "number", min: "0", value: since ?? "", placeholder: String(Math.max(index - 1, 0)) });
  const compareForm = h(
    "form",
    { id: "compare", class: "inline" },
    h("label", null, "Compare with event # ", compare),
    h("button", { type: "submit" }, "Diff"),
  );
  compareForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams({ at: String(index) });
    if (compare.value !== "") next.set("since", compare.value);
    navigate(`${sessionPath(session.id)}?${next}`);
  });
  const reason = h("input", { id: "fork-reason", name: "reason", value: `forked at event #${index}` });
  const problem = h("p", { class: "form-error", role: "alert" });
  const forkForm = h(
    "form",
    { id: "fork", class: "inline" },
    h("label", null, "Reason ", reason),
    h("button", { type: "submit" }, `Fork at #${index}`),
    problem,
  );
  forkForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const forked = await post(`${sessionApi(session.id)}/forks`, { at: index, reason: reason.value });
      navigate(sessionPath(forked.id));
    } catch (error) {
      problem.textContent = errorText(error);
    }
  });
  const diffTitle =
    since !== null && since !== ""
      ? `Diff from event #${view.since} to #${index}`
      : index === 0
        ? "What event #0 changed"
        : `What event #${index} changed`;
  clear(
    side,
    h("h2", null, `State after event #${index}`),
    h(
      "nav",
      { class: "travel" },
      index > 0 ? link(eventPath(session.id, index - 1), "← previous") : null,
      link(eventPath(session.id, index + 1), "next →"),
      link(sessionPath(session.id), "now"),
    ),
    h("p", { class: "facts" }, badge(view.status), view.current_agent_name ? ` agent ${view.current_agent_name}` : ""),
    h(
      "section",
      { id: "changes", class: "changes-panel" },
      h("h3", null, diffTitle),
      view.changes.length
        ? h(
            "table",
            { class: "grid diff" },
            h("thead", null, h("tr", null, ["key", "before", "after"].map((t) => h("th", null, t)))),
            h(
              "tbody",
              null,
              view.changes.map((c) =>
                h(
                  "tr",
                  { dataset: { scope: c.scope, key: c.key } },
                  h("td", null, link(auditPath(session.id, c.scope, c.key), `${c.scope}.${c.key}`)),
                  h("td", { class: "old" }, c.before === null ? "(unset)" : value(c.before)),
                  h("td", { class: "new" }, c.after === null ? "(unset)" : value(c.after)),
                ),
              ),
            ),
          )
        : h("p", { class: "muted" }, "No state changed."),
      compareForm,
    ),
    Object.entries(view.state).map(([scope, values]) => scopeTable(session.id, scope, values, changed)),
    view.yielded_tools.length
      ? h(
          "section",
          null,
          h("h3", null, "Waiting then"),
          h("ul", null, view.yielded_tools.map((c) => h("li", null, h("code", { class: "tool" }, c.name), ` ${short(c.args)}`))),
        )
      : null,
    h("section", { class: "fork" }, h("h3", null, "Fork"), forkForm),
  );
  side.dataset.at = at; // set once the panel shows it: what a reader (or a test) waits for
  side.dataset.since = since ?? "";
}

function scopeTable(sessionId, scope, values, changed) {
  const keys = new Set(Object.keys(values));
  for (const c of changed.values()) if (c.scope === scope) keys.add(c.key);
  const rows = [...keys].sort().map((key) => {
    const change = changed.get(`${scope}\u0000${key}`);
    return h(
      "tr",
      { class: change ? "changed" : null, dataset: { key } },
      h("th", { scope: "row" }, link(auditPath(sessionId, scope, key), key)),
      h("td", null, key in values ? value(values[key]) : h("span", { class: "muted" }, "(unset)")),
    );
  });
  return h(
    "section",
    { class: "scope", dataset: { scope } },
    h("h3", null, scope),
    rows.length ? h("table", { class: "grid kv" }, h("tbody", null, rows)) : h("p", { class: "muted" }, "empty"),
  );
}

// -- the audit of one key ---------------------------------------------------------------------------------

async function auditView(id, url, stale) {
  const scope = url.searchParams.get("scope") || "session";
  const key = url.searchParams.get("key") || "";
  const form = h(
    "form",
    { id: "audit-form", class: "inline" },
    h("label", null, "Scope ", h("input", { name: "scope", value: scope })),
    h("label", null, "Key ", h("input", { name: "key", value: key })),
    h("button", { type: "submit" }, "Show"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    navigate(auditPath(id, data.get("scope"), data.get("key")));
  });
  let body;
  if (!key) {
    body = h("p", { class: "muted" }, "Name a key to see every change to it.");
  } else {
    const audit = await get(`${sessionApi(id)}/audit?${new URLSearchParams({ scope, key })}`).catch((error) => error);
    if (stale()) return {};
    if (audit instanceof Error) {
      body = h("p", { class: "error" }, errorText(audit));
    } else if (!audit.changes.length) {
      body = h("p", { class: "empty" }, "This key never changed in this session.");
    } else {
      body = h(
        "table",
        { id: "audit", class: "grid" },
        h("thead", null, h("tr", null, ["event", "when", "source", "invocation", "tool", "old", "new"].map((t) => h("th", null, t)))),
        h(
          "tbody",
          null,
          audit.changes.map((c) =>
            h(
              "tr",
              { dataset: { index: String(c.index) } },
              h("td", null, link(eventPath(id, c.index), `#${c.index}`)),
              h("td", null, time(c.created_at)),
              h("td", null, h("span", { class: `source source-${c.source}` }, c.source)),
              h("td", null, c.agent_name || "", c.invocation_id ? h("div", { class: "call-id" }, c.invocation_id) : "outside any invocation"),
              h("td", { class: "tool-cell" }, c.tool ? [h("code", { class: "tool" }, c.tool), h("div", { class: "call-id" }, c.call_id)] : "—"),
              h("td", { class: "old" }, c.old_value === null ? "(unset)" : value(c.old_value)),
              h("td", { class: "new" }, c.new_value === null ? "(deleted)" : value(c.new_value)),
            ),
          ),
        ),
      );
    }
  }
  document.title = `${scope}.${key} · ${id} · dormant inspector`;
  clear(
    main,
    h("h1", null, "Audit of ", h("code", null, `${scope}.${key}`)),
    h("p", null, "in session ", link(sessionPath(id), id)),
    form,
    body,
  );
  return {};
}

// Who the page acts as: dormant serve's caller (its X-Dormant-* headers, else --principal, --tenant, --groups).
get("/inspect/me")
  .then((me) => {
    const who = document.getElementById("who");
    const parts = [`acting as ${me.principal}`, me.tenant ? `tenant ${me.tenant}` : null];
    if (me.groups.length) parts.push(`groups ${me.groups.join(", ")}`);
    who.textContent = parts.filter(Boolean).join(" · ");
    who.dataset.principal = me.principal;
  })
  .catch(() => {});

render();
