// Slack mrkdwn to DOM nodes, safely.
//
// Nothing here ever assigns HTML: every piece of text becomes a Text node (or an
// element's textContent), so a message can hold any characters and still only show
// them. Slack's own escaping (&amp; &lt; &gt;, the only entities it decodes) is undone
// on the text itself, after the markup was recognised, so "&lt;b&gt;" shows as "<b>".
//
// Recognised, in this order: ``` code blocks ```, `inline code`, <tokens> (links
// <url|text>, user mentions <@U…>, channels <#C…|name>, <!here>, user groups
// <!subteam^S…>, dates <!date^ts^format|fallback>), then lines starting with ">" (or
// Slack's escaped "&gt;") as a quote, then *bold*, _italic_ and ~strike~ (nested), and
// line breaks (kept by CSS white-space: pre-wrap).

const PLACEHOLDER_BASE = 0xe000; // private-use characters stand for atoms while formatting
const PLACEHOLDER_MAX = 0xf8ff;

/** Undo Slack's escaping of &, < and > (and nothing else). */
export function unescapeSlack(text) {
  return String(text).replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * The mrkdwn `text` as a DocumentFragment.
 * ctx: { userName(id) -> string, channelName(id) -> string|null, groupName(id) -> string,
 *        linkFor(url) -> {href, internal} | null }
 */
export function renderMrkdwn(text, ctx) {
  const atoms = [];
  const keep = (node) => {
    if (PLACEHOLDER_BASE + atoms.length > PLACEHOLDER_MAX) return "";
    atoms.push(node);
    return String.fromCharCode(PLACEHOLDER_BASE + atoms.length - 1);
  };
  // Characters that would be mistaken for placeholders are shown as a replacement mark.
  let rest = String(text ?? "").replace(/[\ue000-\uf8ff]/g, "\ufffd");

  rest = rest.replace(/```([\s\S]*?)```/g, (_, code) => {
    const pre = el("pre", "md-pre");
    pre.textContent = unescapeSlack(code.replace(/^\n/, "").replace(/\n$/, ""));
    return keep(pre);
  });
  rest = rest.replace(/`([^`\n]+)`/g, (_, code) => keep(el("code", "md-code", unescapeSlack(code))));
  rest = rest.replace(/<([^<>\n]+)>/g, (whole, inner) => {
    const node = token(inner, ctx);
    return node ? keep(node) : whole;
  });

  const fragment = document.createDocumentFragment();
  for (const part of quoteRuns(rest)) {
    if (!part.quote) {
      formatInto(fragment, part.text, atoms);
      continue;
    }
    const quote = el("blockquote", "md-quote");
    formatInto(quote, part.text, atoms);
    fragment.appendChild(quote);
  }
  return fragment;
}

// A quote line as Slack sends it: ">" or "&gt;" at the start of a line, then an optional
// space. Code blocks are placeholders by now, so a ">" inside one is never a quote.
const QUOTE_MARK = /^(?:>|&gt;) ?/;

/** The text cut into runs of quoted and plain lines, the quote marks taken off. The line
 * break next to a quote goes too: the quote is a block of its own. */
function quoteRuns(text) {
  const runs = [];
  for (const line of text.split("\n")) {
    const quote = QUOTE_MARK.test(line);
    const body = quote ? line.replace(QUOTE_MARK, "") : line;
    const last = runs[runs.length - 1];
    if (last && last.quote === quote) last.lines.push(body);
    else runs.push({ quote, lines: [body] });
  }
  return runs.map(({ quote, lines }) => ({ quote, text: lines.join("\n") }));
}

const MARKS = { "*": "strong", _: "em", "~": "s" };
// A span opens after the start, whitespace or punctuation, and closes before the end,
// whitespace or punctuation, with no whitespace just inside its marks (as Slack does).
const SPAN = /(^|[\s([{"'\u2014\u2013\ue000-\uf8ff-])([*_~])(?=\S)([^\n]*?\S)\2(?=$|[\s.,;:!?)\]}"'\u2014\u2013\ue000-\uf8ff-])/;

function formatInto(parent, text, atoms) {
  let rest = text;
  while (rest) {
    const match = SPAN.exec(rest);
    if (!match) {
      appendText(parent, rest, atoms);
      return;
    }
    const [whole, lead, mark, inner] = match;
    appendText(parent, rest.slice(0, match.index) + lead, atoms);
    const span = el(MARKS[mark], `md-${MARKS[mark]}`);
    formatInto(span, inner, atoms);
    parent.appendChild(span);
    rest = rest.slice(match.index + whole.length);
  }
}

function appendText(parent, text, atoms) {
  let plain = "";
  for (const ch of text) {
    const code = ch.charCodeAt(0);
    if (code >= PLACEHOLDER_BASE && code - PLACEHOLDER_BASE < atoms.length) {
      if (plain) parent.appendChild(document.createTextNode(unescapeSlack(plain)));
      plain = "";
      parent.appendChild(atoms[code - PLACEHOLDER_BASE]);
    } else {
      plain += ch;
    }
  }
  if (plain) parent.appendChild(document.createTextNode(unescapeSlack(plain)));
}

/** One <…> token as a node, or null when it is not one (then it shows as written). */
export function token(inner, ctx) {
  const [target, ...labelParts] = inner.split("|");
  const label = labelParts.length ? unescapeSlack(labelParts.join("|")) : "";
  if (target.startsWith("@")) {
    const id = target.slice(1);
    return el("span", "md-mention", "@" + (label || ctx.userName(id)));
  }
  if (target.startsWith("#")) {
    const id = target.slice(1);
    const name = label || ctx.channelName(id) || id;
    const link = el("a", "md-channel", "#" + name);
    link.href = "#/" + encodeURIComponent(id);
    return link;
  }
  if (target.startsWith("!")) return special(target.slice(1), label, ctx);
  const link = ctx.linkFor(unescapeSlack(target));
  if (!link) return el("span", "md-link-text", label || unescapeSlack(target));
  const a = el("a", "md-link", label || unescapeSlack(target));
  a.href = link.href;
  if (!link.internal) {
    a.target = "_blank";
    a.rel = "noopener noreferrer";
  }
  return a;
}

function special(body, label, ctx) {
  if (body === "here" || body === "channel" || body === "everyone") {
    return el("span", "md-mention md-broadcast", "@" + body);
  }
  if (body.startsWith("subteam^")) {
    return el("span", "md-mention", "@" + (label.replace(/^@/, "") || ctx.groupName(body.slice(8))));
  }
  if (body.startsWith("date^")) {
    const [, seconds, format] = body.split("^");
    const shown = formatDate(Number(seconds), format || "", label);
    const time = el("time", "md-date", shown);
    if (Number.isFinite(Number(seconds))) time.dateTime = new Date(Number(seconds) * 1000).toISOString();
    time.title = label;
    return time;
  }
  return el("span", "md-special", label || body);
}

const DAY_MS = 86400000;

/** Slack's date token formats, in the reader's time zone; `fallback` for the others. */
export function formatDate(seconds, format, fallback) {
  if (!Number.isFinite(seconds)) return fallback;
  const when = new Date(seconds * 1000);
  const today = new Date();
  const days = Math.round((startOfDay(when) - startOfDay(today)) / DAY_MS);
  const relative = days === 0 ? "today" : days === -1 ? "yesterday" : days === 1 ? "tomorrow" : null;
  const short = when.toLocaleDateString(undefined, { month: "short", day: "numeric" });
  const long = when.toLocaleDateString(undefined, { weekday: "long", month: "long", day: "numeric", year: "numeric" });
  const values = {
    date_num: when.toISOString().slice(0, 10),
    date: when.toLocaleDateString(undefined, { month: "long", day: "numeric", year: "numeric" }),
    date_short: short,
    date_long: long,
    date_pretty: relative || when.toLocaleDateString(undefined, { month: "long", day: "numeric", year: "numeric" }),
    date_short_pretty: relative || short,
    date_long_pretty: relative || long,
    time: when.toLocaleTimeString(undefined, { hour: "numeric", minute: "2-digit" }),
    time_secs: when.toLocaleTimeString(undefined, { hour: "numeric", minute: "2-digit", second: "2-digit" }),
  };
  let unknown = false;
  const shown = format.replace(/\{(\w+)\}/g, (whole, name) => {
    if (name in values) return values[name];
    unknown = true;
    return whole;
  });
  return unknown || !format ? fallback : shown;
}

function startOfDay(date) {
  return new Date(date.getFullYear(), date.getMonth(), date.getDate()).getTime();
}
