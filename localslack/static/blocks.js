// Block Kit to DOM nodes: header, section (text, fields, accessory), context, divider,
// actions (buttons with style and confirm), input (in modals: a text input, a static_select
// or checkboxes), rich_text and image; and the agent blocks of a streamed message: markdown,
// plan (a title and its task cards), task_card (status, details, output, sources) and
// context_actions (the feedback buttons).
// Text goes through renderMrkdwn, renderMarkdown or textContent only: nothing is parsed
// as HTML.
//
// Buttons carry data-testid="block-button", data-action-id, data-block-id and
// data-style; ctx.onButton(button, blockId, node) is called when one is clicked. The two
// feedback buttons carry data-testid="feedback-button", data-value = positive |
// negative and aria-pressed (the one ctx.feedbackChosen(blockId) names is pressed);
// ctx.onButton(element, blockId, node, value) is called for them. As in Slack, they show
// as 👍 / 👎, their text as the tooltip.

import { link, renderMarkdown } from "./markdown.js";
import { renderMrkdwn, unescapeSlack } from "./mrkdwn.js";

// The status icons of a task card (Slack's: pending, in progress, complete, error).
const TASK_ICONS = { pending: "○", in_progress: "◔", complete: "✓", error: "✕" };
const TASK_WORDS = { pending: "pending", in_progress: "in progress", complete: "complete", error: "error" };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A text object (plain_text or mrkdwn) as nodes. */
export function textObject(obj, ctx) {
  if (!obj || typeof obj !== "object") return document.createTextNode("");
  if (obj.type === "mrkdwn") return renderMrkdwn(obj.text || "", ctx);
  return document.createTextNode(unescapeSlack(obj.text || ""));
}

/** The blocks as one container element. */
export function renderBlocks(blocks, ctx) {
  const box = el("div", "blocks");
  (Array.isArray(blocks) ? blocks : []).forEach((block, index) => {
    if (!block || typeof block !== "object") return;
    const blockId = block.block_id || `b${index}`;
    const render = RENDERERS[block.type] || unsupported;
    const node = render(block, ctx, blockId);
    if (node) {
      node.dataset.blockType = block.type;
      node.dataset.blockId = blockId;
      box.appendChild(node);
    }
  });
  return box;
}

