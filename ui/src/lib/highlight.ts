// Syntax colouring with highlight.js, limited to common languages to keep the bundle small.
// The colours are CSS variables below, so they follow the light and dark themes.

import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import dockerfile from "highlight.js/lib/languages/dockerfile";
import go from "highlight.js/lib/languages/go";
import ini from "highlight.js/lib/languages/ini";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import makefile from "highlight.js/lib/languages/makefile";
import markdown from "highlight.js/lib/languages/markdown";
import plaintext from "highlight.js/lib/languages/plaintext";
import python from "highlight.js/lib/languages/python";
import ruby from "highlight.js/lib/languages/ruby";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import "./highlight.css";

const langs = { bash, c, cpp, css, diff, dockerfile, go, ini, java, javascript, json, makefile, markdown, plaintext, python, ruby, rust, sql, typescript, xml, yaml };
for (const [name, lang] of Object.entries(langs)) hljs.registerLanguage(name, lang);

/** HTML with highlight spans (escaped by highlight.js); guesses the language if not given. */
export function highlight(text: string, lang: string | null): string {
  if (lang && hljs.getLanguage(lang)) return hljs.highlight(text, { language: lang, ignoreIllegals: true }).value;
  if (text.length > 200_000) return hljs.highlight(text, { language: "plaintext" }).value;
  return hljs.highlightAuto(text).value;
}
