// The approval inbox: the pending actions this principal may see, each with a form generated
// from its submit schema, checked here and again by the server. Plain JavaScript, no build step,
// nothing fetched from elsewhere. Credentials: a bearer token given once as #token=... (kept in
// sessionStorage, removed from the address bar), or whatever cookie the application uses.
"use strict";

(function () {
  const POLL_MS = 1000;
  const state = { actions: new Map(), selected: null, form: null, busy: false, wanted: null };
  const $ = (id) => document.getElementById(id);

  // -- credentials and requests ------------------------------------------------------------

  // #token=... is kept in sessionStorage and taken out of the address bar; #action=ID (a deep
  // link, e.g. from an MCP elicitation) opens that action once it is listed.
  (function takeFragment() {
    const params = new Map();
    for (const pair of location.hash.slice(1).split("&")) {
      const at = pair.indexOf("=");
      if (at < 1) continue;
      try {
        // decodeURIComponent, not URLSearchParams: a "+" in a token stays a "+"
        params.set(decodeURIComponent(pair.slice(0, at)), decodeURIComponent(pair.slice(at + 1)));
      } catch (error) {
        /* a malformed escape: ignored */
      }
    }
    const token = params.get("token");
    if (token) sessionStorage.setItem("blade-inbox-token", token);
    state.wanted = params.get("action") || null;
    if (token) {
      const rest = state.wanted ? "#action=" + encodeURIComponent(state.wanted) : "";
      history.replaceState(null, "", location.pathname + location.search + rest);
    }
  })();

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem("blade-inbox-token");
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers, credentials: "same-origin" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = { code: "BAD_RESPONSE", message: "The server's answer is not JSON." };
    }
    return { status: response.status, ok: response.ok, data };
  }

  function setStatus(text) {
    $("status").textContent = text;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "className") node.className = value;
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  // -- the list, kept live ------------------------------------------------------------------

  async function refresh() {
    let answer;
    try {
      answer = await api("GET", "v1/actions");
    } catch (error) {
      setStatus("offline: retrying");
      return;
    }
    if (!answer.ok) {
      setStatus(answer.data.code + ": " + answer.data.message);
      return;
    }
    const seen = new Map(answer.data.actions.map((a) => [a.action_id, a]));
    state.actions = seen;
    renderList();
    if (state.selected && !seen.has(state.selected)) showGone(state.selected);
    setStatus(seen.size + " pending · updated " + new Date().toLocaleTimeString());
    if (state.wanted) {
      const wanted = state.wanted;
      state.wanted = null;
      if (seen.has(wanted)) select(wanted);
      else setStatus("The action " + wanted + " is not pending for you · " + seen.size + " pending");
    }
  }

  // Updated in place, keyed by action id: an item being clicked is never replaced under the
  // pointer by the next refresh.
  function renderList() {
    const list = $("actions");
    const now = Date.now() / 1000;
    const existing = new Map([...list.children].map((item) => [item.dataset.actionId, item]));
    let previous = null;
    for (const action of state.actions.values()) {
      let item = existing.get(action.action_id);
      existing.delete(action.action_id);
      if (!item) {
        const button = el(
          "button",
          { type: "button" },
          el("span", { className: "name", text: action.name }),
          el("span", { className: "meta" }),
        );
        button.addEventListener("click", () => select(action.action_id));
        item = el("li", { "data-action-id": action.action_id }, button);
      }
      const since = action.suspended_at.replace("T", " ").slice(0, 19);
      const left = action.expires_at ? Math.max(0, Math.round(action.expires_at - now)) : null;
      const meta = "run " + action.run_id + " · since " + since + (left === null ? "" : " · expires in " + left + " s");
      const metaNode = item.querySelector(".meta");
      if (metaNode.textContent !== meta) metaNode.textContent = meta;
      item.classList.toggle("selected", action.action_id === state.selected);
      const expected = previous ? previous.nextSibling : list.firstChild;
      if (item !== expected) list.insertBefore(item, expected);
      previous = item;
    }
    for (const stale of existing.values()) stale.remove();
    $("empty").hidden = state.actions.size > 0;
  }

  function showGone(actionId) {
    if ($("detail").hidden || state.selected !== actionId || state.busy) return;
    if (!$("result").hidden) return; // resolved here: the result stays shown
    const notice = $("detail-gone");
    notice.textContent = "This action was resolved elsewhere, or expired; it no longer waits.";
    notice.hidden = false;
    $("submit-form").hidden = true;
  }

  // -- one action ---------------------------------------------------------------------------

  function select(actionId) {
    const action = state.actions.get(actionId);
    if (!action) return;
    state.selected = actionId;
    renderList();
    $("detail").hidden = false;
    $("detail-title").textContent = action.name;
    $("detail-description").textContent = action.description || "";
    const facts = $("detail-facts");
    facts.replaceChildren();
    for (const [key, value] of [
      ["action", action.action_id],
      ["call", action.call_id],
      ["run", action.run_id],
      ["tool", action.spec_id],
      ["waiting since", action.suspended_at],
    ]) {
      facts.append(el("dt", { text: key }), el("dd", { text: value }));
    }
    $("detail-payload").textContent = JSON.stringify(action.input, null, 2);
    $("detail-gone").hidden = true;
    $("result").hidden = true;
    $("submit-form").hidden = false;
    showErrors([]);
    state.form = buildForm(action.submit_schema);
    $("form-fields").replaceChildren(state.form.node);
  }

  function showErrors(errors) {
    const box = $("form-errors");
    box.replaceChildren(...errors.map((e) => el("li", { text: e })));
    box.hidden = errors.length === 0;
  }

  async function submit(event) {
    event.preventDefault();
    const action = state.actions.get(state.selected);
    if (!action || !state.form || state.busy) return;
    for (const node of document.querySelectorAll(".invalid")) node.classList.remove("invalid");
    const value = state.form.read();
    const errors = [];
    check(state.form.root, state.form.root, value, "", errors);
    if (errors.length) {
      showErrors(errors.map((e) => e.text));
      for (const e of errors) {
        const input = document.querySelector('[data-path="' + CSS.escape(e.path) + '"]');
        if (input) input.classList.add("invalid");
      }
      return;
    }
    showErrors([]);
    state.busy = true;
    $("submit-button").disabled = true;
    try {
      const answer = await api("POST", "v1/actions/" + encodeURIComponent(action.action_id) + "/submit", value);
      if (answer.status === 422 || answer.status === 400 || answer.status === 413) {
        showErrors([answer.data.code + ": " + answer.data.message]);
        return;
      }
      showResult(answer);
    } finally {
      state.busy = false;
      $("submit-button").disabled = false;
    }
    refresh();
  }

  async function cancel() {
    const action = state.actions.get(state.selected);
    if (!action || state.busy) return;
    state.busy = true;
    try {
      const answer = await api("POST", "v1/actions/" + encodeURIComponent(action.action_id) + "/cancel", {
        reason: "cancelled in the approval inbox",
      });
      showResult(answer);
    } finally {
      state.busy = false;
    }
    refresh();
  }

  function showResult(answer) {
    const data = answer.data;
    $("submit-form").hidden = true;
    $("result").hidden = false;
    const status = $("result-status");
    if (data.status === "success") {
      status.textContent = "Done: the tool resumed and returned its output.";
      status.className = "success";
      $("result-body").textContent = JSON.stringify(data.output, null, 2);
    } else if (data.status === "pending") {
      status.textContent = "The tool resumed and waits again: " + data.action.name;
      status.className = "";
      $("result-body").textContent = JSON.stringify(data.action.input, null, 2);
    } else {
      status.textContent = (data.code || "ERROR") + ": " + (data.message || "");
      status.className = "error";
      $("result-body").textContent = "";
    }
  }

  // -- forms from JSON Schemas --------------------------------------------------------------

  function resolve(root, schema) {
    let seen = 0;
    while (schema && typeof schema.$ref === "string" && schema.$ref.startsWith("#") && seen++ < 32) {
      let target = root;
      for (const raw of schema.$ref.slice(1).split("/").filter(Boolean)) {
        const part = raw.replace(/~1/g, "/").replace(/~0/g, "~");
        target = target && target[part];
      }
      const rest = Object.assign({}, schema);
      delete rest.$ref;
      schema = Object.assign({}, target || {}, rest);
    }
    return schema || {};
  }

  function typeOf(schema) {
    let type = schema.type;
    if (Array.isArray(type)) type = type.find((t) => t !== "null") || "null";
    if (!type && schema.enum) return "enum";
    if (!type && schema.properties) return "object";
    if (!type && schema.const !== undefined) return "const";
    return type || "json";
  }

  function label(text, required, forId) {
    const node = el("label", { for: forId, text });
    if (required) node.append(el("span", { className: "required-mark", text: "*", title: "required" }));
    return node;
  }

  let counter = 0;

  function buildForm(schema) {
    const root = schema;
    const built = field(root, root, "", "answer", true);
    return { root, node: built.node, read: built.read };
  }

  // Each field returns its node and read(): the value, or undefined when left empty.
  function field(root, raw, path, name, required) {
    const schema = resolve(root, raw);
    const id = "f" + ++counter;
    const title = schema.title || name;
    const hint = schema.description ? el("span", { className: "hint", text: schema.description }) : null;
    const type = schema.enum ? "enum" : typeOf(schema);
    if (type === "object") {
      const fieldset = el("fieldset", { "data-path": path });
      fieldset.append(el("legend", { text: title }));
      if (required && path) fieldset.querySelector("legend").append(el("span", { className: "required-mark", text: "*" }));
      if (hint) fieldset.append(hint);
      const needed = new Set(schema.required || []);
      const readers = [];
      for (const [key, sub] of Object.entries(schema.properties || {})) {
        const child = field(root, sub, path + "/" + key, key, needed.has(key));
        fieldset.append(child.node);
        readers.push([key, child.read]);
      }
      return {
        node: fieldset,
        read() {
          const out = {};
          for (const [key, read] of readers) {
            const value = read();
            if (value !== undefined) out[key] = value;
          }
          return out;
        },
      };
    }
    if (type === "array") {
      const box = el("fieldset", { "data-path": path, className: "array" });
      const legend = el("legend", { text: title });
      if (required) legend.append(el("span", { className: "required-mark", text: "*" }));
      box.append(legend);
      if (hint) box.append(hint);
      const items = el("div", { className: "items" });
      const rows = [];
      const add = el("button", { type: "button", className: "small", text: "Add " + name });
      const itemSchema = schema.items || {};
      function addRow(initial) {
        const index = rows.length;
        const child = field(root, itemSchema, path + "/" + index, name + " " + (index + 1), true);
        const remove = el("button", { type: "button", className: "small", text: "Remove" });
        const row = el("div", { className: "array-item" }, child.node, remove);
        const entry = { row, read: child.read };
        remove.addEventListener("click", () => {
          rows.splice(rows.indexOf(entry), 1);
          row.remove();
        });
        rows.push(entry);
        items.append(row);
        return initial;
      }
      add.addEventListener("click", () => addRow());
      for (let i = 0; i < (schema.minItems || 0); i++) addRow();
      box.append(items, add);
      return {
        node: box,
        read() {
          const values = rows.map((r) => r.read());
          return values.length || required ? values : undefined;
        },
      };
    }
    const wrap = el("div", { className: "field" });
    if (type === "boolean") {
      const input = el("input", { type: "checkbox", id, "data-path": path, "aria-required": required });
      if (schema.default === true) input.checked = true;
      wrap.classList.add("checkbox");
      wrap.append(input, label(title, required, id));
      if (hint) wrap.append(hint);
      return { node: wrap, read: () => input.checked };
    }
    wrap.append(label(title, required, id));
    if (type === "enum" || type === "const") {
      const options = type === "const" ? [schema.const] : schema.enum;
      const select = el("select", { id, "data-path": path, "aria-required": required });
      select.append(el("option", { value: "", text: required ? "choose…" : "(none)" }));
      options.forEach((option, index) => {
        select.append(el("option", { value: String(index), text: option === null ? "null" : String(option) }));
      });
      if (options.length === 1 && required) select.value = "0";
      wrap.append(select);
      if (hint) wrap.append(hint);
      return { node: wrap, read: () => (select.value === "" ? undefined : options[Number(select.value)]) };
    }
    if (type === "integer" || type === "number") {
      const input = el("input", {
        type: "number",
        id,
        "data-path": path,
        "aria-required": required,
        step: type === "integer" ? "1" : "any",
        min: schema.minimum,
        max: schema.maximum,
      });
      wrap.append(input);
      if (hint) wrap.append(hint);
      return {
        node: wrap,
        read() {
          const text = input.value.trim();
          if (text === "") return undefined;
          const number = Number(text);
          return Number.isFinite(number) ? number : text;
        },
      };
    }
    if (type === "string") {
      const long = (schema.maxLength || 0) > 200 || schema.format === "textarea";
      const input = el(long ? "textarea" : "input", {
        type: long ? undefined : "text",
        id,
        "data-path": path,
        "aria-required": required,
        maxlength: schema.maxLength,
        placeholder: schema.format || (schema.pattern ? "pattern " + schema.pattern : undefined),
      });
      wrap.append(input);
      if (hint) wrap.append(hint);
      return {
        node: wrap,
        read() {
          const text = input.value;
          return text === "" ? undefined : text;
        },
      };
    }
    // anything else (unions, untyped values): JSON text
    const area = el("textarea", { id, "data-path": path, rows: 3, placeholder: "JSON" });
    wrap.append(area, el("span", { className: "hint", text: "a JSON value" + (schema.description ? ": " + schema.description : "") }));
    return {
      node: wrap,
      read() {
        const text = area.value.trim();
        if (text === "") return undefined;
        try {
          return JSON.parse(text);
        } catch (error) {
          return { __invalid_json__: text };
        }
      },
    };
  }

  // The browser's check: the common keywords; the server checks the whole schema again.
  function check(root, raw, value, path, errors) {
    const schema = resolve(root, raw);
    const where = path || "the answer";
    const say = (text) => errors.push({ path, text: where + ": " + text });
    if (value && typeof value === "object" && "__invalid_json__" in value) return say("is not valid JSON");
    let types = schema.type === undefined ? [] : [].concat(schema.type);
    if (types.length) {
      const actual = value === null ? "null" : Array.isArray(value) ? "array" : typeof value;
      const ok = types.some(
        (t) => t === actual || (t === "integer" && Number.isInteger(value)) || (t === "number" && actual === "number"),
      );
      if (!ok) return say("must be " + types.join(" or "));
    }
    if (schema.enum && !schema.enum.some((option) => JSON.stringify(option) === JSON.stringify(value))) {
      return say("must be one of " + schema.enum.map((o) => JSON.stringify(o)).join(", "));
    }
    if (schema.const !== undefined && JSON.stringify(schema.const) !== JSON.stringify(value)) {
      return say("must be " + JSON.stringify(schema.const));
    }
    if (typeof value === "string") {
      if (schema.minLength !== undefined && [...value].length < schema.minLength) say("needs at least " + schema.minLength + " characters");
      if (schema.maxLength !== undefined && [...value].length > schema.maxLength) say("allows at most " + schema.maxLength + " characters");
      if (schema.pattern) {
        try {
          if (!new RegExp(schema.pattern, "u").test(value)) say("must match " + schema.pattern);
        } catch (error) {
          /* a pattern this browser cannot compile: the server decides */
        }
      }
    }
    if (typeof value === "number") {
      if (schema.minimum !== undefined && value < schema.minimum) say("must be at least " + schema.minimum);
      if (schema.maximum !== undefined && value > schema.maximum) say("must be at most " + schema.maximum);
      if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum) say("must be more than " + schema.exclusiveMinimum);
      if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum) say("must be less than " + schema.exclusiveMaximum);
    }
    if (Array.isArray(value)) {
      if (schema.minItems !== undefined && value.length < schema.minItems) say("needs at least " + schema.minItems + " items");
      if (schema.maxItems !== undefined && value.length > schema.maxItems) say("allows at most " + schema.maxItems + " items");
      if (schema.items && typeof schema.items === "object") {
        value.forEach((item, index) => check(root, schema.items, item, path + "/" + index, errors));
      }
    }
    if (value && typeof value === "object" && !Array.isArray(value)) {
      for (const key of schema.required || []) {
        if (!(key in value)) errors.push({ path: path + "/" + key, text: (path + "/" + key) + ": is required" });
      }
      for (const [key, sub] of Object.entries(schema.properties || {})) {
        if (key in value) check(root, sub, value[key], path + "/" + key, errors);
      }
    }
  }

  // -- start --------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("submit-form").addEventListener("submit", submit);
    $("cancel-button").addEventListener("click", cancel);
    refresh();
    setInterval(refresh, POLL_MS);
  });
})();