const RENDERERS = {
  header(block, ctx) {
    const h = el("div", "bk-header");
    h.appendChild(textObject(block.text, ctx));
    return h;
  },
  section(block, ctx, blockId) {
    const section = el("div", "bk-section");
    const main = el("div", "bk-section-main");
    if (block.text) {
      const text = el("div", "bk-text");
      text.appendChild(textObject(block.text, ctx));
      main.appendChild(text);
    }
    if (Array.isArray(block.fields) && block.fields.length) {
      const fields = el("div", "bk-fields");
      for (const field of block.fields) {
        const cell = el("div", "bk-field");
        cell.appendChild(textObject(field, ctx));
        fields.appendChild(cell);
      }
      main.appendChild(fields);
    }
    section.appendChild(main);
    if (block.accessory) {
      const side = el("div", "bk-accessory");
      side.appendChild(element(block.accessory, ctx, blockId));
      section.appendChild(side);
    }
    return section;
  },
  context(block, ctx) {
    const row = el("div", "bk-context");
    for (const item of block.elements || []) {
      if (item && item.type === "image") {
        row.appendChild(el("span", "bk-image-alt", item.alt_text || "image"));
      } else {
        const span = el("span", "bk-context-item");
        span.appendChild(textObject(item, ctx));
        row.appendChild(span);
      }
    }
    return row;
  },
  divider() {
    return el("hr", "bk-divider");
  },
  actions(block, ctx, blockId) {
    const row = el("div", "bk-actions");
    for (const item of block.elements || []) row.appendChild(element(item, ctx, blockId));
    return row;
  },
  image(block) {
    return el("div", "bk-image-alt", `[image: ${block.alt_text || "no description"}]`);
  },
  rich_text(block, ctx) {
    const box = el("div", "bk-rich-text");
    for (const part of block.elements || []) box.appendChild(richPart(part, ctx));
    return box;
  },
  markdown(block, ctx) {
    const box = el("div", "bk-markdown");
    box.appendChild(renderMarkdown(block.text || "", ctx));
    return box;
  },
  plan(block, ctx) {
    const plan = el("div", "bk-plan");
    plan.dataset.testid = "plan";
    const tasks = Array.isArray(block.tasks) ? block.tasks : [];
    const head = el("div", "bk-plan-head");
    const title = el("span", "bk-plan-title", block.title || "Plan");
    title.dataset.testid = "plan-title";
    head.appendChild(title);
    const done = tasks.filter((t) => t && t.status === "complete").length;
    if (tasks.length) head.appendChild(el("span", "bk-plan-count", `${done} of ${tasks.length} done`));
    plan.appendChild(head);
    for (const task of tasks) if (task && typeof task === "object") plan.appendChild(taskCard(task, ctx));
    return plan;
  },
  task_card(block, ctx) {
    return taskCard(block, ctx);
  },
  context_actions(block, ctx, blockId) {
    const row = el("div", "bk-context-actions");
    for (const item of block.elements || []) {
      if (item && item.type === "feedback_buttons") row.appendChild(feedbackButtons(item, ctx, blockId));
      else row.appendChild(el("span", "bk-unsupported", `[${(item && item.type) || "element"}]`));
    }
    return row;
  },
  input(block, ctx, blockId) {
    const field = el("div", "bk-input");
    const label = el("label", "bk-input-label");
    label.appendChild(textObject(block.label, ctx));
    if (block.optional) label.appendChild(el("span", "bk-optional", " (optional)"));
    field.appendChild(label);
    const spec = block.element || {};
    let control;
    if (spec.type === "plain_text_input") {
      control = document.createElement(spec.multiline ? "textarea" : "input");
      if (!spec.multiline) control.type = "text";
      if (spec.max_length) control.maxLength = spec.max_length;
      if (spec.placeholder) control.placeholder = unescapeSlack(spec.placeholder.text || "");
      if (spec.initial_value) control.value = spec.initial_value;
      control.className = "bk-input-control";
      control.dataset.testid = "modal-input";
      control.dataset.blockId = blockId;
      control.dataset.actionId = spec.action_id || "";
      control.id = `input-${blockId}`;
      label.htmlFor = control.id;
    } else if (spec.type === "static_select") {
      control = document.createElement("select");
      // Nothing chosen yet: what an optional select without an initial option sends.
      const none = el("option", "", unescapeSlack((spec.placeholder || {}).text || "Choose…"));
      none.value = "";
      control.appendChild(none);
      for (const item of spec.options || []) {
        const option = el("option", "", unescapeSlack((item.text || {}).text || ""));
        option.value = item.value;
        control.appendChild(option);
      }
      control.value = spec.initial_option ? spec.initial_option.value : "";
      control.className = "bk-input-control";
      control.dataset.testid = "modal-input";
      control.dataset.blockId = blockId;
      control.dataset.actionId = spec.action_id || "";
      control.id = `input-${blockId}`;
      label.htmlFor = control.id;
    } else if (spec.type === "checkboxes") {
      // One control for the group: the page sends the values of the ticked boxes.
      control = el("div", "bk-checkboxes");
      control.dataset.testid = "modal-input";
      control.dataset.kind = "checkboxes";
      control.dataset.blockId = blockId;
      control.dataset.actionId = spec.action_id || "";
      const ticked = new Set((spec.initial_options || []).map((o) => o.value));
      for (const item of spec.options || []) {
        const row = el("label", "bk-checkbox");
        const box = document.createElement("input");
        box.type = "checkbox";
        box.value = item.value;
        box.checked = ticked.has(item.value);
        row.appendChild(box);
        row.appendChild(textObject(item.text, ctx));
        control.appendChild(row);
      }
    } else {
      control = el("div", "bk-unsupported", `[unsupported input: ${spec.type || "?"}]`);
    }
    field.appendChild(control);
    if (block.hint) {
      const hint = el("div", "bk-hint");
      hint.appendChild(textObject(block.hint, ctx));
      field.appendChild(hint);
    }
    const error = el("div", "bk-input-error");
    error.dataset.testid = "modal-error";
    error.dataset.blockId = blockId;
    error.hidden = true;
    field.appendChild(error);
    return field;
  },
};

function unsupported(block) {
  return el("div", "bk-unsupported", `[unsupported block: ${block.type || "?"}]`);
}

function element(item, ctx, blockId) {
  if (!item || item.type !== "button") {
    return el("span", "bk-unsupported", `[${(item && item.type) || "element"}]`);
  }
  const button = el("button", "bk-button");
  button.type = "button";
  button.appendChild(textObject(item.text, ctx));
  button.dataset.testid = "block-button";
  button.dataset.actionId = item.action_id || "";
  button.dataset.blockId = blockId;
  if (item.style === "primary" || item.style === "danger") {
    button.dataset.style = item.style;
    button.classList.add(`bk-button-${item.style}`);
  }
  if (item.url) button.title = item.url;
  if (ctx.onButton) {
    button.addEventListener("click", () => ctx.onButton(item, blockId, button));
  } else {
    button.disabled = true;
  }
  return button;
}

