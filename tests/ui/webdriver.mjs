// The desktop app's tests drive it through tauri-driver (which starts WebKitWebDriver, which
// starts the app): W3C WebDriver commands over HTTP, one session at a time.

import { spawn } from "node:child_process";
import { join } from "node:path";
import { until } from "./harness.mjs";

const ELEMENT = "element-6066-11e4-a4bb-d93f9b5bd54e";

/** Where `cargo install tauri-driver` put it (or TAURI_DRIVER). */
export function tauriDriverExe() {
  return process.env.TAURI_DRIVER || join(process.env.CARGO_HOME || join(process.env.HOME, ".cargo"), "bin/tauri-driver");
}

/**
 * Starts `argv` (tauri-driver with `--port`, possibly behind a wrapper that runs it as someone
 * else) and resolves once it answers on `port`; its output goes to `log`.
 */
export async function startDriver(argv, env, port, log) {
  const driver = spawn(argv[0], argv.slice(1), { env, stdio: ["ignore", "pipe", "pipe"] });
  driver.stdout.on("data", (d) => log.write(d));
  driver.stderr.on("data", (d) => log.write(d));
  let exited = null;
  driver.on("exit", (code, sig) => (exited = { code, sig }));
  await until("tauri-driver to listen", async () => {
    if (exited) throw new Error(`tauri-driver exited: ${JSON.stringify(exited)}`);
    return (await fetch(`http://127.0.0.1:${port}/status`)).ok;
  }, 15_000);
  return driver;
}

/** A WebDriver client on `port`; `launch` opens the session that starts the app. */
export function webDriver(port) {
  let session = null;
  const wd = async (method, path, body) => {
    const res = await fetch(`http://127.0.0.1:${port}${path}`, {
      method,
      headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json).slice(0, 400)}`);
    return json.value;
  };
  const s = (path) => `/session/${session}${path}`;
  const exec = (script, args = []) => wd("POST", s("/execute/sync"), { script, args });
  const find = async (css) => {
    const el = await wd("POST", s("/element"), { using: "css selector", value: css });
    const id = el?.[ELEMENT] ?? Object.values(el ?? {})[0];
    if (!id) throw new Error(`no element ${css}: ${JSON.stringify(el)}`);
    return id;
  };
  return {
    wd,
    s,
    exec,
    find,
    text: () => exec("return document.body.innerText"),
    click: async (css) => wd("POST", s(`/element/${await find(css)}/click`), {}),
    /** Starts the app (`exe` with `args`) in a new session. */
    launch: async (exe, args) => {
      const created = await wd("POST", "/session", {
        capabilities: { alwaysMatch: { "tauri:options": { application: exe, args } } },
      });
      session = created.sessionId;
      return session;
    },
    /** Ends the session (the app with it), if one was started. */
    quit: async () => {
      if (session) await wd("DELETE", `/session/${session}`).catch(() => {});
      session = null;
    },
  };
}
