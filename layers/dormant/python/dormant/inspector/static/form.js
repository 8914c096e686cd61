// A form built from a yielded tool's answer schema (the JSON schema pydantic gives for its yield_schema).
// It checks what JSON schema says (required keys, types, enums, lengths, bounds) before sending; the API
// checks the answer again with the tool's own model, and its 400 is shown beside the form.

import { errorText, h } from "./dom.js";

let counter = 0;

export function schemaForm(schema, { submitLabel, onSubmit }) {
  const root = schema || {};
  const top = fieldFor(null, root, root, true, "answer");
  const status = h("p", { class: "form-error", role: "alert" });
  const button = h("button", { type: "submit" }, submitLabel);
  const form = h("form", { class: "schema-form", novalidate: true }, top.element, status, button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.textContent = "";
    const read = top.read();
    if (!read.ok) {
      status.textContent = "Please correct the fields marked above.";
      return;
    }
    button.disabled = true;
    try {
      await onSubmit(read.value);
    } catch (error) {
      status.textContent = errorText(error);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

function resolve(schema, root) {
  let seen = 0;
  while (schema && schema.$ref && seen++ < 20) {
    const name = schema.$ref.split("/").pop();
    const { $ref, ...rest } = schema;
    schema = { ...((root.$defs || root.definitions || {})[name] || {}), ...rest };
  }
  return schema || {};
}

/** ``anyOf: [X, {type: null}]`` (pydantic's ``X | None``): X, and whether null is allowed. */
function unwrapNullable(schema, root) {
  const options = schema.anyOf || schema.oneOf;
  if (Array.isArray(options)) {
    const others = options.filter((option) => resolve(option, root).type !== "null");
    if (others.length === 1 && others.length < options.length) {
      const { anyOf, oneOf, ...rest } = schema;
      return { schema: { ...resolve(others[0], root), ...rest }, nullable: true };
    }
  }
  return { schema, nullable: schema.type === "null" };
}

function fieldFor(name, raw, root, required, path) {
  const { schema, nullable } = unwrapNullable(resolve(raw, root), root);
  const id = `f${++counter}`;
  const label = schema.title || name;
  const error = h("span", { class: "field-error", role: "alert" });
  const wrap = (control, hint) =>
    h(
      "div",
      { class: "field", "data-field": path },
      label ? h("label", { for: id }, label, required ? h("span", { class: "required", title: "required" }, " *") : null) : null,
      control,
      schema.description && name ? h("small", { class: "hint" }, schema.description) : null,
      hint,
      error,
    );
  const fail = (message) => {
    error.textContent = message;
    return { ok: false };
  };
  const ok = (value) => {
    error.textContent = "";
    return { ok: true, value };
  };
  const empty = () => (nullable ? ok(null) : required ? fail("required") : ok(undefined));

  if (schema.type === "object" || schema.properties) {
    const needed = new Set(schema.required || []);
    const children = Object.entries(schema.properties || {}).map(([key, child]) => [
      key,
      fieldFor(key, child, root, needed.has(key), `${path}.${key}`),
    ]);
    const element = h(
      name === null ? "div" : "fieldset",
      { class: "object", "data-field": path },
      name !== null ? h("legend", null, label) : null,
      children.map(([, child]) => child.element),
    );
    return {
      element,
      read() {
        const result = {};
        let good = true;
        for (const [key, child] of children) {
          const read = child.read();
          if (!read.ok) good = false;
          else if (read.value !== undefined) result[key] = read.value;
        }
        return good ? { ok: true, value: result } : { ok: false };
      },
    };
  }

  if (schema.type === "boolean") {
    const choices = [["true", "yes"], ["false", "no"], ...(nullable ? [["null", "no answer"]] : [])];
    const inputs = choices.map(([v, text]) =>
      h("label", { class: "choice" }, h("input", { type: "radio", name: id, value: v, "data-choice": v }), ` ${text}`),
    );
    if (schema.default !== undefined && schema.default !== null) {
      inputs.find((l) => l.firstChild.value === String(schema.default)).firstChild.checked = true;
    }
    return {
      element: wrap(h("div", { id, class: "choices", role: "radiogroup" }, inputs)),
      read() {
        const picked = inputs.map((l) => l.firstChild).find((input) => input.checked);
        if (!picked) return required ? fail("choose one") : ok(undefined);
        return ok(JSON.parse(picked.value));
      },
    };
  }

  if (Array.isArray(schema.enum)) {
    const select = h(
      "select",
      { id, name: path },
      h("option", { value: "" }, "— choose —"),
      schema.enum.map((v, i) => h("option", { value: String(i) }, String(v))),
    );
    if (schema.default !== undefined) {
      const at = schema.enum.indexOf(schema.default);
      if (at >= 0) select.value = String(at);
    }
    return {
      element: wrap(select),
      read: () => (select.value === "" ? empty() : ok(schema.enum[Number(select.value)])),
    };
  }

  if (schema.type === "integer" || schema.type === "number") {
    const input = h("input", { id, name: path, type: "number", step: schema.type === "integer" ? "1" : "any" });
    if (typeof schema.default === "number") input.value = String(schema.default);
    return {
      element: wrap(input),
      read() {
        if (input.value.trim() === "") return empty();
        const number = Number(input.value);
        if (!Number.isFinite(number)) return fail("a number");
        if (schema.type === "integer" && !Number.isInteger(number)) return fail("a whole number");
        if (schema.minimum !== undefined && number < schema.minimum) return fail(`at least ${schema.minimum}`);
        if (schema.maximum !== undefined && number > schema.maximum) return fail(`at most ${schema.maximum}`);
        return ok(number);
      },
    };
  }

  if (schema.type === "string") {
    const long = (schema.maxLength || 0) > 200 || /note|reason|comment|message/i.test(name || "");
    const input = long ? h("textarea", { id, name: path, rows: 2 }) : h("input", { id, name: path, type: "text" });
    if (typeof schema.default === "string") input.value = schema.default;
    return {
      element: wrap(input),
      read() {
        const text = input.value;
        if (text === "" && (nullable || !required)) return empty();
        if (schema.minLength !== undefined && text.length < schema.minLength) {
          return fail(`at least ${schema.minLength} characters`);
        }
        if (schema.maxLength !== undefined && text.length > schema.maxLength) {
          return fail(`at most ${schema.maxLength} characters`);
        }
        if (schema.pattern && !new RegExp(schema.pattern, "u").test(text)) return fail(`must match ${schema.pattern}`);
        return ok(text);
      },
    };
  }

  // Anything else (arrays, unions, no schema at all): the answer as JSON text.
  const area = h("textarea", { id, name: path, rows: 3, class: "json-input", placeholder: "JSON" });
  if (schema.default !== undefined) area.value = JSON.stringify(schema.default);
  return {
    element: wrap(area, h("small", { class: "hint" }, "JSON")),
    read() {
      if (area.value.trim() === "") return empty();
      try {
        return ok(JSON.parse(area.value));
      } catch {
        return fail("not valid JSON");
      }
    },
  };
}