function taskCard(task, ctx) {
  const status = TASK_ICONS[task.status] ? task.status : "pending";
  const card = el("div", `bk-task bk-task-${status}`);
  card.dataset.testid = "task-card";
  card.dataset.taskId = task.task_id || task.id || "";
  card.dataset.status = status;
  const head = el("div", "bk-task-head");
  const icon = el("span", "bk-task-icon", TASK_ICONS[status]);
  icon.title = TASK_WORDS[status];
  icon.setAttribute("aria-label", TASK_WORDS[status]);
  head.appendChild(icon);
  const title = el("span", "bk-task-title", unescapeSlack(task.title || ""));
  title.dataset.testid = "task-title";
  head.appendChild(title);
  card.appendChild(head);
  for (const key of ["details", "output"]) {
    const value = task[key];
    if (!value) continue;
    const part = el("div", `bk-task-${key}`);
    part.dataset.testid = `task-${key}`;
    if (typeof value === "string") part.textContent = unescapeSlack(value);
    else part.appendChild(RENDERERS.rich_text(value, ctx));
    card.appendChild(part);
  }
  const sources = Array.isArray(task.sources) ? task.sources.filter((s) => s && s.url) : [];
  if (sources.length) {
    const list = el("div", "bk-task-sources");
    for (const source of sources) {
      const node = link(source.text || source.url, source.url, ctx);
      node.dataset.testid = "task-source";
      list.appendChild(node);
    }
    card.appendChild(list);
  }
  return card;
}

function feedbackButtons(item, ctx, blockId) {
  const pair = el("span", "bk-feedback");
  const chosen = ctx.feedbackChosen ? ctx.feedbackChosen(blockId) : null;
  for (const [value, spec, icon] of [
    ["positive", item.positive_button, "👍"],
    ["negative", item.negative_button, "👎"],
  ]) {
    if (!spec) continue;
    const button = el("button", "bk-feedback-button", icon);
    button.type = "button";
    const words = unescapeSlack((spec.text && spec.text.text) || "");
    if (words) button.title = words;
    button.ariaLabel = spec.accessibility_label || words || icon;
    button.ariaPressed = String(chosen === value);
    if (chosen === value) button.classList.add("bk-feedback-chosen");
    button.dataset.testid = "feedback-button";
    button.dataset.actionId = item.action_id || "";
    button.dataset.blockId = blockId;
    button.dataset.value = value;
    if (ctx.onButton) button.addEventListener("click", () => ctx.onButton(item, blockId, button, value));
    else button.disabled = true;
    pair.appendChild(button);
  }
  return pair;
}

function richPart(part, ctx) {
  const tag = part.type === "rich_text_preformatted" ? "pre" : part.type === "rich_text_quote" ? "blockquote" : "div";
  const box = el(tag, `bk-rich-${part.type || "section"}`);
  if (part.type === "rich_text_list") {
    const list = el(part.style === "ordered" ? "ol" : "ul");
    for (const item of part.elements || []) {
      const li = el("li");
      li.appendChild(richPart(item, ctx));
      list.appendChild(li);
    }
    box.appendChild(list);
    return box;
  }
  for (const item of part.elements || []) box.appendChild(richInline(item, ctx));
  return box;
}

function richInline(item, ctx) {
  let node;
  switch (item.type) {
    case "user":
      node = el("span", "md-mention", "@" + ctx.userName(item.user_id));
      break;
    case "channel":
      node = el("span", "md-channel", "#" + (ctx.channelName(item.channel_id) || item.channel_id));
      break;
    case "usergroup":
      node = el("span", "md-mention", "@" + ctx.groupName(item.usergroup_id));
      break;
    case "broadcast":
      node = el("span", "md-mention md-broadcast", "@" + item.range);
      break;
    case "link": {
      const link = ctx.linkFor(item.url || "");
      node = link ? el("a", "md-link", item.text || item.url) : el("span", "md-link-text", item.text || item.url);
      if (link) {
        node.href = link.href;
        if (!link.internal) {
          node.target = "_blank";
          node.rel = "noopener noreferrer";
        }
      }
      break;
    }
    case "emoji":
      node = el("span", "md-emoji", emoji(item));
      break;
    default:
      node = el("span", "", item.text || "");
  }
  const style = item.style || {};
  if (style.code) node = wrap("code", "md-code", node);
  if (style.bold) node = wrap("strong", "md-strong", node);
  if (style.italic) node = wrap("em", "md-em", node);
  if (style.strike) node = wrap("s", "md-s", node);
  return node;
}

function emoji(item) {
  try {
    if (item.unicode) return String.fromCodePoint(...item.unicode.split("-").map((h) => parseInt(h, 16)));
  } catch {
    // not a code point: show its name
  }
  return `:${item.name || "?"}:`;
}

function wrap(tag, className, child) {
  const outer = el(tag, className);
  outer.appendChild(child);
  return outer;
}
