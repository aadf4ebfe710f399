// The desktop app as a user's machine has it after installing the .deb: run.sh unpacks the
// package into a clean prefix (`dpkg -x`), and this reads it back the way a desktop environment
// does — the desktop entry's `Exec=` line names the program, resolved inside the prefix (never
// to a binary elsewhere on the machine, which would hide a package that lacks it).

import { execFileSync } from "node:child_process";
import { accessSync, constants, existsSync, readFileSync, readdirSync } from "node:fs";
import { isAbsolute, join } from "node:path";

/** The `[Desktop Entry]` group of a .desktop file as a map of its keys. */
export function parseDesktopEntry(text) {
  const entry = new Map();
  let group = null;
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    if (line.startsWith("[")) {
      group = line;
      continue;
    }
    const eq = line.indexOf("=");
    if (group === "[Desktop Entry]" && eq > 0) entry.set(line.slice(0, eq).trim(), line.slice(eq + 1).trim());
  }
  return entry;
}

/**
 * The argument vector of an `Exec=` value (the Desktop Entry Specification's quoting: double
 * quotes, backslash escapes inside them), without the field codes a launcher fills with files
 * or URLs (`%f`, `%U`, ...; none are given when the app is started from its icon) and with
 * `%%` as a literal `%`.
 */
export function execArgv(exec) {
  const args = [];
  let cur = null;
  for (let i = 0; i < exec.length; i++) {
    const c = exec[i];
    if (c === '"') {
      cur ??= "";
      for (i++; i < exec.length && exec[i] !== '"'; i++) cur += exec[i] === "\\" ? exec[++i] : exec[i];
      if (i >= exec.length) throw new Error(`Exec=${exec}: unterminated quote`);
    } else if (c === " " || c === "\t") {
      if (cur !== null) args.push(cur);
      cur = null;
    } else {
      cur = (cur ?? "") + c;
    }
  }
  if (cur !== null) args.push(cur);
  const codes = /^%[fFuUdDnNickvm]$/;
  return args.filter((a) => !codes.test(a)).map((a) => a.replaceAll("%%", "%"));
}

function executable(path) {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * The installed app under `prefix`: its desktop entry, the program and arguments its `Exec=`
 * runs (a bare name is looked up in the prefix's bin directories, as PATH would find it in
 * /usr/bin), and its icon. Throws on anything a desktop would fail on.
 */
export function installedApp(prefix) {
  const apps = join(prefix, "usr/share/applications");
  const entries = existsSync(apps) ? readdirSync(apps).filter((f) => f.endsWith(".desktop")) : [];
  if (entries.length !== 1) throw new Error(`expected one desktop entry in ${apps}, found ${JSON.stringify(entries)}`);
  const desktopFile = join(apps, entries[0]);
  const entry = parseDesktopEntry(readFileSync(desktopFile, "utf8"));
  for (const key of ["Type", "Name", "Exec", "Icon"]) {
    if (!entry.get(key)) throw new Error(`${desktopFile} has no ${key}=`);
  }
  if (entry.get("Type") !== "Application") throw new Error(`${desktopFile}: Type=${entry.get("Type")}`);
  const [program, ...args] = execArgv(entry.get("Exec"));
  const candidates = isAbsolute(program)
    ? [join(prefix, program)]
    : ["usr/local/bin", "usr/bin", "bin"].map((d) => join(prefix, d, program));
  const exe = candidates.find(executable);
  if (!exe) throw new Error(`Exec=${entry.get("Exec")}: no executable ${program} in the package (looked at ${candidates.join(", ")})`);
  const icon = entry.get("Icon");
  const iconFound = isAbsolute(icon)
    ? existsSync(join(prefix, icon))
    : existsSync(join(prefix, "usr/share/icons/hicolor")) &&
      readdirSync(join(prefix, "usr/share/icons/hicolor")).some((size) =>
        ["png", "svg", "xpm"].some((ext) => existsSync(join(prefix, "usr/share/icons/hicolor", size, "apps", `${icon}.${ext}`))));
  if (!iconFound) throw new Error(`Icon=${icon} is not in the package`);
  return { desktopFile, entry, exe, args };
}

/**
 * The .deb's `Depends:` groups that no installed package satisfies (by name; the versions are
 * left to dpkg). Unpacking with `dpkg -x` skips this check, so the test makes it.
 */
export function unmetDependencies(deb) {
  const depends = execFileSync("dpkg-deb", ["-f", deb, "Depends"], { encoding: "utf8" }).trim();
  const installed = (name) => {
    try {
      return execFileSync("dpkg-query", ["-W", "-f=${Status}", name], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
        .endsWith(" installed");
    } catch {
      return false;
    }
  };
  return depends
    .split(",")
    .map((g) => g.trim())
    .filter(Boolean)
    .filter((group) => !group.split("|").some((alt) => installed(alt.trim().replace(/\s*\(.*\)$/, "").replace(/:any$/, ""))));
}
