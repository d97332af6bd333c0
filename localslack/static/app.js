// opsloop local: a Slack workspace in the browser, in front of the real Bolt app.
//
// What you do here goes to the local server's page API (/ui/…), which turns it into
// the signed requests Slack would send the app; what the bot does comes back as
// server-sent events (/ui/events). Nothing is rendered as HTML: every text goes
// through textContent (mrkdwn.js, blocks.js).
//
// Stable selectors (data-testid, with data-* attributes), for tests and tools:
//
//   team-name                the workspace's name, top left
//   user-switcher            <select>; option values are user ids (U0ALICE, U0BOB, U0CAROL)
//   model-badge              data-model-kind = claude | offline | other; text names the model
//   suggestions, suggestion  the phrasebook chips (offline model); a chip has data-phrase
//                            and fills the composer ("@opsloop " + phrase; the phrase in a DM)
//   connection-status        data-state = connecting | live | offline
//   home-link                opens the App Home tab (home-view)
//   channel-list, dm-list    the sidebar lists
//   channel-link             data-channel-id; data-unread="true" when something new arrived
//   alert-section, fire-alert  the sidebar's "Fire an alert" (shown when opsloop.yaml has
//                            alerts.generic): a signed alert to the bot, then its channel
//   channel-pane             the middle column: channel-header ("# ops"), channel-topic,
//                            message-list (the channel's top-level messages), the composer
//   message                  every message: data-ts, data-channel, data-user,
//                            data-thread-ts (replies and roots with replies),
//                            data-bot="true" (the bot's), data-ephemeral="true" (only you see it)
//   message-author, message-text   inside a message
//   open-thread              on a root with replies ("2 replies"); reply-in-thread on others
//   composer, composer-input, composer-send                the channel's composer
//   thread-pane              data-channel, data-thread-ts; thread-channel (its channel's
//                            name), thread-messages (the root, then the replies)
//   thread-composer, thread-composer-input, thread-composer-send, thread-close
//   block-button             a Block Kit button: data-action-id, data-block-id,
//                            data-style = primary | danger (absent: default)
//   stream-state             on a streamed message (which has data-stream = streaming |
//                            stopped | expired | stopped_by_user): "streaming…" while open,
//                            how it ended otherwise
//   plan, plan-title         a plan block: its title and its task cards
//   task-card                data-task-id, data-status = pending | in_progress | complete |
//                            error; task-title, task-details, task-output, task-source (a
//                            link per source)
//   feedback-button          👍 / 👎 under an answer: data-action-id, data-block-id,
//                            data-value = positive | negative; aria-pressed="true" on
//                            the one you clicked (remembered by this page, as Slack's
//                            client shows your choice)
//   agent-bar                under the thread's messages: agent-status (the loading status,
//                            "opsloop is thinking…", data-status; agent-loading-message
//                            cycles through its loading messages) and agent-session
//                            (data-state = processing | suspended | active | closed;
//                            agent-session-state, agent-session-title, and agent-stop, the
//                            stop button, while processing)
//   confirm-overlay          shown while a button's confirm is asked, in confirm-dialog:
//                            confirm-title, confirm-text, confirm-ok, confirm-cancel
//   modal-overlay, modal     data-view-id, data-callback-id; modal-title, modal-body,
//                            modal-input (data-block-id, data-action-id; a text input,
//                            a select, or with data-kind="checkboxes" a group of them),
//                            modal-error (data-block-id; shown when the app answers
//                            response_action "errors"), modal-banner-error,
//                            modal-submit, modal-close, modal-x
//   home-view                the App Home tab's blocks
//   trace-toggle             in the thread pane: opens trace-panel beside it
//   trace-panel              data-thread-id once found; trace-status, trace-refresh,
//                            trace-close, trace-events
//   trace-event              data-seq, data-type, data-error="true" on failures (with a
//                            trace-error-badge), data-refused="true" on refused clicks
//                            (with a trace-refused-badge, not an error); trace-actor
//                            names who; trace-summary is its line; click shows
//                            trace-event-json. message_posted rows are hidden until
//                            trace-deliveries ("N deliveries", data-count, aria-pressed)
//   trace-result-toggle      on tool_result events: shows trace-result-json (the output,
//                            pretty-printed, or the error text)
//   trace-prompt-button      on model_decision events: data-seq; shows trace-prompt
//                            (the request as `opsloop replay --json`) and trace-verdict
//                            (data-matches = true | false)
//   toast                    an error or notice (in toasts)
//
// Routes: #/CHANNEL, #/CHANNEL/THREAD_TS (thread open), #/home.

import { renderBlocks, textObject } from "./blocks.js";
import { renderMrkdwn } from "./mrkdwn.js";

// --- small helpers ------------------------------------------------------------------------

const $ = (testid, root = document) => root.querySelector(`[data-testid="${testid}"]`);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function q(params) {
  return new URLSearchParams(params).toString();
}

async function api(method, path, body) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new Error("The local server is not answering: is `opsloop local` still running?");
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = new Error((data && data.error) || `HTTP ${response.status}`);
    err.status = response.status; // the server answered: not a lost connection
    throw err;
  }
  return data;
}

