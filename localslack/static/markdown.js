// Markdown (what streamed messages carry: chat.startStream's markdown_text, the markdown
// block) to DOM nodes, safely: every piece of text becomes a Text node, nothing is parsed
// as HTML. Slack's escaping (&amp; &lt; &gt;) is undone on the text, as for mrkdwn.
//
// Recognised: ``` fences ```, # headings, - / * / 1. list items, > quotes, paragraphs
// (blank lines), and inline `code`, Slack's mention tokens (<@U…>, <#C…>, <!here>, as
// in mrkdwn: the app writes "Stopped by <@U…>"), **bold** / __bold__, *italic* /
// _italic_, ~~strike~~, [text](url) and bare http(s) links (web links only: any other URL
// stays text).

import { token, unescapeSlack } from "./mrkdwn.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The markdown `text` as a DocumentFragment. ctx: { linkFor(url) -> {href, internal} | null } */
export function renderMarkdown(text, ctx) {
  const box = document.createDocumentFragment();
  const lines = String(text ?? "").split("\n");
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) box.appendChild(inlineInto(el("div", "md-p"), para.join("\n"), ctx));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (/^\s*```/.test(line)) {
      flush();
      list = null;
      const code = [];
      for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) code.push(lines[i]);
      box.appendChild(el("pre", "md-pre", unescapeSlack(code.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    const item = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/.exec(line);
    const quote = /^(?:>|&gt;)\s?(.*)$/.exec(line);
    if (heading || item || quote || !line.trim()) flush();
    if (!item) list = null;
    if (heading) {
      box.appendChild(inlineInto(el("div", `md-h md-h${heading[1].length}`), heading[2], ctx));
    } else if (item) {
      const ordered = item[1] !== undefined;
      if (!list || list.ordered !== ordered) {
        list = { ordered, node: el(ordered ? "ol" : "ul", "md-list") };
        box.appendChild(list.node);
      }
      list.node.appendChild(inlineInto(el("li"), item[2], ctx));
    } else if (quote) {
      box.appendChild(inlineInto(el("blockquote", "md-quote"), quote[1], ctx));
    } else if (line.trim()) {
      para.push(line);
    }
  }
  flush();
  return box;
}

const INLINE = new RegExp(
  [
    /`([^`\n]+)`/.source, // 1 code
    /\*\*(.+?)\*\*/.source, // 2 bold
    /__(.+?)__/.source, // 3 bold
    /~~(.+?)~~/.source, // 4 strike
    /\*([^*\s](?:[^*\n]*[^*\s])?)\*/.source, // 5 italic
    /(?<!\w)_([^_\s](?:[^_\n]*[^_\s])?)_(?!\w)/.source, // 6 italic
    /\[([^\]\n]+)\]\(([^)\s]+)\)/.source, // 7 text, 8 url
    /(https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"])/.source, // 9 a bare link
    /<([@#!][^<>\n]+)>/.source, // 10 a mention token
  ].join("|"),
);

function inlineInto(parent, text, ctx) {
  let rest = text;
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) break;
    if (m.index) parent.appendChild(document.createTextNode(unescapeSlack(rest.slice(0, m.index))));
    parent.appendChild(inlineNode(m, ctx));
    rest = rest.slice(m.index + m[0].length);
  }
  if (rest) parent.appendChild(document.createTextNode(unescapeSlack(rest)));
  return parent;
}

function inlineNode(m, ctx) {
  const wrap = (tag, className, inner) => inlineInto(el(tag, className), inner, ctx);
  if (m[1] !== undefined) return el("code", "md-code", unescapeSlack(m[1]));
  if (m[2] !== undefined || m[3] !== undefined) return wrap("strong", "md-strong", m[2] ?? m[3]);
  if (m[4] !== undefined) return wrap("s", "md-s", m[4]);
  if (m[5] !== undefined || m[6] !== undefined) return wrap("em", "md-em", m[5] ?? m[6]);
  if (m[7] !== undefined) return link(unescapeSlack(m[7]), unescapeSlack(m[8]), ctx);
  if (m[10] !== undefined) return token(m[10], ctx);
  return link(m[9], m[9], ctx);
}

/** A link: a web link opens in a new tab, one into this workspace here; others are text. */
export function link(text, url, ctx) {
  const target = ctx && ctx.linkFor ? ctx.linkFor(url) : null;
  if (!target) return el("span", "md-link-text", text);
  const a = el("a", "md-link", text);
  a.href = target.href;
  if (!target.internal) {
    a.target = "_blank";
    a.rel = "noopener noreferrer";
  }
  return a;
}
