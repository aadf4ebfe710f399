// Shared parts of the UI tests: a real belljard on a temporary BELLJAR_HOME and a free port,
// requests to its API (Unix socket, no token needed), and a tiny step runner that counts
// passes and failures and saves screenshots to docs/screenshots/.

import { spawn } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const screenshots = join(repo, "docs/screenshots");
mkdirSync(screenshots, { recursive: true });

/** Where cargo put the binaries (run.sh exports CARGO_TARGET_DIR). */
export function targetDir() {
  return process.env.CARGO_TARGET_DIR || join(repo, "target");
}

export function bin(name, profile = "debug") {
  const p = join(targetDir(), profile, name);
  if (!existsSync(p)) throw new Error(`${p} is missing: build it first (tests/ui/run.sh does)`);
  return p;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until `f` returns something truthy, or throws after `ms` with `what`. */
export async function until(what, f, ms = 20_000, every = 100) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await f();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`Timed out waiting for ${what}${last ? `: ${last.message}` : ""}`);
    await sleep(every);
  }
}

/** A fresh BELLJAR_HOME with the directories the daemon and the app resolve. */
export function freshHome(prefix = "belljar-ui-") {
  const home = mkdtempSync(join(tmpdir(), prefix));
  return {
    home,
    socket: join(home, "run/belljard.sock"),
    portFile: join(home, "run/port"),
    pidFile: join(home, "run/belljard.pid"),
    tokenFile: join(home, "config/token"),
    remove: () => rmSync(home, { recursive: true, force: true }),
  };
}

/** The environment a daemon (or the app that starts one) gets in the tests. */
export function daemonEnv(h) {
  return {
    ...process.env,
    BELLJAR_HOME: h.home,
    BELLJAR_PORT: "0",
    BELLJAR_UI_DIR: join(repo, "ui/dist"),
    BELLJAR_GUEST_IMAGES: join(repo, "guest-images"),
    RUST_LOG: process.env.RUST_LOG || "info",
  };
}

/** Starts target/debug/belljard on a temporary home and a free port; resolves once it answers. */
export async function startDaemon(h, log) {
  const child = spawn(bin("belljard"), ["--home", h.home, "--port", "0"], {
    env: daemonEnv(h),
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stdout.on("data", (d) => log?.(d));
  child.stderr.on("data", (d) => log?.(d));
  let exited = null;
  child.on("exit", (code, sig) => (exited = { code, sig }));
  await until("belljard to answer on its socket", async () => {
    if (exited) throw new Error(`belljard exited early: ${JSON.stringify(exited)}`);
    return existsSync(h.portFile) && (await unixRequest(h.socket, "GET", "/v1/info")).status === 200;
  }, 30_000);
  const port = Number(readFileSync(h.portFile, "utf8").trim());
  return { child, port, stop: () => stopPid(child.pid) };
}

/**
 * An `xdg-open` in `dir` (put it first on the app's PATH) that writes the address it was
 * given to `record` and opens nothing: what the app would have shown in the user's browser.
 */
export function recordingOpener(dir) {
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  const record = join(dir, "opened");
  const script = join(dir, "xdg-open");
  writeFileSync(script, `#!/bin/sh\nprintf '%s\\n' "$*" > '${record}.tmp' && mv '${record}.tmp' '${record}'\n`);
  chmodSync(script, 0o755);
  return { dir, record };
}

/** SIGTERM, then SIGKILL if it lingers. */
export async function stopPid(pid) {
  if (!pid) return;
  try {
    process.kill(pid, "SIGTERM");
  } catch {
    return;
  }
  for (let i = 0; i < 50; i++) {
    await sleep(100);
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
  }
  try {
    process.kill(pid, "SIGKILL");
  } catch {}
}

/** One HTTP request over the daemon's Unix socket. */
export function unixRequest(socketPath, method, path, body) {
  return new Promise((resolveP, reject) => {
    const data = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const req = http.request(
      {
        socketPath,
        method,
        path,
        headers: {
          Host: "localhost",
          ...(data ? { "Content-Type": Buffer.isBuffer(body) ? "application/octet-stream" : "application/json", "Content-Length": data.length } : {}),
        },
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          const buf = Buffer.concat(chunks);
          resolveP({ status: res.statusCode, body: buf, json: () => JSON.parse(buf.toString("utf8")) });
        });
      },
    );
    req.on("error", reject);
    req.setTimeout(120_000, () => req.destroy(new Error(`${method} ${path} timed out`)));
    if (data) req.write(data);
    req.end();
  });
}

/** An API client on the daemon's socket that throws on unexpected statuses. */
export function apiOn(socket) {
  const call = async (method, path, body, ok = [200, 201, 204]) => {
    const r = await unixRequest(socket, method, path, body);
    if (!ok.includes(r.status)) throw new Error(`${method} ${path}: ${r.status} ${r.body.toString("utf8").slice(0, 300)}`);
    return r;
  };
  return {
    call,
    json: async (method, path, body) => (await call(method, path, body)).json(),
    /** A one-time token for `GET /ui?token=` (what `belljar ui` asks for). */
    sessionToken: async () => (await call("POST", "/v1/session/token")).json().token,
  };
}

/** Runs named steps in order; after a failure the rest are counted as failed, not run. */
export class Steps {
  constructor(suite) {
    this.suite = suite;
    this.passed = 0;
    this.failed = 0;
    this.broken = null;
  }
  async step(name, f) {
    if (this.broken) {
      this.failed++;
      console.log(`  ✗ ${this.suite}: ${name} (not run: an earlier step failed)`);
      return;
    }
    const t = Date.now();
    try {
      await f();
      this.passed++;
      console.log(`  ✓ ${this.suite}: ${name} (${Date.now() - t} ms)`);
    } catch (e) {
      this.failed++;
      this.broken = e;
      console.log(`  ✗ ${this.suite}: ${name}\n      ${String(e?.stack || e).split("\n").slice(0, 6).join("\n      ")}`);
    }
  }
  /** The line run.sh reads. */
  report() {
    console.log(`RESULT ${this.suite} passed=${this.passed} failed=${this.failed}`);
    return this.failed === 0 ? 0 : 1;
  }
}