function toast(text, kind = "error") {
  const box = el("div", `toast toast-${kind}`, text);
  box.dataset.testid = "toast";
  $("toasts").appendChild(box);
  setTimeout(() => box.remove(), 7000);
}

function timeOf(ts) {
  const seconds = Number(String(ts).split(".")[0]);
  return new Date(seconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function isRoot(message) {
  return !message.thread_ts || message.thread_ts === message.ts;
}

// --- state --------------------------------------------------------------------------------

const state = {
  ws: null, // GET /ui/workspace
  me: null,
  channel: null,
  thread: null, // the open thread's root ts
  view: "channel", // or "home"
  traceOpen: false,
  traceExpanded: new Set(), // seqs whose whole record is shown
  traceResults: new Set(), // seqs of tool results whose output is shown
  traceDeliveries: false, // message_posted rows shown
  prompts: new Map(), // seq -> replay answer, while shown
  feedback: new Map(), // feedbackKey -> "positive" | "negative": the 👍 / 👎 clicked
  modal: null,
  source: null,
  boot: null,
  unread: new Set(),
};

function person(id) {
  return state.ws.users.find((u) => u.id === id);
}

function nameOf(id) {
  if (!id) return "someone";
  if (id === state.ws.bot.id) return state.ws.bot.name;
  const found = person(id);
  return found ? found.name : id;
}

function channelOf(id) {
  return state.ws.channels.find((c) => c.id === id);
}

function channelLabel(channel) {
  return channel.is_im ? state.ws.bot.name : `# ${channel.name}`;
}

/** What the renderers need to name things and follow links. */
function renderContext(extra = {}) {
  return {
    userName: nameOf,
    channelName: (id) => channelOf(id)?.name ?? null,
    groupName: (id) => state.ws.usergroups.find((g) => g.id === id)?.handle ?? id,
    linkFor,
    ...extra,
  };
}

/** Links into this workspace open here; web links open in a new tab; others stay text. */
function linkFor(url) {
  const archive = /^https:\/\/[^/]+\/archives\/([A-Z0-9]+)\/p(\d+)(\d{6})/.exec(url);
  if (archive && url.startsWith(state.ws.team.url)) {
    return { href: `#/${archive[1]}/${archive[2]}.${archive[3]}`, internal: true };
  }
  if (/^(https?:|mailto:)/i.test(url)) return { href: url, internal: false };
  return null;
}

// --- loading and refreshing ---------------------------------------------------------------

const timers = {};
const LOADERS = { channel: loadChannel, thread: loadThread, trace: loadTrace, home: loadHome };

function refresh(what, delay = 60) {
  clearTimeout(timers[what]);
  timers[what] = setTimeout(() => LOADERS[what]().catch((err) => toast(err.message)), delay);
}

function refreshAll() {
  if (state.view === "home") refresh("home", 0);
  else refresh("channel", 0);
  if (state.thread) refresh("thread", 0);
  if (state.traceOpen) refresh("trace", 0);
}

async function loadWorkspace() {
  state.ws = await api("GET", `/ui/workspace?${q({ user: state.me })}`);
  renderTopbar();
  renderSidebar();
}

async function loadChannel() {
  if (state.view !== "channel" || !state.channel) return;
  const channel = state.channel;
  const data = await api("GET", `/ui/channels/${encodeURIComponent(channel)}/messages?${q({ user: state.me })}`);
  if (channel !== state.channel) return;
  const list = $("message-list");
  const items = [...data.messages, ...data.ephemerals].sort((a, b) => Number(a.ts) - Number(b.ts));
  keepingScroll(list, () => {
    list.replaceChildren(...items.map((m) => messageNode(m, channel, false)));
    if (!items.length) list.appendChild(emptyNote(channel));
  });
}

async function loadThread() {
  if (!state.thread || !state.channel) return;
  const [channel, ts] = [state.channel, state.thread];
  const pane = $("thread-pane");
  let data;
  try {
    data = await api("GET", `/ui/channels/${encodeURIComponent(channel)}/threads/${encodeURIComponent(ts)}?${q({ user: state.me })}`);
  } catch (err) {
    // Refused (no such thread, not yours to see): close it. Unreachable (a restart, a
    // crash): keep it open; the page reconnects and looks again.
    if (err.status) closeThread();
    throw err;
  }
  if (channel !== state.channel || ts !== state.thread) return;
  pane.hidden = false;
  pane.dataset.channel = channel;
  pane.dataset.threadTs = ts;
  $("thread-channel").textContent = channelLabel(data.channel);
  const list = $("thread-messages");
  const items = [data.root, ...[...data.replies, ...data.ephemerals].sort((a, b) => Number(a.ts) - Number(b.ts))];
  keepingScroll(list, () => list.replaceChildren(...items.map((m) => messageNode(m, channel, true))));
  renderAgent(data.agent || {});
  // Slack's clock ends loading statuses and streams with no event: look again by then.
  const ends = [data.agent?.status?.expires_in, ...items.map((m) => m.stream?.expires_in)];
  const soonest = Math.min(...ends.filter((s) => typeof s === "number"));
  clearTimeout(timers.expiry);
  if (Number.isFinite(soonest)) timers.expiry = setTimeout(() => refresh("thread", 0), Math.max(0, soonest) * 1000 + 250);
}

// --- under the thread: the loading status and the agent session -------------------------------

const SESSION_WORDS = { processing: "Working", suspended: "Waiting", active: "Answered", closed: "Closed" };
let loadingTimer = null;

function renderAgent({ status, session }) {
  const bar = $("agent-bar");
  const line = $("agent-status");
  clearInterval(loadingTimer);
  line.hidden = !status;
  if (status) {
    line.dataset.status = status.status;
    const who = el("span", "agent-status-text", `${state.ws.bot.name} ${status.status}`);
    const cycling = el("span", "agent-loading-message");
    cycling.dataset.testid = "agent-loading-message";
    const messages = status.loading_messages || [];
    let next = 0;
    const turn = () => {
      cycling.textContent = messages.length ? messages[next++ % messages.length] : "";
    };
    turn();
    if (messages.length > 1) loadingTimer = setInterval(turn, 2500);
    line.replaceChildren(el("span", "agent-spinner", "◌"), who, cycling);
  }
  const box = $("agent-session");
  box.hidden = !session || !session.status;
  if (session && session.status) {
    box.dataset.state = session.status;
    const label = $("agent-session-state");
    label.textContent = SESSION_WORDS[session.status] || session.status;
    label.className = `agent-session-state agent-session-${session.status}`;
    $("agent-session-title").textContent = session.title || "";
    $("agent-stop").hidden = session.status !== "processing";
  }
  bar.hidden = line.hidden && box.hidden;
}

async function stopAgent() {
  const button = $("agent-stop");
  button.disabled = true;
  try {
    await api("POST", "/ui/agent/stop", { user: state.me, channel: state.channel, thread_ts: state.thread });
  } catch (err) {
    toast(err.message);
  } finally {
    button.disabled = false;
  }
}

function keepingScroll(list, render) {
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 60 || !list.childElementCount;
  const top = list.scrollTop;
  render();
  list.scrollTop = atBottom ? list.scrollHeight : top;
}

function emptyNote(channelId) {
  const channel = channelOf(channelId);
  const text = channel && channel.is_im
    ? "This is your direct conversation with opsloop: write to it, no mention needed."
    : "Nothing here yet. Mention @opsloop to ask it something.";
  return el("div", "empty", text);
}

// --- the top bar and the sidebar ------------------------------------------------------------

function renderTopbar() {
  $("team-name").textContent = state.ws.team.name;
  const badge = $("model-badge");
  const model = state.ws.model;
  badge.dataset.modelKind = model.kind;
  badge.className = `badge badge-${model.kind}`;
  if (model.kind === "claude") {
    badge.textContent = `Claude · ${model.name}`;
    badge.title = "Decisions by Claude (ANTHROPIC_API_KEY is set)";
  } else if (model.kind === "offline") {
    badge.textContent = `Offline model · ${model.name}`;
    badge.title = "No ANTHROPIC_API_KEY: a phrasebook model that understands the phrases suggested below the messages";
  } else {
    badge.textContent = `Model · ${model.name}`;
    badge.title = "";
  }
  const select = $("user-switcher");
  select.replaceChildren(
    ...state.ws.users.map((u) => {
      const option = el("option", "", `${u.name} — ${u.role}`);
      option.value = u.id;
      return option;
    }),
  );
  select.value = state.me;
  renderSuggestions();
}

function renderSuggestions() {
  const box = $("suggestions");
  const phrases = state.ws.model.suggestions || [];
  box.hidden = !phrases.length || state.view !== "channel";
  box.replaceChildren(
    el("span", "suggestions-label", "Try:"),
    ...phrases.map(({ phrase, does }) => {
      const chip = el("button", "chip", phrase);
      chip.type = "button";
      chip.dataset.testid = "suggestion";
      chip.dataset.phrase = phrase;
      chip.title = does;
      chip.addEventListener("click", () => {
        const input = $("composer-input");
        const dm = channelOf(state.channel)?.is_im;
        input.value = dm ? phrase : `@${state.ws.bot.name} ${phrase}`;
        input.focus();
      });
      return chip;
    }),
  );
}

function renderSidebar() {
  const link = (channel) => {
    const li = el("li");
    const button = el("button", "sidebar-item", channelLabel(channel));
    button.type = "button";
    button.dataset.testid = "channel-link";
    button.dataset.channelId = channel.id;
    if (state.view === "channel" && channel.id === state.channel) button.classList.add("active");
    if (state.unread.has(channel.id)) button.dataset.unread = "true";
    button.addEventListener("click", () => go(channel.id));
    li.appendChild(button);
    return li;
  };
  $("channel-list").replaceChildren(...state.ws.channels.filter((c) => !c.is_im).map(link));
  $("dm-list").replaceChildren(...state.ws.channels.filter((c) => c.is_im && c.user === state.me).map(link));
  $("home-link").classList.toggle("active", state.view === "home");
  $("alert-section").hidden = !state.ws.alerts;
}

// The bundled opsloop.yaml's alerts.generic: the page plays the monitoring system.
async function fireAlert() {
  const button = $("fire-alert");
  button.disabled = true;
  try {
    const result = await api("POST", "/ui/alerts", { user: state.me });
    if (!result.ok) {
      toast(result.error || "the app did not take the alert");
      return;
    }
    const channel = channelOf(result.channel);
    toast(`Alert fired: the bot opens a thread about it in ${channel ? channelLabel(channel) : result.channel}.`, "info");
    go(result.channel);
  } catch (err) {
    toast(err.message);
  } finally {
    button.disabled = false;
  }
}

// --- messages -------------------------------------------------------------------------------

function messageNode(message, channelId, inThread) {
  const node = el("div", "msg");
  node.dataset.testid = "message";
  node.dataset.ts = message.ts;
  node.dataset.channel = channelId;
  node.dataset.user = message.user || "";
  if (message.thread_ts) node.dataset.threadTs = message.thread_ts;
  if (message.bot_id) node.dataset.bot = "true";
  if (message.ephemeral) node.dataset.ephemeral = "true";

  const who = message.bot_id ? null : person(message.user);
  const avatar = el("div", "avatar", message.bot_id ? "⚙" : nameOf(message.user).slice(0, 1).toUpperCase());
  avatar.style.background = message.bot_id ? "#3f0e40" : who?.color || "#888";
  node.appendChild(avatar);

  const body = el("div", "msg-body");
  const meta = el("div", "msg-meta");
  const author = el("span", "msg-author", message.bot_id ? state.ws.bot.name : nameOf(message.user));
  author.dataset.testid = "message-author";
  meta.appendChild(author);
  if (message.bot_id) meta.appendChild(el("span", "tag", "APP"));
  meta.appendChild(el("time", "msg-time", timeOf(message.ts)));
  if (message.edited) meta.appendChild(el("span", "msg-edited", "(edited)"));
  if (message.ephemeral) meta.appendChild(el("span", "msg-only-you", "Only visible to you"));
  if (message.stream) {
    node.dataset.stream = message.stream.state;
    const words = STREAM_WORDS[message.stream.state] ?? message.stream.state;
    const chip = el("span", `msg-stream msg-stream-${message.stream.state}`, words);
    chip.dataset.testid = "stream-state";
    chip.hidden = !words;
    meta.appendChild(chip);
  }
  body.appendChild(meta);

  const content = el("div", "msg-text");
  content.dataset.testid = "message-text";
  const blocks = Array.isArray(message.blocks) ? message.blocks : [];
  const richOnly = blocks.every((b) => b && b.type === "rich_text");
  if (blocks.length && !richOnly) {
    const onButton = message.ephemeral ? undefined : (item, blockId, button, value) => press(message, channelId, item, blockId, button, value);
    const feedbackChosen = (blockId) => state.feedback.get(feedbackKey(channelId, message.ts, blockId));
    content.appendChild(renderBlocks(blocks, renderContext({ onButton, feedbackChosen })));
  } else {
    content.appendChild(renderMrkdwn(message.text || "", renderContext()));
  }
  body.appendChild(content);

  if (!inThread && isRoot(message) && !message.ephemeral) {
    const footer = el("div", "msg-thread");
    if (message.reply_count) {
      const open = el("button", "link-button", `${message.reply_count} ${message.reply_count === 1 ? "reply" : "replies"}`);
      open.type = "button";
      open.dataset.testid = "open-thread";
      open.addEventListener("click", () => go(channelId, message.ts));
      footer.appendChild(open);
      footer.appendChild(el("span", "msg-thread-last", `Last reply ${timeOf(message.latest_reply)}`));
    } else {
      const reply = el("button", "link-button subtle", "Reply in thread");
      reply.type = "button";
      reply.dataset.testid = "reply-in-thread";
      reply.addEventListener("click", () => go(channelId, message.ts));
      footer.appendChild(reply);
    }
    body.appendChild(footer);
  }
  node.appendChild(body);
  return node;
}

// How a streamed message's state reads beside its author.
const STREAM_WORDS = {
  streaming: "streaming…",
  stopped: "",
  expired: "ended by Slack (5 minutes)",
  stopped_by_user: "stopped",
};

async function press(message, channelId, item, blockId, button, value) {
  if (item.confirm && !(await confirmWith(item.confirm))) return;
  button.disabled = true;
  button.classList.add("busy");
  try {
    const result = await api("POST", "/ui/actions", {
      user: state.me,
      channel: channelId,
      message_ts: message.ts,
      action_id: item.action_id,
      block_id: blockId,
      ...(value ? { value } : {}),
    });
    if (!result.ok) toast(result.error || "The app did not take the click.");
    else if (value) showFeedback(feedbackKey(channelId, message.ts, blockId), button, value);
  } catch (err) {
    toast(err.message);
  } finally {
    button.disabled = false;
    button.classList.remove("busy");
  }
}

// A 👍 / 👎 choice is the clicker's: kept per user, message and row.
function feedbackKey(channelId, ts, blockId) {
  return `${state.me}|${channelId}|${ts}|${blockId}`;
}

function showFeedback(key, button, value) {
  state.feedback.set(key, value);
  for (const other of button.parentElement?.querySelectorAll('[data-testid="feedback-button"]') ?? []) {
    const chosen = other.dataset.value === value;
    other.ariaPressed = String(chosen);
    other.classList.toggle("bk-feedback-chosen", chosen);
  }
}

// --- the confirm dialog ---------------------------------------------------------------------

let confirmDone = null;

function confirmWith(confirm) {
  const overlay = $("confirm-overlay");
  $("confirm-title").textContent = "";
  $("confirm-title").appendChild(textObject(confirm.title || { type: "plain_text", text: "Are you sure?" }, renderContext()));
  $("confirm-text").replaceChildren(textObject(confirm.text, renderContext()));
  const ok = $("confirm-ok");
  ok.textContent = "";
  ok.appendChild(textObject(confirm.confirm || { type: "plain_text", text: "Yes" }, renderContext()));
  ok.className = `button ${confirm.style === "danger" ? "button-danger" : "button-primary"}`;
  const cancel = $("confirm-cancel");
  cancel.textContent = "";
  cancel.appendChild(textObject(confirm.deny || { type: "plain_text", text: "Cancel" }, renderContext()));
  overlay.hidden = false;
  ok.focus();
  return new Promise((resolve) => {
    confirmDone = (answer) => {
      overlay.hidden = true;
      confirmDone = null;
      resolve(answer);
    };
  });
}

// --- modals ---------------------------------------------------------------------------------

function showModal(view) {
  state.modal = view;
  const modal = $("modal");
  modal.dataset.viewId = view.id;
  modal.dataset.callbackId = view.callback_id || "";
  $("modal-title").replaceChildren(textObject(view.title, renderContext()));
  $("modal-body").replaceChildren(renderBlocks(view.blocks, renderContext()));
  const submit = $("modal-submit");
  submit.hidden = !view.submit;
  submit.textContent = "";
  if (view.submit) submit.appendChild(textObject(view.submit, renderContext()));
  const close = $("modal-close");
  close.textContent = "";
  close.appendChild(textObject(view.close || { type: "plain_text", text: "Cancel" }, renderContext()));
  $("modal-banner-error").hidden = true;
  $("modal-overlay").hidden = false;
  const first = $("modal-body").querySelector("textarea, input");
  (first || submit).focus();
}

function hideModal(id) {
  if (!state.modal || (id && state.modal.id !== id)) return;
  state.modal = null;
  $("modal-overlay").hidden = true;
  $("modal-body").replaceChildren();
}

function modalErrors(errors) {
  const body = $("modal-body");
  for (const box of body.querySelectorAll('[data-testid="modal-error"]')) {
    box.hidden = true;
    box.textContent = "";
  }
  const banner = $("modal-banner-error");
  banner.hidden = true;
  for (const [blockId, text] of Object.entries(errors || {})) {
    const box = [...body.querySelectorAll('[data-testid="modal-error"]')].find((b) => b.dataset.blockId === blockId);
    if (box) {
      box.textContent = text;
      box.hidden = false;
    } else {
      banner.textContent = text;
      banner.hidden = false;
    }
  }
}

async function submitModal() {
  const view = state.modal;
  if (!view) return;
  const values = {};
  for (const input of $("modal-body").querySelectorAll('[data-testid="modal-input"]')) {
    const value =
      input.dataset.kind === "checkboxes"
        ? [...input.querySelectorAll('input[type="checkbox"]')].filter((b) => b.checked).map((b) => b.value)
        : input.value;
    (values[input.dataset.blockId] ||= {})[input.dataset.actionId] = value;
  }
  const submit = $("modal-submit");
  submit.disabled = true;
  try {
    const result = await api("POST", `/ui/views/${encodeURIComponent(view.id)}/submit`, { user: state.me, values });
    if (result.ok && result.view) showModal(result.view);
    else if (result.ok) hideModal(view.id);
    else if (result.errors) modalErrors(result.errors);
    else modalErrors({ "": result.error || "The app did not take it." });
  } catch (err) {
    modalErrors({ "": err.message });
  } finally {
    submit.disabled = false;
  }
}

async function closeModal() {
  const view = state.modal;
  if (!view) return;
  hideModal(view.id);
  try {
    await api("POST", `/ui/views/${encodeURIComponent(view.id)}/close`, { user: state.me });
  } catch (err) {
    if (!/no open modal/.test(err.message)) toast(err.message);
  }
}

// --- the App Home tab -----------------------------------------------------------------------

async function loadHome() {
  const data = await api("GET", `/ui/home?${q({ user: state.me })}`);
  renderHome(data.view);
}

function renderHome(view) {
  const box = $("home-view");
  if (!view) {
    box.replaceChildren(el("div", "empty", "Opening the Home tab…"));
    return;
  }
  box.replaceChildren(renderBlocks(view.blocks, renderContext({ onButton: () => toast("Buttons on the Home tab do nothing here.", "notice") })));
}

// --- the trace ------------------------------------------------------------------------------

const TRACE_SKIP = new Set(["seq", "event_id", "type", "created_at", "actor"]);
// Events that report something going wrong (a tool_result only when it is not ok).
const TRACE_ERRORS = new Set(["error", "decision_rejected", "retry_scheduled"]);
// A click refused (someone who may not decide, a stale card): a safeguard working, not a
// failure, so it gets a neutral badge.
const TRACE_REFUSALS = new Set(["approval_refused"]);

async function loadTrace() {
  const panel = $("trace-panel");
  if (!state.traceOpen || !state.thread) return;
  const [channel, ts] = [state.channel, state.thread];
  let data;
  try {
    data = await api("GET", `/ui/trace?${q({ channel, ts })}`);
  } catch (err) {
    delete panel.dataset.threadId;
    $("trace-status").textContent = "";
    $("trace-events").replaceChildren(el("div", "empty", err.message));
    return;
  }
  if (channel !== state.channel || ts !== state.thread) return;
  panel.dataset.threadId = data.thread.thread_id;
  const usage = data.usage || {};
  const tokens = (usage.input_tokens || 0) + (usage.output_tokens || 0);
  $("trace-status").textContent = `${data.thread.thread_id} · ${data.thread.status} · ${data.events.length} events${tokens ? ` · ${tokens} tokens` : ""}`;
  const list = $("trace-events");
  keepingScroll(list, () => list.replaceChildren(...traceRows(data.events, data.summaries || [])));
}

/** The rows of the trace: message_posted ones folded behind one toggle (they are half of
 * every log and say only "shown in Slack"), the events they delivered ticked instead. */
function traceRows(events, summaries) {
  const intents = new Map();
  const delivered = new Set();
  const byId = new Map();
  for (const record of events) {
    byId.set(record.event_id, record);
    if (record.type === "tool_call_requested") intents.set(record.tool_call_id, record.intent);
    if (record.type === "message_posted") delivered.add(record.shows_event_id);
  }
  const rows = events.map((record, i) => {
    const shows = record.type === "message_posted" && byId.get(record.shows_event_id);
    const summary = shows ? `shows #${shows.seq} ${shows.type}${record.ts ? ` as message ${record.ts}` : ""}` : summaries[i] || "";
    return traceRow(record, summary, { intent: intents.get(record.tool_call_id), delivered: delivered.has(record.event_id) });
  });
  const count = events.filter((record) => record.type === "message_posted").length;
  return count ? [deliveriesToggle(count), ...rows] : rows;
}

function deliveriesToggle(count) {
  const bar = el("div", "trace-filters");
  const shown = state.traceDeliveries;
  const chip = el("button", `chip trace-chip${shown ? " active" : ""}`, `${count} ${count === 1 ? "delivery" : "deliveries"}`);
  chip.type = "button";
  chip.dataset.testid = "trace-deliveries";
  chip.dataset.count = String(count);
  chip.setAttribute("aria-pressed", String(shown));
  chip.title = shown ? "Hide the message_posted events" : "Show the message_posted events (what reached Slack, and where)";
  chip.addEventListener("click", () => {
    state.traceDeliveries = !state.traceDeliveries;
    refresh("trace", 0);
  });
  bar.appendChild(chip);
  return bar;
}

function isFailure(record) {
  return TRACE_ERRORS.has(record.type) || (record.type === "tool_result" && record.ok === false);
}

function traceRow(record, summary, { intent, delivered }) {
  const row = el("div", "trace-event");
  row.dataset.testid = "trace-event";
  row.dataset.seq = record.seq;
  row.dataset.type = record.type;
  row.hidden = record.type === "message_posted" && !state.traceDeliveries;
  const line = el("div", "trace-line");
  const head = el("div", "trace-head");
  head.appendChild(el("span", "trace-seq", String(record.seq)));
  head.appendChild(el("span", `trace-type type-${record.type}`, record.type));
  const actor = /^[UW][A-Z0-9]+$/.test(record.actor) ? "@" + nameOf(record.actor) : record.actor;
  const who = el("span", "trace-actor", actor);
  who.dataset.testid = "trace-actor";
  head.appendChild(who);
  if (isFailure(record)) {
    row.dataset.error = "true";
    row.classList.add("trace-event-error");
    const badge = el("span", "trace-error-badge", "error");
    badge.dataset.testid = "trace-error-badge";
    head.appendChild(badge);
  } else if (TRACE_REFUSALS.has(record.type)) {
    row.dataset.refused = "true";
    const badge = el("span", "trace-refused-badge", "refused");
    badge.dataset.testid = "trace-refused-badge";
    badge.title = "A click opsloop refused: nothing changed";
    head.appendChild(badge);
  }
  if (delivered) {
    const tick = el("span", "trace-delivered", "✓");
    tick.title = "Shown in Slack (a message_posted event follows)";
    head.appendChild(tick);
  }
  const at = new Date(record.created_at);
  const time = el("time", "trace-time", at.toLocaleTimeString([], { hour12: false }));
  time.title = record.created_at;
  head.appendChild(time);
  line.appendChild(head);
  const text = el("div", "trace-summary", record.type === "tool_result" ? resultSummary(record, intent, summary) : summary || compact(record));
  text.dataset.testid = "trace-summary";
  line.appendChild(text);
  line.title = "Show the event";
  line.addEventListener("click", () => toggleIn(state.traceExpanded, record.seq));
  row.appendChild(line);
  if (record.type === "model_decision") {
    const button = lineButton(state.prompts.has(record.seq) ? "Hide prompt" : "Prompt", () => togglePrompt(record.seq));
    button.dataset.testid = "trace-prompt-button";
    button.dataset.seq = record.seq;
    button.title = "The exact request this decision was made from (opsloop replay --json)";
    head.appendChild(button);
  }
  if (record.type === "tool_result") {
    const open = state.traceResults.has(record.seq);
    const button = lineButton(open ? "Hide output" : record.ok ? "Output" : "Error text", () => toggleIn(state.traceResults, record.seq));
    button.dataset.testid = "trace-result-toggle";
    head.appendChild(button);
    const value = record.ok ? record.output : record.error;
    const pre = el("pre", "trace-json trace-result-json", typeof value === "string" ? value : JSON.stringify(value, null, 2));
    pre.dataset.testid = "trace-result-json";
    pre.hidden = !open;
    row.appendChild(pre);
  }
  if (state.traceExpanded.has(record.seq)) {
    const pre = el("pre", "trace-json", JSON.stringify(record, null, 2));
    pre.dataset.testid = "trace-event-json";
    row.appendChild(pre);
  }
  const prompt = state.prompts.get(record.seq);
  if (prompt) {
    const verdict = el("div", `trace-verdict ${prompt.matches ? "ok" : "mismatch"}`, prompt.verdict);
    verdict.dataset.testid = "trace-verdict";
    verdict.dataset.matches = String(prompt.matches);
    row.appendChild(verdict);
    const pre = el("pre", "trace-json", JSON.stringify(prompt.request, null, 2));
    pre.dataset.testid = "trace-prompt";
    row.appendChild(pre);
  }
  return row;
}

/** A button on a trace line that does not also fold the event open. */
function lineButton(text, onClick) {
  const button = el("button", "link-button trace-line-button", text);
  button.type = "button";
  button.addEventListener("click", (event) => {
    event.stopPropagation();
    onClick();
  });
  return button;
}

function toggleIn(set, key) {
  if (set.has(key)) set.delete(key);
  else set.add(key);
  refresh("trace", 0);
}

/** ``deploy → deployment: 3, service: api`` for a result; the tool's words for an error. */
function resultSummary(record, intent, summary) {
  const tool = intent || record.tool_call_id || "tool";
  const attempt = record.attempt > 1 ? ` (attempt ${record.attempt})` : "";
  if (!record.ok) return `${tool} failed${attempt}: ${record.error || "no reason given"}`;
  const out = record.output;
  if (out && typeof out === "object" && !Array.isArray(out)) {
    const parts = Object.entries(out).map(([k, v]) => `${k}: ${v !== null && typeof v === "object" ? JSON.stringify(v) : v}`);
    const text = `${tool} → ${parts.join(", ")}${attempt}`;
    return text.length > 200 ? text.slice(0, 199) + "…" : text;
  }
  return `${tool} ${summary}`;
}

function compact(record) {
  const rest = Object.fromEntries(Object.entries(record).filter(([k]) => !TRACE_SKIP.has(k)));
  const text = JSON.stringify(rest);
  return text.length > 160 ? text.slice(0, 159) + "…" : text;
}

async function togglePrompt(seq) {
  if (state.prompts.has(seq)) {
    state.prompts.delete(seq);
    refresh("trace", 0);
    return;
  }
  try {
    const data = await api("GET", `/ui/replay?${q({ channel: state.channel, ts: state.thread, seq })}`);
    state.prompts.set(seq, data);
  } catch (err) {
    toast(err.message);
  }
  refresh("trace", 0);
}

function setTrace(open) {
  state.traceOpen = open && !!state.thread;
  $("trace-panel").hidden = !state.traceOpen;
  $("trace-toggle").classList.toggle("active", state.traceOpen);
  if (state.traceOpen) refresh("trace", 0);
}

// --- navigation -----------------------------------------------------------------------------

function go(channel, thread) {
  location.hash = thread ? `#/${channel}/${thread}` : `#/${channel}`;
}

function closeThread() {
  state.thread = null;
  clearInterval(loadingTimer);
  $("thread-pane").hidden = true;
  setTrace(false);
}

function route() {
  const [first, second] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (first === "home") {
    state.view = "home";
    state.channel = null;
    closeThread();
  } else {
    const visible = first && channelOf(first);
    state.view = "channel";
    state.channel = visible ? first : state.ws.channels.find((c) => !c.is_im)?.id;
    state.unread.delete(state.channel);
    const thread = visible && second ? second : null;
    if (thread !== state.thread) {
      state.traceExpanded.clear();
      state.traceResults.clear();
      state.prompts.clear();
    }
    state.thread = thread;
    if (!thread) closeThread();
  }
  renderView();
}

function renderView() {
  const home = state.view === "home";
  $("message-list").hidden = home;
  $("composer").hidden = home;
  $("home-view").hidden = !home;
  renderSuggestions();
  renderSidebar();
  if (home) {
    $("channel-header").textContent = "opsloop · Home";
    $("channel-topic").textContent = "Your pending approvals and recent threads";
    renderHome(null);
    api("POST", "/ui/home", { user: state.me }).catch((err) => toast(err.message));
    refresh("home", 0);
    return;
  }
  const channel = channelOf(state.channel);
  $("channel-header").textContent = channelLabel(channel);
  $("channel-topic").textContent = channel.topic || "";
  $("composer-input").placeholder = channel.is_im
    ? `Message ${state.ws.bot.name}`
    : `Message #${channel.name} (mention @${state.ws.bot.name} to ask it)`;
  refresh("channel", 0);
  if (state.thread) refresh("thread", 0);
  if (state.traceOpen) refresh("trace", 0);
}

// --- writing --------------------------------------------------------------------------------

async function send(input, threadTs) {
  const text = input.value.trim();
  if (!text || !state.channel) return;
  input.disabled = true;
  try {
    const result = await api("POST", "/ui/messages", {
      user: state.me,
      channel: state.channel,
      text,
      ...(threadTs ? { thread_ts: threadTs } : {}),
    });
    if (result && result.ok === false) {
      toast(result.error);
      return;
    }
    input.value = "";
  } catch (err) {
    toast(err.message);
  } finally {
    input.disabled = false;
    input.focus();
  }
}

function wireComposer(form, input, threadTs) {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send(input, threadTs());
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send(input, threadTs());
    }
  });
}

