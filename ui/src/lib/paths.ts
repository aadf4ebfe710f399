// Paths inside a sandbox (always POSIX), and what kind of file a name suggests.

export function joinPath(dir: string, rel: string): string {
  return (dir.endsWith("/") ? dir : dir + "/") + rel.replace(/^\/+/, "");
}

export function dirname(path: string): string {
  const i = path.replace(/\/+$/, "").lastIndexOf("/");
  return i <= 0 ? "/" : path.slice(0, i);
}

export function basename(path: string): string {
  const p = path.replace(/\/+$/, "");
  return p.slice(p.lastIndexOf("/") + 1) || "/";
}

const IMAGE = new Set(["png", "jpg", "jpeg", "gif", "webp", "bmp"]);

const LANG: Record<string, string> = {
  rs: "rust", py: "python", js: "javascript", mjs: "javascript", cjs: "javascript", ts: "typescript",
  tsx: "typescript", jsx: "javascript", json: "json", sh: "bash", bash: "bash", zsh: "bash", md: "markdown",
  toml: "ini", ini: "ini", cfg: "ini", yml: "yaml", yaml: "yaml", html: "xml", xml: "xml", svg: "xml",
  css: "css", c: "c", h: "c", cc: "cpp", cpp: "cpp", hpp: "cpp", go: "go", java: "java", rb: "ruby",
  sql: "sql", diff: "diff", patch: "diff", dockerfile: "dockerfile", makefile: "makefile", txt: "plaintext",
};

function ext(name: string): string {
  const lower = name.toLowerCase();
  if (lower === "dockerfile" || lower === "makefile") return lower;
  const i = lower.lastIndexOf(".");
  return i < 0 ? "" : lower.slice(i + 1);
}

export function isImage(name: string): boolean {
  return IMAGE.has(ext(name));
}

/** A highlight.js language for a file name, or null to guess. */
export function language(name: string): string | null {
  return LANG[ext(name)] ?? null;
}
