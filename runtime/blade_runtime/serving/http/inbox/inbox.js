// The approval inbox: the pending actions this principal may see, each with a form generated
// from its submit schema, checked here and again by the server. Plain JavaScript, no build step,
// nothing fetched from elsewhere. Credentials: whatever cookie the application uses, or a bearer
// token the person pastes into the sign-in form (kept in sessionStorage). A token in a link is
// never taken: a link of someone else's would sign the person in as them.
//
// It speaks to people: problems are sentences beside their fields (never JSON pointers), the
// list says what each action is about, who asked, how long it has waited and when it expires.
"use strict";

(function () {
  const POLL_MS = 1000; // how soon the list is looked at again after a change
  const POLL_MAX_MS = 15000; // backed off to this while nothing changes
  const PAGE = 50; // actions a page of the list holds
  const SUMMARY_FIELDS = 3; // scalar fields of a payload shown in the list
  const SUMMARY_CHARS = 60; // a string in the list is cut to this many characters
  const SOON_S = 300; // an expiry closer than this is shown as urgent
  const state = {
    actions: new Map(),
    selected: null,
    form: null,
    current: null, // the selected action, as last listed
    note: null, // said in the status line until an action is opened
    busy: false,
    wanted: null,
    checked: false, // a submit was tried: problems are re-checked as the person types
    serverErrors: [], // {field, text}: the server's, kept until their field is edited
    marked: new Set(), // fields showing a problem now
    pages: 1, // pages of the list the person asked for ("Show more")
    more: null, // the cursor of the page after the last one shown
    delay: POLL_MS, // before the next look at the list
    timer: null,
    polling: false, // a look is under way: the next one waits for it
    again: false, // a look was asked for while one was under way
    tools: null, // the tools the principal may call (the tool filter offers them)
  };
  const $ = (id) => document.getElementById(id);

  // -- credentials and requests ------------------------------------------------------------

  // #action=ID (a deep link, e.g. from an MCP elicitation) opens that action once it is listed.
  // A #token=... is taken out of the address bar and never used.
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
    state.wanted = params.get("action") || null;
    if (params.has("token")) {
      state.linkToken = true;
      const rest = state.wanted ? "#action=" + encodeURIComponent(state.wanted) : "";
      history.replaceState(null, "", location.pathname + location.search + rest);
    }
  })();

  const TOKEN_KEY = "blade-inbox-token";

  // Asked for when the API answers 401: the token is typed (or pasted) by the person.
  function showSignIn(message) {
    const section = $("sign-in");
    const first = section.hidden;
    section.hidden = false;
    $("list-pane").hidden = true;
    $("placeholder").hidden = true;
    $("detail").hidden = true;
    const note = $("sign-in-note");
    if (first && state.linkToken) {
      message =
        "The link you followed carried an access token. The inbox does not take tokens from " +
        "links: if it is yours, paste it below.";
    }
    if (message !== undefined) {
      note.textContent = message;
      note.hidden = !message;
    }
    if (first) $("sign-in-title").focus();
  }

  function signedIn() {
    if (!$("sign-in").hidden) {
      $("sign-in").hidden = true;
      $("list-pane").hidden = false;
      if (!state.selected) $("placeholder").hidden = false;
      $("list-title").focus();
    }
    $("sign-out").hidden = !sessionStorage.getItem(TOKEN_KEY);
  }

  function signIn(event) {
    event.preventDefault();
    const input = $("token-input");
    const token = input.value.trim();
    const error = $("token-error");
    if (!token) {
      error.textContent = "Enter your access token";
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      $("token-field").classList.add("has-error");
      input.focus();
      return;
    }
    error.hidden = true;
    input.removeAttribute("aria-invalid");
    $("token-field").classList.remove("has-error");
    sessionStorage.setItem(TOKEN_KEY, token);
    input.value = "";
    state.linkToken = false;
    state.signingIn = true;
    state.tools = null;
    lookNow();
  }

  function signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    state.actions = new Map();
    state.selected = null;
    renderList();
    showSignIn("You signed out.");
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
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
    setText($("status"), text);
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

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  // -- words --------------------------------------------------------------------------------

  const ACRONYMS = /^(id|ok|url|uri|ip|api|json|html|sms|vat|iban)$/i;

  // "total_minor" -> "Total minor", "customerId" -> "Customer ID"
  function humanize(key) {
    const words = String(key)
      .replace(/^@/, "")
      .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
      .split(/[\s_\-.]+/)
      .filter(Boolean)
      .map((w) => (ACRONYMS.test(w) ? w.toUpperCase() : w.toLowerCase()));
    if (!words.length) return String(key);
    words[0] = words[0].charAt(0).toUpperCase() + words[0].slice(1);
    return words.join(" ");
  }

  function sentence(text) {
    const trimmed = String(text).trim();
    return trimmed.charAt(0).toUpperCase() + trimmed.slice(1);
  }

  function cut(text, chars) {
    const letters = [...String(text)];
    return letters.length <= chars ? letters.join("") : letters.slice(0, chars - 1).join("") + "…";
  }

  function scalarText(value) {
    if (value === null) return "—";
    if (typeof value === "boolean") return value ? "yes" : "no";
    return String(value);
  }

  const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
  const isScalar = (value) => value === null || typeof value !== "object";

  // -- time ---------------------------------------------------------------------------------

  // The store writes ISO 8601 with microseconds: Date.parse wants at most milliseconds.
  function parseTime(text) {
    return typeof text === "string" ? Date.parse(text.replace(/(\.\d{3})\d+/, "$1")) : NaN;
  }

  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min" + (m < 5 && s % 60 ? " " + (s % 60) + " s" : "");
    const h = Math.floor(m / 60);
    if (h < 24) return h + " h" + (m % 60 ? " " + (m % 60) + " min" : "");
    const d = Math.floor(h / 24);
    return d + (d === 1 ? " day" : " days") + (h % 24 ? " " + (h % 24) + " h" : "");
  }

  function when(ms) {
    const date = new Date(ms);
    const today = new Date().toDateString() === date.toDateString();
    const time = date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    return today ? time : date.toLocaleDateString([], { day: "numeric", month: "short" }) + " " + time;
  }

  // Seconds waited, and seconds left (null: it does not expire).
  function timing(action) {
    const now = Date.now();
    const since = parseTime(action.suspended_at);
    const waited = Number.isFinite(since) ? (now - since) / 1000 : null;
    const left = typeof action.expires_at === "number" ? action.expires_at - now / 1000 : null;
    return { since, waited, left };
  }

  function expiryText(left) {
    return left > 0.5 ? "expires in " + duration(left) : "expiring now";
  }

  // -- what an action is about -------------------------------------------------------------

  function isPermission(action) {
    return typeof action.point === "string" && action.point.startsWith("@permission");
  }

  function titleOf(action) {
    const tool = action.title || action.tool || action.name; // its display name, if it has one
    if (action.point === "@permission") return tool + " · permission to run";
    if (isPermission(action)) return tool + " · permission for a step";
    if (action.point === null || action.point === undefined) return tool + " · its result";
    return tool + " · " + humanize(action.point).toLowerCase();
  }

  // The first few scalar fields, depth first: "Order ID: ord_1 · Total minor: 4200".
  function scalars(value, limit) {
    const found = [];
    (function walk(node, key) {
      if (found.length >= limit) return;
      if (isObject(node)) {
        for (const [k, v] of Object.entries(node)) walk(v, k);
      } else if (Array.isArray(node)) {
        if (node.length && node.every((item) => isScalar(item) && item !== null)) {
          found.push(humanize(key) + ": " + cut(node.map(scalarText).join(", "), SUMMARY_CHARS));
        }
      } else if (node !== null && key !== null && node !== "") {
        found.push(humanize(key) + ": " + cut(scalarText(node), SUMMARY_CHARS));
      }
    })(value, null);
    return found;
  }

  const LEADS = ["prompt", "question", "message", "title", "summary"];

  function summaryOf(action) {
    const payload = action.input;
    if (isPermission(action) && isObject(payload)) {
      if (action.point !== "@permission") return cut(payload.prompt || "", SUMMARY_CHARS * 2);
      const input = scalars(payload.input, SUMMARY_FIELDS);
      return input.length ? "With " + input.join(" · ") : "With no input";
    }
    if (isScalar(payload)) return payload === null ? "" : cut(scalarText(payload), SUMMARY_CHARS);
    // a question the tool put to people leads, in its own words; then the first other fields
    const lead = isObject(payload) ? LEADS.find((key) => typeof payload[key] === "string" && payload[key]) : undefined;
    if (lead === undefined) return scalars(payload, SUMMARY_FIELDS).join(" · ");
    const rest = Object.assign({}, payload);
    delete rest[lead];
    const parts = [cut(payload[lead], SUMMARY_CHARS * 2), ...scalars(rest, SUMMARY_FIELDS - 1)];
    return parts.join(" · ");
  }

  // A JSON value as people read it: labelled values, nested lists for nested objects.
  function renderValue(value, raw, root) {
    const schema = raw ? resolve(root, raw) : {};
    if (isObject(value)) {
      const entries = Object.entries(value).filter(([, item]) => item !== null); // nothing to say
      if (!entries.length) return el("span", { className: "nothing", text: "(nothing)" });
      const list = el("dl", { className: "values" });
      const properties = schema.properties || {};
      for (const [key, item] of entries) {
        const sub = properties[key] ? resolve(root, properties[key]) : null;
        const title = (sub && sub.title) || humanize(key);
        list.append(el("dt", { text: title }), el("dd", {}, renderValue(item, sub, root)));
      }
      return list;
    }
    if (Array.isArray(value)) {
      if (!value.length) return el("span", { className: "nothing", text: "(none)" });
      if (value.every(isScalar)) return el("span", { className: "scalar", text: value.map(scalarText).join(", ") });
      const list = el("ol", { className: "values" });
      for (const item of value) list.append(el("li", {}, renderValue(item, schema.items, root)));
      return list;
    }
    return el("span", { className: "scalar", text: scalarText(value) });
  }

  // -- the list, kept live ------------------------------------------------------------------

  // The list as the server filters it: one page, or as many as "Show more" asked for, read one
  // after another (never two requests at once).
  function listQuery(cursor) {
    const params = new URLSearchParams({ limit: String(PAGE) });
    const tool = $("filter-tool").value;
    if (tool) params.set("tool", tool);
    const age = $("filter-age").value;
    if (age) {
      const [how, limit] = age.split(":");
      params.set(how === "lt" ? "waiting_under" : "waiting_over", limit);
    }
    if (cursor) params.set("cursor", cursor);
    return "v1/actions?" + params.toString();
  }

  async function listed() {
    const actions = [];
    let cursor = null;
    for (let page = 0; page < state.pages; page += 1) {
      const answer = await api("GET", listQuery(cursor));
      if (!answer.ok) return { answer };
      actions.push(...answer.data.actions);
      cursor = answer.data.next;
      if (!cursor) break;
    }
    return { answer: { ok: true, status: 200, data: { actions, next: cursor } } };
  }

  async function refresh() {
    let answer;
    try {
      answer = (await listed()).answer;
    } catch (error) {
      setStatus("Offline: retrying…");
      state.delay = Math.min(state.delay * 2, POLL_MAX_MS);
      return;
    }
    if (answer.status === 401) {
      setStatus("Sign in to see your actions (" + answer.data.code + ")");
      const refused = state.signingIn ? "That token was not accepted: check it and try again." : undefined;
      state.signingIn = false;
      showSignIn(refused);
      return;
    }
    if (!answer.ok) {
      setStatus("Could not load the list: " + answer.data.message + " (" + answer.data.code + ")");
      return;
    }
    state.signingIn = false;
    signedIn();
    if (state.tools === null) await loadTools();
    const seen = new Map(answer.data.actions.map((a) => [a.action_id, a]));
    const changed = [...seen.keys()].join() !== [...state.actions.keys()].join();
    // unchanged, it is looked at less and less often; a change brings it back to every second
    state.delay = changed ? POLL_MS : Math.min(Math.round(state.delay * 1.5), POLL_MAX_MS);
    state.actions = seen;
    state.more = answer.data.next;
    $("more").hidden = !state.more;
    renderFilters();
    renderList();
    if (state.selected && seen.has(state.selected)) renderFacts(seen.get(state.selected));
    if (state.selected && !seen.has(state.selected)) showGone(state.selected);
    const count = seen.size + (state.more ? "+" : "") + " waiting";
    if (state.wanted) {
      const wanted = state.wanted;
      state.wanted = null;
      if (!seen.has(wanted)) await fetchOne(wanted);
      if (state.actions.has(wanted)) select(wanted);
      else state.note = "The action " + wanted + " is not pending for you";
    }
    // a live region: it changes when the count does (or a note), not every second
    setStatus(state.note ? state.note + " · " + count : count);
    setText($("updated"), "updated " + new Date().toLocaleTimeString());
  }

  // An action a link names that is not on the pages shown: read on its own.
  async function fetchOne(actionId) {
    try {
      const answer = await api("GET", "v1/actions/" + encodeURIComponent(actionId));
      if (answer.ok && answer.data.state === "pending") state.actions.set(actionId, answer.data);
    } catch (error) {
      // offline: the note says it is not listed
    }
  }

  async function loadTools() {
    try {
      const answer = await api("GET", "v1/tools");
      state.tools = answer.ok ? answer.data.tools.map((tool) => tool.name) : [];
    } catch (error) {
      state.tools = null; // asked again at the next look
    }
  }

  // Look at the list, then again after a delay that grows while nothing changes; one look at a
  // time, and none while the page is hidden (a tab left open asks nothing of the server).
  async function poll() {
    clearTimeout(state.timer);
    if (state.polling) {
      state.again = true; // asked meanwhile (a filter, an answer): looked at once it is done
      return;
    }
    state.polling = true;
    state.again = false;
    try {
      if (document.visibilityState !== "hidden") await refresh();
    } finally {
      state.polling = false;
      state.timer = setTimeout(poll, state.again ? 0 : state.delay);
    }
  }

  function lookNow() {
    state.delay = POLL_MS;
    poll();
  }

  function filtersChanged() {
    state.pages = 1;
    renderList();
    lookNow();
  }

  function showMore() {
    state.pages += 1;
    lookNow();
  }

  // The tool filter offers the tools the principal may call and those listed now (and keeps a
  // chosen one that left).
  function renderFilters() {
    const select = $("filter-tool");
    const chosen = select.value;
    const tools = new Set([...(state.tools || []), ...[...state.actions.values()].map((a) => a.tool)]);
    if (chosen) tools.add(chosen);
    const wanted = ["", ...[...tools].sort()];
    const have = [...select.options].map((o) => o.value);
    if (have.join("\n") === wanted.join("\n")) return;
    select.replaceChildren(
      ...wanted.map((tool) => el("option", { value: tool, text: tool || "All tools" })),
    );
    select.value = chosen;
  }

  function passes(action) {
    const tool = $("filter-tool").value;
    if (tool && action.tool !== tool) return false;
    const age = $("filter-age").value;
    if (age) {
      const [how, limit] = age.split(":");
      const waited = timing(action).waited;
      if (waited === null) return false;
      if (how === "lt" && !(waited < Number(limit))) return false;
      if (how === "gt" && !(waited > Number(limit))) return false;
    }
    return true;
  }

  // Who asked and through which agent (seed 002's executing agent): "asked by ann via billing".
  function askedBy(action) {
    const parts = [];
    if (action.principal_id) parts.push("asked by " + action.principal_id);
    if (action.agent_id) parts.push((parts.length ? "via " : "from agent ") + action.agent_id);
    return parts.join(" ");
  }

  // Updated in place, keyed by action id: an item being clicked is never replaced under the
  // pointer by the next refresh.
  function renderList() {
    const list = $("actions");
    const existing = new Map([...list.children].map((item) => [item.dataset.actionId, item]));
    let previous = null;
    let shown = 0;
    for (const action of state.actions.values()) {
      if (!passes(action)) continue;
      shown += 1;
      let item = existing.get(action.action_id);
      existing.delete(action.action_id);
      if (!item) item = listItem(action);
      const { waited, left } = timing(action);
      setText(item.querySelector(".summary"), summaryOf(action));
      const who = item.querySelector(".who");
      setText(who, askedBy(action));
      who.hidden = !action.principal_id && !action.agent_id;
      setText(item.querySelector(".age"), waited === null ? "" : "waiting " + duration(waited));
      const expiry = item.querySelector(".expiry");
      setText(expiry, left === null ? "" : expiryText(left));
      expiry.hidden = left === null;
      expiry.classList.toggle("soon", left !== null && left < SOON_S);
      item.classList.toggle("selected", action.action_id === state.selected);
      const button = item.querySelector("button");
      if (action.action_id === state.selected) button.setAttribute("aria-current", "true");
      else button.removeAttribute("aria-current");
      const expected = previous ? previous.nextSibling : list.firstChild;
      if (item !== expected) list.insertBefore(item, expected);
      previous = item;
    }
    for (const stale of existing.values()) stale.remove();
    // the server filters: what it listed is what matches (a filter just changed may still
    // be on its way, and the loaded list is filtered here too meanwhile)
    const empty = $("empty");
    empty.hidden = shown > 0;
    const filtered = $("filter-tool").value || $("filter-age").value;
    setText(empty, filtered ? "Nothing waiting matches these filters." : "Nothing waits for you.");
    const count = shown + (state.more ? "+" : "");
    setText($("filter-count"), filtered && shown ? count + " waiting match these filters" : "");
  }

  function listItem(action) {
    const button = el(
      "button",
      { type: "button" },
      el("span", { className: "name", text: titleOf(action) }),
      el("span", { className: "summary" }),
      el(
        "span",
        { className: "meta" },
        el("span", { className: "who" }),
        el("span", { className: "age" }),
        el("span", { className: "expiry" }),
      ),
    );
    button.addEventListener("click", () => select(action.action_id));
    return el("li", { "data-action-id": action.action_id }, button);
  }

  // The open action left the list: say why, from its record.
  async function showGone(actionId) {
    if ($("detail").hidden || state.selected !== actionId || state.busy) return;
    if (!$("result").hidden || !$("detail-gone").hidden) return; // already said
    const notice = $("detail-gone");
    notice.textContent = "This action no longer waits: it was answered elsewhere, or expired.";
    notice.hidden = false;
    $("submit-form").hidden = true;
    showCancel(false);
    let answer;
    try {
      answer = await api("GET", "v1/actions/" + encodeURIComponent(actionId));
    } catch (error) {
      return;
    }
    if (!answer.ok || state.selected !== actionId) return;
    const record = answer.data;
    const at = parseTime(record.resolved_at);
    const time = Number.isFinite(at) ? " at " + when(at) : "";
    const said = {
      expired: "This action expired" + time + " without an answer; it no longer waits.",
      submitted: "Someone answered this" + time + "; it no longer waits.",
      cancelled: "The call was cancelled" + time + (record.reason ? ": " + record.reason : "") + ".",
      failed: "The call was ended as failed" + time + (record.reason ? ": " + record.reason : "") + ".",
    }[record.state];
    if (said) notice.textContent = said;
    const ended = { expired: "Expired", submitted: "Answered", cancelled: "Cancelled", failed: "Failed" };
    if (ended[record.state] && state.current) {
      renderFacts(state.current, [ended[record.state], Number.isFinite(at) ? when(at) : "—"]);
    }
  }

  // -- one action ---------------------------------------------------------------------------

  function select(actionId) {
    const action = state.actions.get(actionId);
    if (!action) return;
    state.selected = actionId;
    state.current = action;
    state.note = null;
    renderList();
    $("placeholder").hidden = true;
    $("detail").hidden = false;
    $("detail-title").textContent = titleOf(action);
    const payload = action.input;
    const prompt = isPermission(action) && isObject(payload) ? payload.prompt : null;
    $("detail-description").textContent = prompt || action.description || "";
    renderFacts(action);
    const ids = $("detail-ids");
    ids.replaceChildren();
    for (const [key, value] of [
      ["Action", action.action_id],
      ["Call", action.call_id],
      ["Run", action.run_id],
      ["Spec", action.spec_id],
    ]) {
      ids.append(el("dt", { text: key }), el("dd", { text: value }));
    }
    const shown = prompt ? Object.assign({}, payload, { prompt: null }) : payload; // said above
    $("detail-payload").replaceChildren(renderValue(shown));
    $("detail-json").textContent = JSON.stringify(payload, null, 2);
    $("detail-gone").hidden = true;
    $("result").hidden = true;
    $("submit-form").hidden = false;
    state.checked = false;
    state.serverErrors = [];
    state.marked = new Set();
    // a permission request's input is offered as it would run: changed, it runs as changed
    const editable = action.point === "@permission" && isObject(payload) && isObject(payload.input);
    state.form = buildForm(action.submit_schema, editable ? { input: payload.input } : undefined);
    const input = editable && state.form.field.children && state.form.field.children.get("input");
    if (input) {
      input.setTitle("The input it would run with");
      const note = "Change it only to run the tool with other values; as it is, it runs as asked.";
      input.node.querySelector("legend").after(el("span", { className: "hint", text: note }));
    }
    $("form-fields").replaceChildren(state.form.node);
    $("required-note").hidden = !state.form.node.querySelector(".required-mark");
    showSummary([]);
    showCancel(true);
    $("detail-title").focus(); // the person's attention: the action just opened
  }

  // "Cancel the call instead": apart from Submit, and asked again before it acts.
  function showCancel(shown) {
    $("cancel-area").hidden = !shown;
    $("cancel-confirm").hidden = true;
    $("cancel-button").hidden = false;
    $("cancel-button").setAttribute("aria-expanded", "false");
  }

  function askCancel() {
    $("cancel-confirm").hidden = false;
    $("cancel-button").hidden = true;
    $("cancel-button").setAttribute("aria-expanded", "true");
    $("cancel-confirm-title").focus();
  }

  function keepWaiting() {
    showCancel(true);
    $("cancel-button").focus();
  }

  // Who asked, how long it has waited, when it expires: kept current by every refresh. Once it
  // no longer waits, ``ended`` ([what, when]) says how it ended instead.
  function renderFacts(action, ended) {
    const { since, waited, left } = timing(action);
    const facts = [];
    if (action.principal_id) facts.push(["Asked by", action.principal_id, ""]);
    if (action.agent_id) facts.push(["Agent", action.agent_id, ""]);
    if (action.thread_id) facts.push(["Thread", action.thread_id, ""]);
    if (ended) {
      if (Number.isFinite(since)) facts.push(["Asked", when(since), ""]);
      facts.push(ended.concat(""));
    } else if (waited !== null) {
      facts.push(["Waiting", "for " + duration(waited) + ", since " + when(since), ""]);
    }
    if (left !== null && !ended) {
      const at = when(action.expires_at * 1000);
      facts.push(["Expires", left > 0.5 ? "in " + duration(left) + ", at " + at : "now", left < SOON_S ? "soon" : ""]);
    }
    facts.push(["Run", action.run_id, ""]);
    const list = $("detail-facts");
    const text = facts.map((f) => f.join("|")).join("\n");
    if (list.dataset.shown === text) return;
    list.dataset.shown = text;
    list.replaceChildren(
      ...facts.flatMap(([key, value, className]) => [
        el("dt", { text: key }),
        el("dd", { text: value, className: className || undefined }),
      ]),
    );
  }

  // -- problems, beside their fields --------------------------------------------------------

  // At the top of the form (GOV.UK's error summary): each problem, in the words shown beside
  // its field, as a link that moves to that field; then what concerns the whole answer.
  function showSummary(general) {
    const box = $("form-errors");
    const fields = [...state.marked].sort((a, b) =>
      a.node.compareDocumentPosition(b.node) & Node.DOCUMENT_POSITION_FOLLOWING ? -1 : 1,
    );
    const items = [];
    for (const field of fields) {
      const control = field.node.matches("input, select, textarea")
        ? field.node
        : field.node.querySelector("input, select, textarea, button");
      for (const text of field.said || []) {
        const link = el("a", { href: control ? "#" + control.id : "#", text });
        link.addEventListener("click", (event) => {
          event.preventDefault(); // the address bar keeps its #action
          if (control) {
            control.scrollIntoView({ block: "center" });
            control.focus();
          }
        });
        items.push(el("li", {}, link));
      }
    }
    items.push(...general.map((line) => el("li", { text: line })));
    // unchanged, left as it is: an alert rewritten on every keystroke is read out again, and a
    // page rewritten while a button is pressed loses the click
    const said = items.map((item) => item.textContent).join("\n");
    if (box.dataset.said === said && box.hidden === (items.length === 0)) return;
    box.dataset.said = said;
    $("form-errors-list").replaceChildren(...items);
    box.hidden = items.length === 0;
  }

  // A problem as GOV.UK words it: what to enter, naming the field ("Enter score", "Score must
  // be 10 or less"), the same words beside the field and in the summary.
  function phrase(field, text) {
    const titled = field.node.querySelector(".title-text");
    const label = titled ? titled.textContent : "this answer";
    const lower = /^[A-Z]{2}/.test(label) ? label : label.charAt(0).toLowerCase() + label.slice(1);
    const rest = (t) => t.charAt(0).toLowerCase() + t.slice(1);
    if (text === "Required") {
      if (field.node.matches("fieldset.array")) return "Add " + lower;
      if (field.node.matches("fieldset")) return "Fill in " + lower;
      if (field.node.querySelector("select")) return "Select " + lower;
      return "Enter " + lower;
    }
    if (/^(Must|Not) /.test(text)) return label + " " + rest(text).replace(/^not /, "is not ");
    if (/^Add at least/.test(text)) return text + " to " + lower;
    if (/^At most/.test(text)) return label + " can have " + rest(text);
    if (/^Each item/.test(text)) return "Each item of " + lower + rest(text).slice("each item".length);
    return label + ": " + rest(text);
  }

  // The browser's problems (checked now) and the server's (until their field is edited).
  function renderProblems(problems) {
    const form = state.form;
    const byField = new Map();
    const general = [];
    const add = (target, text) => {
      if (target === form.field && target.children) return general.push(text); // the whole answer
      const texts = byField.get(target) || [];
      if (!texts.includes(text)) texts.push(text);
      byField.set(target, texts);
    };
    for (const problem of problems) add(locate(form.field, problem.path), problem.text);
    // the server's, unless their field left the form (a removed array item)
    state.serverErrors = state.serverErrors.filter((problem) => problem.field.node.isConnected);
    for (const problem of state.serverErrors) add(problem.field, problem.text);
    for (const field of state.marked) if (!byField.has(field)) field.slot.set((field.said = []));
    for (const [field, texts] of byField) field.slot.set((field.said = texts.map((t) => phrase(field, t))));
    state.marked = new Set(byField.keys());
    showSummary(general);
  }

  // "Reviewer › Name": a field's title after those of the groups holding it.
  function fullTitle(field) {
    const names = [];
    for (let at = field; at && at.parent; at = at.parent) {
      const title = at.node.querySelector(".title-text");
      if (title) names.unshift(title.textContent);
    }
    return names.join(" › ");
  }

  function browserProblems() {
    const value = state.form.field.read();
    const problems = [];
    check(state.form.root, state.form.root, value, "", problems);
    return { value, problems };
  }

  // After a submit was tried, every edit checks again: a fixed field loses its message.
  function recheck(target) {
    if (!state.checked || !state.form) return;
    if (target) state.serverErrors = state.serverErrors.filter((e) => !e.field.node.contains(target));
    renderProblems(browserProblems().problems);
  }

  // The summary takes focus (and is read out): its links lead to each field.
  function focusFirstProblem() {
    const box = $("form-errors");
    if (box.hidden) return;
    box.scrollIntoView({ block: "start" });
    box.focus();
  }

  // The server's INVALID_SUBMISSION message ("... at /score: 3 is not a multiple of 2; at the
  // top level: ...") as problems in words, each at its field.
  function serverProblems(message) {
    const text = String(message || "")
      .replace(/^Invalid submission for [^:]*: /, "")
      .replace(/\.$/, "");
    const marks = [];
    const pattern = /(?:^|; )at (the top level|\/[^:]*): /g;
    let match;
    while ((match = pattern.exec(text))) marks.push({ start: match.index, end: pattern.lastIndex, where: match[1] });
    if (!marks.length) return [{ path: "", text: sentence(text) }];
    return marks.map((mark, index) => {
      const next = index + 1 < marks.length ? marks[index + 1].start : text.length;
      const body = text.slice(mark.end, next).replace(/; and \d+ more$/, "");
      return inWords(mark.where === "the top level" ? "" : mark.where, body);
    });
  }

  function inWords(path, body) {
    let m = /^the required property ("(?:[^"\\]|\\.)*") is missing$/.exec(body);
    if (m) {
      try {
        return { path: path + "/" + pointerPart(JSON.parse(m[1])), text: "Required" };
      } catch (error) {
        /* not a JSON string: said as it is */
      }
    }
    const rules = [
      [/^must be of type (.+) \(got [^)]*\)$/, (x) => typeWords(x[1].split(" or "))],
      [/^must match the pattern (.+) \(got .*\)$/s, (x) => "Not in the expected format (" + x[1] + ")"],
      [/^must be one of (.+) \(got .*\)$/s, (x) => "Must be one of " + x[1]],
      [/^must be exactly (.+) \(got .*\)$/s, (x) => "Must be " + x[1]],
      [/ is not a multiple of (\S+)$/, (x) => "Must be a multiple of " + x[1]],
      [/ is greater than or equal to the maximum of (\S+)$/, (x) => "Must be less than " + x[1]],
      [/ is less than or equal to the minimum of (\S+)$/, (x) => "Must be more than " + x[1]],
      [/ is greater than the maximum of (\S+)$/, (x) => "Must be at most " + x[1]],
      [/ is less than the minimum of (\S+)$/, (x) => "Must be at least " + x[1]],
      [/ is shorter than (\d+) characters?$/, (x) => "Must be at least " + x[1] + " characters"],
      [/ is longer than (\d+) characters?$/, (x) => "Must be at most " + x[1] + " characters"],
      [/ has non-unique elements$/, () => "Each item must be different"],
    ];
    for (const [rule, say] of rules) {
      m = rule.exec(body);
      if (m) return { path, text: say(m) };
    }
    return { path, text: sentence(body) };
  }

  async function submit(event) {
    event.preventDefault();
    const action = state.actions.get(state.selected);
    if (!action || !state.form || state.busy) return;
    state.checked = true;
    state.serverErrors = [];
    const { value, problems } = browserProblems();
    renderProblems(problems);
    if (problems.length) {
      focusFirstProblem();
      return;
    }
    state.busy = true;
    $("submit-button").disabled = true;
    try {
      const path = "v1/actions/" + encodeURIComponent(action.action_id) + "/submit";
      const answer = await api("POST", path, value);
      if (answer.status === 422 || answer.status === 400 || answer.status === 413) {
        state.serverErrors = serverProblems(answer.data.message).map((p) => ({
          field: locate(state.form.field, p.path),
          text: p.text,
        }));
        renderProblems(browserProblems().problems);
        focusFirstProblem();
        return;
      }
      showResult(answer, value, state.form.root);
    } catch (error) {
      showSummary(["The answer could not be sent (the server did not answer); try again."]);
      return;
    } finally {
      state.busy = false;
      $("submit-button").disabled = false;
    }
    lookNow();
  }

  async function cancel() {
    const action = state.actions.get(state.selected);
    if (!action || state.busy) return;
    state.busy = true;
    $("cancel-yes").disabled = true;
    try {
      const answer = await api("POST", "v1/actions/" + encodeURIComponent(action.action_id) + "/cancel", {
        reason: "cancelled in the approval inbox",
      });
      showResult(answer);
    } catch (error) {
      showSummary(["The call could not be cancelled (the server did not answer); try again."]);
      return;
    } finally {
      state.busy = false;
      $("cancel-yes").disabled = false;
    }
    lookNow();
  }

  // What was sent (in words), and what came of it.
  function showResult(answer, sent, schema) {
    const data = answer.data || {};
    $("submit-form").hidden = true;
    showCancel(false);
    $("result").hidden = false;
    const status = $("result-status");
    const output = $("result-output");
    const body = $("result-body");
    const refused = answer.status === 404 || answer.status === 409;
    if (!refused && state.current) {
      renderFacts(state.current, [sent === undefined ? "Cancelled" : "Answered", when(Date.now())]);
    }
    $("result-title").textContent = sent === undefined ? "Cancel" : refused ? "Not sent" : "Sent";
    $("confirmation").hidden = sent === undefined || refused;
    if (sent !== undefined) $("confirmation-values").replaceChildren(renderValue(sent, schema, schema));
    output.hidden = true;
    body.replaceChildren();
    status.className = "";
    if (data.status === "success") {
      status.textContent = "Your answer was sent; the tool went on and finished.";
      status.className = "success";
      output.hidden = data.output === undefined;
      body.replaceChildren(renderValue(data.output));
    } else if (data.status === "pending") {
      status.textContent = "Your answer was sent; the tool went on and now waits for another answer: ";
      status.className = "success";
      const next = el("button", { type: "button", className: "small", text: titleOf(data.action || {}) });
      next.addEventListener("click", () => {
        if (state.actions.has(data.action.action_id)) select(data.action.action_id);
        else state.wanted = data.action.action_id;
      });
      status.append(next);
    } else if (data.status === "skipped") {
      status.textContent = "Your answer was sent; the tool skipped the rest: " + (data.reason || "");
    } else if (sent === undefined && data.code === "CANCELLED") {
      status.textContent = "The call was cancelled.";
    } else if (refused) {
      status.textContent = "Not sent: " + (data.message || "this action no longer waits") + " (" + data.code + ")";
      status.className = "error";
    } else {
      const lead = sent === undefined ? "" : "Your answer was sent, but the tool failed: ";
      status.textContent = lead + (data.message || "") + " (" + (data.code || "ERROR") + ")";
      status.className = "error";
    }
    offerNext(data.status === "pending" && data.action ? data.action.action_id : null);
    $("result-title").focus(); // what came of it, read first; the next action follows
  }

  // After an answer: the next action waiting (another than the one answered), one Tab away.
  function offerNext(skip) {
    const old = $("next-action");
    if (old) old.remove();
    const next = [...state.actions.values()].find(
      (a) => a.action_id !== state.selected && a.action_id !== skip && passes(a),
    );
    if (!next) return;
    const button = el("button", { type: "button", id: "next-action", text: "Next: " + titleOf(next) });
    button.addEventListener("click", () => {
      if (state.actions.has(next.action_id)) select(next.action_id);
    });
    $("result").append(el("p", { className: "next" }, button));
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
    return schema && typeof schema === "object" ? schema : {};
  }

  function typeOf(schema) {
    let type = schema.type;
    if (Array.isArray(type)) type = type.find((t) => t !== "null") || "null";
    if (!type && schema.enum) return "enum";
    if (!type && schema.properties) type = "object";
    if (!type && schema.const !== undefined) return "const";
    // an object of no named fields takes any JSON object: a JSON text field
    if (type === "object" && !Object.keys(schema.properties || {}).length) return "json";
    return type || "json";
  }

  const pointerPart = (key) => String(key).replace(/~/g, "~0").replace(/\//g, "~1");
  const unpointer = (part) => part.replace(/~1/g, "/").replace(/~0/g, "~");

  // The field a JSON pointer names, or the nearest one holding it.
  function locate(root, pointer) {
    let field = root;
    for (const raw of String(pointer).split("/").slice(1)) {
      const part = unpointer(raw);
      if (field.children && field.children.has(part)) field = field.children.get(part);
      else if (field.rows && /^\d+$/.test(part) && field.rows[Number(part)]) field = field.rows[Number(part)].field;
      else break;
    }
    return field;
  }

  // What the browser cannot read as the schema's type (a number box holding "1e", bad JSON):
  // never sent, said in words.
  class Unreadable {
    constructor(text) {
      this.text = text;
    }
  }

  let counter = 0;

  // ``initial``: the values the form first shows (left as they are, an optional object holding
  // them is still left out).
  function buildForm(schema, initial) {
    const root = schema;
    const ctx = { root, changed: (target) => recheck(target) };
    const built = field(ctx, root, "", "answer", true, true, initial, true);
    built.node.addEventListener("input", (event) => recheck(event.target));
    built.node.addEventListener("change", (event) => recheck(event.target));
    return { root, field: built, node: built.node };
  }

  function titled(tag, attrs, title, required) {
    const node = el(tag, attrs, el("span", { className: "title-text", text: title }));
    if (required) node.append(el("span", { className: "required-mark", text: "*", "aria-hidden": "true" }));
    return node;
  }

  // The message beside a field: its text, aria-invalid on its controls, the field outlined.
  function slot(id, box, controls) {
    const node = el("p", { className: "field-error", id, hidden: true });
    return {
      node,
      set(texts) {
        const said = texts.join("\n");
        if (node.dataset.said === said) return; // as shown: left alone
        node.dataset.said = said;
        node.replaceChildren(...texts.map((text) => el("span", { text })));
        node.hidden = texts.length === 0;
        box.classList.toggle("has-error", texts.length > 0);
        for (const control of controls) {
          if (texts.length) control.setAttribute("aria-invalid", "true");
          else control.removeAttribute("aria-invalid");
        }
      },
    };
  }

  function describedBy(...ids) {
    return ids.filter(Boolean).join(" ");
  }

  // Each field: its node, read() (the value, or undefined when left out), pristine() (as the
  // form first showed it), its slot for problems and setTitle (array items are renumbered).
  // ``within``: every group holding the field is required too (then a required field is
  // announced as required; inside an optional group it is required only once the group is used).
  function field(ctx, raw, path, name, required, top, given, within) {
    const schema = resolve(ctx.root, raw);
    // aria-required="true", not the required attribute: a required control left empty would
    // be announced invalid (constraint validation) before the person typed anything
    const announced = required && within ? "true" : undefined;
    const start = given === undefined ? schema.default : given;
    const id = "f" + ++counter;
    const title = schema.title || humanize(name);
    const type = schema.enum ? "enum" : typeOf(schema);
    const rule = ruleOf(schema, type);
    const hintId = schema.description || rule ? id + "-hint" : null;
    const errorId = id + "-error";
    const hint = hintId
      ? el(
          "span",
          { className: "hint", id: hintId },
          schema.description ? el("span", { text: schema.description }) : null,
          rule ? el("span", { className: "rule", text: rule }) : null,
        )
      : null;
    const setTitleOf = (node) => (text) => {
      const span = node.querySelector(".title-text");
      if (span) span.textContent = text;
    };

    if (type === "object") {
      const fieldset = el("fieldset", {
        "data-path": path,
        className: top ? "root" : undefined,
        "aria-describedby": describedBy(hintId, errorId),
      });
      const legend = titled("legend", {}, title, required && !top);
      if (top) legend.className = "visually-hidden";
      fieldset.append(legend);
      if (hint) fieldset.append(hint);
      const problems = slot(errorId, fieldset, [fieldset]);
      fieldset.append(problems.node);
      const needed = new Set(schema.required || []);
      if (!required && !top && needed.size && start === undefined) {
        const optional = "Optional: leave all of it empty, or fill in the fields marked *.";
        fieldset.append(el("span", { className: "hint", text: optional }));
      }
      const children = new Map();
      for (const [key, sub] of Object.entries(schema.properties || {})) {
        const value = isObject(start) ? start[key] : undefined;
        const child = field(ctx, sub, path + "/" + pointerPart(key), key, needed.has(key), false, value, within && required);
        fieldset.append(child.node);
        children.set(key, child);
      }
      const pristine = () => [...children.values()].every((child) => child.pristine());
      const self = {
        node: fieldset,
        slot: problems,
        children,
        pristine,
        setTitle: setTitleOf(legend),
        // an optional object left as it was is left out: its required fields are not asked for
        read() {
          if (!required && pristine()) return undefined;
          const out = {};
          for (const [key, child] of children) {
            const value = child.read();
            if (value !== undefined) out[key] = value;
          }
          return out;
        },
      };
      for (const child of children.values()) child.parent = self;
      return self;
    }

    if (type === "array") {
      const box = el("fieldset", { "data-path": path, className: "array", "aria-describedby": describedBy(hintId, errorId) });
      const legend = titled("legend", {}, title, required);
      box.append(legend);
      if (hint) box.append(hint);
      const problems = slot(errorId, box, [box]);
      box.append(problems.node);
      const items = el("div", { className: "items" });
      const rows = [];
      let self = null; // the array's field: each row's parent
      const add = el("button", { type: "button", className: "small", text: "Add an item" });
      const itemSchema = schema.items && typeof schema.items === "object" ? schema.items : {};
      const renumber = () => {
        rows.forEach((entry, index) => {
          const before = entry.path;
          const after = path + "/" + index;
          if (before === after) return;
          for (const node of entry.row.querySelectorAll("[data-path]")) {
            const at = node.getAttribute("data-path");
            if (at === before || at.startsWith(before + "/")) node.setAttribute("data-path", after + at.slice(before.length));
          }
          entry.path = after;
          entry.field.setTitle("Item " + (index + 1));
          entry.remove.setAttribute("aria-label", "Remove item " + (index + 1) + " of " + title);
        });
      };
      function addRow(value) {
        const index = rows.length;
        const child = field(ctx, itemSchema, path + "/" + index, "Item " + (index + 1), true, false, value, within && required);
        const remove = el("button", {
          type: "button",
          className: "small secondary",
          text: "Remove",
          "aria-label": "Remove item " + (index + 1) + " of " + title,
        });
        const row = el("div", { className: "array-item" }, child.node, remove);
        const entry = { row, field: child, path: path + "/" + index, remove };
        child.parent = self;
        remove.addEventListener("click", () => {
          const at = rows.indexOf(entry);
          rows.splice(at, 1);
          row.remove();
          renumber();
          ctx.changed(box);
          // focus where the removed row was: the row now there, else the one before, else Add
          const near = rows[at] || rows[at - 1];
          const control = near && near.row.querySelector("input, select, textarea");
          (control || add).focus();
        });
        rows.push(entry);
        items.append(row);
        return child;
      }
      add.addEventListener("click", () => {
        const child = addRow(undefined);
        const control = child.node.querySelector("input, select, textarea");
        if (control) control.focus();
        ctx.changed(box);
      });
      if (Array.isArray(start)) start.forEach((value) => addRow(value));
      for (let i = rows.length; i < (schema.minItems || 0); i++) addRow();
      const initial = rows.length;
      box.append(items, add);
      const pristine = () => rows.length === initial && rows.every((r) => r.field.pristine());
      self = {
        node: box,
        slot: problems,
        rows,
        pristine,
        setTitle: setTitleOf(legend),
        read() {
          if (!required && (rows.length === 0 || pristine())) return undefined;
          return rows.map((r) => r.field.read());
        },
      };
      for (const entry of rows) entry.field.parent = self; // the rows of minItems
      return self;
    }

    const wrap = el("div", { className: "field" });
    const leaf = (control, read, pristine, setTitle) => {
      control.setAttribute("aria-describedby", describedBy(hintId, errorId));
      const problems = slot(errorId, wrap, [control]);
      wrap.append(problems.node);
      return { node: wrap, slot: problems, read, pristine, setTitle };
    };

    if (type === "boolean") {
      const input = el("input", { type: "checkbox", id, "data-path": path }); // always a value
      if (typeof start === "boolean") input.checked = start;
      const initial = input.checked;
      const labelNode = titled("label", { for: id }, title, required);
      wrap.classList.add("checkbox");
      wrap.append(el("div", { className: "check-row" }, input, labelNode));
      if (hint) wrap.append(hint);
      return leaf(input, () => input.checked, () => input.checked === initial, setTitleOf(labelNode));
    }

    const labelNode = titled("label", { for: id }, title, required);
    wrap.append(labelNode);
    if (hint) wrap.append(hint);

    if (type === "enum" || type === "const") {
      const options = type === "const" ? [schema.const] : schema.enum;
      const select = el("select", { id, "data-path": path, "aria-required": announced });
      select.append(el("option", { value: "", text: required ? "Choose…" : "(none)" }));
      options.forEach((option, index) => {
        select.append(el("option", { value: String(index), text: option === null ? "—" : scalarText(option) }));
      });
      if (options.length === 1 && required) select.value = "0";
      const chosen = options.findIndex((option) => JSON.stringify(option) === JSON.stringify(start));
      if (start !== undefined && chosen >= 0) select.value = String(chosen);
      const initial = select.value;
      wrap.append(select);
      return leaf(
        select,
        () => (select.value === "" ? undefined : options[Number(select.value)]),
        () => select.value === initial,
        setTitleOf(labelNode),
      );
    }

    if (type === "integer" || type === "number") {
      const input = el("input", {
        type: "number",
        id,
        "data-path": path,
        "aria-required": announced,
        step: type === "integer" ? "1" : "any",
        min: schema.minimum,
        max: schema.maximum,
      });
      if (typeof start === "number") input.value = String(start);
      const initial = input.value;
      wrap.append(input);
      return leaf(
        input,
        () => {
          if (input.validity.badInput) return new Unreadable("Must be a number");
          const text = input.value.trim();
          if (text === "") return undefined;
          const number = Number(text);
          return Number.isFinite(number) ? number : new Unreadable("Must be a number");
        },
        () => input.value === initial && !input.validity.badInput,
        setTitleOf(labelNode),
      );
    }

    if (type === "string") {
      const long = (schema.maxLength || 0) > 200 || schema.format === "textarea";
      const input = el(long ? "textarea" : "input", {
        type: long ? undefined : "text",
        id,
        "data-path": path,
        "aria-required": announced,
        rows: long ? 3 : undefined,
      });
      if (typeof start === "string") input.value = start;
      const initial = input.value;
      wrap.append(input);
      return leaf(
        input,
        () => (input.value === "" ? undefined : input.value),
        () => input.value === initial,
        setTitleOf(labelNode),
      );
    }

    // anything else (unions, untyped values, free-form objects): JSON text
    const area = el("textarea", { id, "data-path": path, rows: 3, "aria-required": announced });
    if (start !== undefined) area.value = JSON.stringify(start, null, 2);
    const initial = area.value.trim();
    wrap.append(area);
    if (!hint) wrap.append(el("span", { className: "hint", text: "Write a JSON value." }));
    return leaf(
      area,
      () => {
        const text = area.value.trim();
        if (text === "") return undefined;
        try {
          return JSON.parse(text);
        } catch (error) {
          return new Unreadable("Not valid JSON");
        }
      },
      () => area.value.trim() === initial,
      setTitleOf(labelNode),
    );
  }

  // What a field takes, said before anyone gets it wrong: "A whole number from 0 to 10".
  function ruleOf(schema, type) {
    const parts = [];
    if (type === "integer" || type === "number") {
      const low = schema.minimum;
      const high = schema.maximum;
      let range = "";
      if (low !== undefined && high !== undefined) range = "from " + low + " to " + high;
      else if (low !== undefined) range = "at least " + low;
      else if (high !== undefined) range = "at most " + high;
      if (schema.exclusiveMinimum !== undefined) range += (range ? ", " : "") + "more than " + schema.exclusiveMinimum;
      if (schema.exclusiveMaximum !== undefined) range += (range ? ", " : "") + "less than " + schema.exclusiveMaximum;
      const kind = type === "integer" ? "A whole number" : "A number";
      parts.push(kind + (range ? " " + range : ""));
      if (typeof schema.multipleOf === "number") parts.push("a multiple of " + schema.multipleOf);
      if (type === "number" && !range && parts.length === 1) return "";
    } else if (type === "string") {
      const low = schema.minLength > 1 ? schema.minLength : undefined;
      const high = schema.maxLength;
      if (low !== undefined && high !== undefined) parts.push(low + " to " + high + " characters");
      else if (low !== undefined) parts.push("At least " + low + " characters");
      else if (high !== undefined) parts.push("At most " + high + " characters");
    } else if (type === "array") {
      const low = schema.minItems;
      const high = schema.maxItems;
      const items = (n) => n + (n === 1 ? " item" : " items");
      if (low && high !== undefined) parts.push(low + " to " + items(high));
      else if (low) parts.push("At least " + items(low));
      else if (high !== undefined) parts.push("At most " + items(high));
    }
    return parts.join(", ");
  }

  function typeWords(types) {
    const words = {
      integer: "a whole number",
      number: "a number",
      string: "text",
      boolean: "yes or no",
      array: "a list",
      object: "a group of fields",
      null: "empty",
    };
    if (types.includes("integer") && !types.includes("number")) return "Must be a whole number";
    return "Must be " + types.map((t) => words[t] || t).join(" or ");
  }

  // The browser's check, in words: the common keywords; the server checks the whole schema.
  function check(root, raw, value, path, problems) {
    const schema = resolve(root, raw);
    const say = (text) => problems.push({ path, text });
    if (value instanceof Unreadable) return say(value.text);
    if (value === undefined) return say("Required");
    const types = schema.type === undefined ? [] : [].concat(schema.type);
    if (types.length) {
      const actual = value === null ? "null" : Array.isArray(value) ? "array" : typeof value;
      const ok = types.some(
        (t) => t === actual || (t === "integer" && Number.isInteger(value)) || (t === "number" && actual === "number"),
      );
      if (!ok) return say(typeWords(types));
    }
    if (schema.enum && !schema.enum.some((option) => JSON.stringify(option) === JSON.stringify(value))) {
      return say("Must be one of " + schema.enum.map(scalarText).join(", "));
    }
    if (schema.const !== undefined && JSON.stringify(schema.const) !== JSON.stringify(value)) {
      return say("Must be " + scalarText(schema.const));
    }
    if (typeof value === "string") {
      const length = [...value].length;
      if (schema.minLength !== undefined && length < schema.minLength) {
        say(schema.minLength === 1 ? "Must not be empty" : "Must be at least " + schema.minLength + " characters");
      }
      if (schema.maxLength !== undefined && length > schema.maxLength) say("Must be at most " + schema.maxLength + " characters");
      if (schema.pattern) {
        try {
          if (!new RegExp(schema.pattern, "u").test(value)) say("Not in the expected format (" + schema.pattern + ")");
        } catch (error) {
          /* a pattern this browser cannot compile: the server decides */
        }
      }
    }
    if (typeof value === "number") {
      if (schema.minimum !== undefined && value < schema.minimum) say("Must be at least " + schema.minimum);
      if (schema.maximum !== undefined && value > schema.maximum) say("Must be at most " + schema.maximum);
      if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum) say("Must be more than " + schema.exclusiveMinimum);
      if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum) say("Must be less than " + schema.exclusiveMaximum);
      if (typeof schema.multipleOf === "number" && schema.multipleOf > 0) {
        const ratio = value / schema.multipleOf;
        if (Math.abs(ratio - Math.round(ratio)) > 1e-9) say("Must be a multiple of " + schema.multipleOf);
      }
    }
    if (Array.isArray(value)) {
      if (schema.minItems !== undefined && value.length < schema.minItems) {
        say("Add at least " + schema.minItems + (schema.minItems === 1 ? " item" : " items"));
      }
      if (schema.maxItems !== undefined && value.length > schema.maxItems) say("At most " + schema.maxItems + " items");
      if (schema.uniqueItems === true) {
        const seen = value.map((item) => JSON.stringify(item));
        if (new Set(seen).size !== seen.length) say("Each item must be different");
      }
      if (schema.items && typeof schema.items === "object") {
        value.forEach((item, index) => check(root, schema.items, item, path + "/" + index, problems));
      }
    }
    if (isObject(value)) {
      for (const key of schema.required || []) {
        if (!(key in value)) problems.push({ path: path + "/" + pointerPart(key), text: "Required" });
      }
      for (const [key, sub] of Object.entries(schema.properties || {})) {
        if (key in value) check(root, sub, value[key], path + "/" + pointerPart(key), problems);
      }
    }
  }

  // -- start --------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("submit-form").addEventListener("submit", submit);
    $("cancel-button").addEventListener("click", askCancel);
    $("cancel-yes").addEventListener("click", cancel);
    $("cancel-no").addEventListener("click", keepWaiting);
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    $("filter-tool").addEventListener("change", filtersChanged);
    $("filter-age").addEventListener("change", filtersChanged);
    $("more").addEventListener("click", showMore);
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") lookNow();
    });
    poll();
  });
})();