// --- live updates ---------------------------------------------------------------------------

function setConnection(status) {
  const box = $("connection-status");
  box.dataset.state = status;
  box.textContent = { connecting: "connecting…", live: "live", offline: "offline: retrying" }[status];
}

function connect() {
  if (state.source) state.source.close();
  const source = new EventSource(`/ui/events?${q({ user: state.me })}`);
  state.source = source;
  setConnection("connecting");
  const on = (kind, handler) =>
    source.addEventListener(kind, (event) => {
      if (state.source === source) handler(JSON.parse(event.data));
    });
  on("hello", async (data) => {
    setConnection("live");
    if (state.boot && data.boot !== state.boot) await loadWorkspace(); // the server restarted
    state.boot = data.boot;
    refreshAll(); // catch up with what happened while away
    const open = await api("GET", `/ui/views?${q({ user: state.me })}`);
    if (open.views.length) showModal(open.views[open.views.length - 1]);
  });
  on("message", (data) => onMessage(data.channel, data.message, false));
  on("message_changed", (data) => onMessage(data.channel, data.message, true));
  on("ephemeral", (data) => onMessage(data.channel, data.message, false));
  on("view_opened", (data) => showModal(data.view));
  on("view_updated", (data) => state.modal?.id === data.view.id && showModal(data.view));
  on("view_closed", (data) => hideModal(data.id));
  on("home", (data) => state.view === "home" && renderHome(data.view));
  on("agent_status", (data) => data.channel === state.channel && data.thread_ts === state.thread && refresh("thread"));
  on("resync", refreshAll);
  source.onerror = () => {
    if (state.source !== source) return;
    if (source.readyState === EventSource.CLOSED) {
      setConnection("offline");
      setTimeout(() => state.source === source && connect(), 3000);
    } else {
      setConnection("connecting");
    }
  };
}

