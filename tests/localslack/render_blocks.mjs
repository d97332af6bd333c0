// Renders Block Kit blocks with the page's own blocks.js in Node, over a small DOM of
// its own, and prints the result as HTML (text escaped): the page's rendering, checked
// without a browser. Usage: node render_blocks.mjs DIR < blocks.json  (DIR holds the
// page's scripts, as ES modules).

import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

class Node {
  constructor() {
    this.childNodes = [];
  }
  appendChild(child) {
    if (child instanceof Fragment) {
      for (const c of child.childNodes) this.childNodes.push(c);
      child.childNodes = [];
    } else {
      this.childNodes.push(child);
    }
    return child;
  }
  replaceChildren(...children) {
    this.childNodes = [];
    for (const c of children) this.appendChild(typeof c === "string" ? new Text(c) : c);
  }
  get textContent() {
    return this.childNodes.map((c) => c.textContent).join("");
  }
  set textContent(text) {
    this.childNodes = text === "" ? [] : [new Text(String(text))];
  }
}

class Text {
  constructor(text) {
    this.data = String(text);
  }
  get textContent() {
    return this.data;
  }
}

class Fragment extends Node {}

class Element extends Node {
  constructor(tag) {
    super();
    this.tagName = tag;
    this.className = "";
    this.dataset = {};
    this.style = {};
    this.attributes = {};
    this.listeners = {};
  }
  setAttribute(name, value) {
    this.attributes[name] = String(value);
  }
  addEventListener(kind, handler) {
    (this.listeners[kind] ||= []).push(handler);
  }
  get classList() {
    const self = this;
    return {
      add: (name) => (self.className = `${self.className} ${name}`.trim()),
      remove: () => {},
      toggle: () => {},
    };
  }
}

globalThis.document = {
  createElement: (tag) => new Element(tag),
  createTextNode: (text) => new Text(text),
  createDocumentFragment: () => new Fragment(),
};

const escape = (text) =>
  String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
const PROPS = ["href", "target", "rel", "title", "type", "disabled", "hidden"];

function html(node) {
  if (node instanceof Text) return escape(node.data);
  if (node instanceof Fragment) return node.childNodes.map(html).join("");
  const attrs = [];
  if (node.className) attrs.push(`class="${escape(node.className)}"`);
  for (const prop of PROPS) if (node[prop]) attrs.push(`${prop}="${escape(node[prop])}"`);
  for (const [k, v] of Object.entries(node.dataset)) {
    attrs.push(`data-${k.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase())}="${escape(v)}"`);
  }
  for (const [k, v] of Object.entries(node.attributes)) attrs.push(`${k}="${escape(v)}"`);
  if (node.listeners.click) attrs.push('data-clickable="true"');
  const open = [node.tagName, ...attrs].join(" ");
  return `<${open}>${node.childNodes.map(html).join("")}</${node.tagName}>`;
}

const dir = process.argv[2];
const { renderBlocks } = await import(pathToFileURL(`${dir}/blocks.js`).href);
const blocks = JSON.parse(readFileSync(0, "utf8"));
const ctx = {
  userName: (id) => id,
  channelName: () => null,
  groupName: (id) => id,
  linkFor: (url) => (/^(https?:|mailto:)/i.test(url) ? { href: url, internal: false } : null),
  onButton: () => {},
};
process.stdout.write(html(renderBlocks(blocks, ctx)));
