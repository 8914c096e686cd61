// One rendering per event kind. Every value is text (see dom.js).

import { auditPath, compact, eventPath, h, link, sessionPath, short, time } from "./dom.js";

const SOURCE_TEXT = {
  direct: "direct write",
  mutation: "written by the agent",
  observation: "observed in the store",
};

export function eventRow(sessionId, event, index) {
  const kind = event.type;
  const row = h(
    "li",
    {
      class: `event kind-${kind}${event.invocation_id ? " in-invocation" : ""}`,
      id: `event-${index}`,
      dataset: { index: String(index), type: kind, invocation: event.invocation_id || "" },
    },
    h(
      "div",
      { class: "event-head" },
      link(eventPath(sessionId, index), h("span", { class: "index" }, `#${index}`)),
      h("span", { class: "kind" }, LABELS[kind] || kind),
      h("span", { class: "when" }, time(event.created_at)),
      event.agent_name ? h("span", { class: "agent" }, event.agent_name) : null,
    ),
    h("div", { class: "event-body" }, (RENDER[kind] || unknown)(event, sessionId)),
  );
  return row;
}

/** Every event type the page knows: the names a live feed's events arrive under (see app.js, Follower). */
export const EVENT_TYPES = () => Object.keys(LABELS);

const LABELS = {
  user: "user",
  assistant: "assistant",
  tool_call: "tool call",
  tool_result: "tool result",
  tool_input: "answer",
  state_change: "state",
  model_start: "model call",
  model_end: "model answer",
  invocation_start: "invocation starts",
  invocation_yield: "yields",
  invocation_resume: "resumes",
  invocation_end: "invocation ends",
  session_forked: "forked",
  adk_event: "ADK event",
  langgraph: "LangGraph",
  openai_agents: "Agents SDK",
};

const RENDER = {
  user: (e) => h("p", { class: "text" }, e.text),
  // An ADK agent's event (dormant.bridges.adk), kept whole: its author, its text parts, the rest compact.
  adk_event: (e) => [
    h("p", null, h("strong", { class: "author" }, e.author)),
    ((e.event.content || {}).parts || []).filter((p) => p.text).map((p) => h("p", { class: "text" }, p.text)),
    compact(e.event),
  ],
  // A LangGraph checkpointer's record (dormant.bridges.langgraph): its kind and what it names; values are serialized.
  langgraph: (e) => [
    h("p", null, h("strong", null, e.kind), " ", h("code", null, e.data.id || e.data.channel || e.data.task_id || "")),
    e.kind === "blob" ? null : compact(e.kind === "checkpoint" ? { ...e.data, values: undefined } : e.data),
  ],
  // An Agents SDK session item (dormant.bridges.openai_agents), kept whole: its role, its text, the rest compact.
  openai_agents: (e) =>
    e.kind === "item" && e.item
      ? [
          h("p", null, h("strong", { class: "author" }, e.item.role || e.item.type || "item")),
          typeof e.item.content === "string" ? h("p", { class: "text" }, e.item.content) : null,
          compact(e.item),
        ]
      : [h("p", null, h("strong", null, e.kind)), compact(e.popped || e.parts || "")],
  assistant: (e) => [
    e.text !== null && e.text !== undefined ? h("p", { class: "text" }, e.text) : null,
    e.value !== null && e.value !== undefined ? compact(e.value) : null,
  ],
  tool_call: (e) => [
    h("p", null, h("code", { class: "tool" }, e.name), " ", h("span", { class: "call-id" }, e.call_id)),
    Object.keys(e.args || {}).length ? compact(e.args) : h("p", { class: "muted" }, "no arguments"),
    e.error ? h("p", { class: "error" }, `arguments not decoded: ${e.error}`) : null,
  ],
  tool_result: (e) => [
    h("p", null, h("code", { class: "tool" }, e.name), " ", h("span", { class: "call-id" }, e.call_id)),
    e.error ? h("p", { class: "error" }, e.error) : compact(e.result),
  ],
  tool_input: (e) => {
    const known = new Set(["v", "id", "created_at", "invocation_id", "agent_name", "type", "call_id", "name", "input", "principal"]);
    const extra = Object.entries(e).filter(([k]) => !known.has(k));
    return [
      h(
        "p",
        null,
        "answer to ",
        h("code", { class: "tool" }, e.name),
        " ",
        h("span", { class: "call-id" }, e.call_id),
        e.principal ? [" by ", h("strong", { class: "principal" }, e.principal)] : null,
      ),
      compact(e.input),
      extra.map(([k, v]) => h("p", { class: "muted" }, `${k}: ${short(v)}`)),
    ];
  },
  state_change: (e, sessionId) =>
    h(
      "ul",
      { class: "changes" },
      (e.changes || []).map((c) =>
        h(
          "li",
          { class: "change", dataset: { scope: e.scope, key: c.key } },
          link(
            auditPath(sessionId, e.scope, c.key),
            h("span", { class: "scope" }, e.scope_id ? `${e.scope}[${e.scope_id}]` : e.scope),
            ".",
            h("span", { class: "key" }, c.key),
          ),
          h("span", { class: "old" }, c.old_value === null ? "(unset)" : short(c.old_value)),
          h("span", { class: "arrow" }, " → "),
          h("span", { class: "new" }, c.new_value === null ? "(deleted)" : short(c.new_value)),
          h("span", { class: `source source-${e.source}`, title: SOURCE_TEXT[e.source] || e.source }, e.source),
          e.call_id ? h("span", { class: "by" }, ` by ${e.tool} [${e.call_id}]`) : null,
        ),
      ),
    ),
  model_start: (e) =>
    h(
      "p",
      null,
      h("code", null, `${e.model.provider}/${e.model.name}`),
      ` asked with ${e.message_count} messages` +
        (e.tools && e.tools.length ? ` and ${e.tools.length} tools` : e.tools_as_in ? " and the tools of its last call" : ""),
    ),
  model_end: (e) => [
    h(
      "p",
      null,
      h("code", null, `${e.model.provider}/${e.model.name}`),
      ` ${e.finish_reason || ""}`,
      e.latency_ms !== null && e.latency_ms !== undefined ? ` in ${e.latency_ms} ms` : "",
    ),
    h(
      "p",
      { class: "usage" },
      `tokens: ${e.usage.input_tokens} in, ${e.usage.output_tokens} out, ${e.usage.total_tokens} total`,
    ),
    e.error ? h("p", { class: "error" }, `${e.error_type || "error"}: ${e.error}`) : null,
  ],
  invocation_start: (e) => h("p", null, `${e.agent_name} starts `, h("span", { class: "call-id" }, e.invocation_id)),
  invocation_resume: (e) => h("p", null, "resumes ", h("span", { class: "call-id" }, e.invocation_id)),
  invocation_yield: (e) =>
    h(
      "ul",
      { class: "pending" },
      (e.pending || []).map((c) =>
        h("li", null, "waits for ", h("code", { class: "tool" }, c.name), " ", h("span", { class: "call-id" }, c.call_id)),
      ),
    ),
  invocation_end: (e) => [
    h("p", null, h("span", { class: `badge status-${e.status}` }, e.status)),
    e.output_text ? h("p", { class: "text" }, e.output_text) : null,
    e.error ? h("p", { class: "error" }, `${e.error_type || "error"}: ${e.error}`) : null,
  ],
  session_forked: (e) =>
    h(
      "p",
      null,
      "forked from ",
      link(sessionPath(e.from_session_id), e.from_session_id),
      e.at_event_id ? ` at event ${e.at_event_id}` : "",
      `: ${e.reason}`,
    ),
};