function onMessage(channel, message, changed) {
  if (channel !== state.channel || state.view !== "channel") {
    if (!changed && !message.ephemeral) {
      state.unread.add(channel);
      renderSidebar();
    }
    return;
  }
  const root = isRoot(message) ? message.ts : message.thread_ts;
  if (isRoot(message) || !message.ephemeral) refresh("channel");
  if (state.thread === root) {
    refresh("thread");
    if (state.traceOpen) refresh("trace", 300);
  }
}

// --- start ----------------------------------------------------------------------------------

function switchUser(id) {
  state.me = id;
  localStorage.setItem("opsloop.me", id);
  hideModal();
  loadWorkspace()
    .then(() => {
      route();
      connect();
    })
    .catch((err) => toast(err.message));
}

function wire() {
  $("user-switcher").addEventListener("change", (event) => switchUser(event.target.value));
  $("home-link").addEventListener("click", () => (location.hash = "#/home"));
  $("fire-alert").addEventListener("click", fireAlert);
  $("thread-close").addEventListener("click", () => go(state.channel));
  $("trace-toggle").addEventListener("click", () => setTrace(!state.traceOpen));
  $("trace-close").addEventListener("click", () => setTrace(false));
  $("trace-refresh").addEventListener("click", () => refresh("trace", 0));
  $("agent-stop").addEventListener("click", stopAgent);
  $("modal-submit").addEventListener("click", submitModal);
  $("modal-close").addEventListener("click", closeModal);
  $("modal-x").addEventListener("click", closeModal);
  $("confirm-ok").addEventListener("click", () => confirmDone && confirmDone(true));
  $("confirm-cancel").addEventListener("click", () => confirmDone && confirmDone(false));
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    if (confirmDone) confirmDone(false);
    else if (state.modal) closeModal();
  });
  wireComposer($("composer"), $("composer-input"), () => null);
  wireComposer($("thread-composer"), $("thread-composer-input"), () => state.thread);
  window.addEventListener("hashchange", route);
}

async function start() {
  wire();
  const stored = localStorage.getItem("opsloop.me");
  state.me = stored || "U0ALICE";
  try {
    await loadWorkspace();
  } catch (err) {
    toast(err.message);
    return;
  }
  if (!person(state.me)) {
    state.me = state.ws.users[0].id;
    await loadWorkspace();
  }
  route();
  connect();
}

start();