function unknown(e) {
  return compact(e);
}

/** The invocation tree: each invocation with its model calls and tool calls, as far as the ledger is loaded. */
export function invocationTree(sessionId, invocations, events) {
  const children = new Map(invocations.map((node) => [node.invocation_id, []]));
  const results = new Map();
  events.forEach((e, index) => {
    if (e.type === "tool_result") results.set(e.call_id, { e, index });
  });
  events.forEach((e, index) => {
    const list = children.get(e.invocation_id);
    if (!list) return;
    if (e.type === "model_end") {
      list.push(
        h(
          "li",
          { class: "node model" },
          link(eventPath(sessionId, index), `#${index}`),
          ` model ${e.model.name}: ${e.finish_reason || e.error_type || ""}, ${e.usage.total_tokens} tokens`,
        ),
      );
    } else if (e.type === "tool_call") {
      const result = results.get(e.call_id);
      const outcome = !result ? "no result yet" : result.e.error ? "failed" : "ok";
      list.push(
        h(
          "li",
          { class: `node tool outcome-${outcome.replaceAll(" ", "-")}` },
          link(eventPath(sessionId, index), `#${index}`),
          " ",
          h("code", { class: "tool" }, e.name),
          ` ${outcome}`,
          result ? [" (", link(eventPath(sessionId, result.index), `#${result.index}`), ")"] : null,
        ),
      );
    } else if (e.type === "invocation_yield" || e.type === "invocation_resume") {
      list.push(h("li", { class: "node pause" }, link(eventPath(sessionId, index), `#${index}`), ` ${LABELS[e.type]}`));
    }
  });
  return h(
    "ul",
    { class: "tree", id: "invocations" },
    invocations.map((node) =>
      h(
        "li",
        { class: "node invocation", dataset: { invocation: node.invocation_id } },
        h(
          "details",
          { open: true },
          h(
            "summary",
            null,
            h("strong", null, node.agent_name),
            " ",
            h("span", { class: `badge status-${node.status}` }, node.status),
            ` events ${node.start_index}–${node.end_index ?? "…"}, ${node.model_calls} model calls `,
            link(eventPath(sessionId, node.start_index), "start"),
          ),
          h("ul", null, children.get(node.invocation_id)),
        ),
      ),
    ),
  );
}

