// How the SDK reaches belljard: the Unix socket (no token) when it exists, else 127.0.0.1
// with the bearer token, found exactly where the CLI looks (crates/client/src/paths.rs):
// everything under BELLJAR_HOME when set, else the user's XDG directories. Requests go
// through node:http so that a Unix socket, streamed bodies and AbortSignal all work.

import { existsSync, readFileSync } from "node:fs";
import http from "node:http";
import { homedir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";

import type { ErrorBody } from "./generated/api.js";

/** An error from the daemon (its stable `code`) or from talking to it (a local code). */
export class BelljarError extends Error {
  /** The API's error code (`not_found`, `bad_request`, ...) or a local one
   * (`daemon_unavailable`, `connection_lost`, `aborted`, `bad_response`). */
  readonly code: string;
  /** The HTTP status of an API error. */
  readonly status: number | undefined;

  constructor(code: string, message: string, status?: number) {
    super(message);
    this.name = "BelljarError";
    this.code = code;
    this.status = status;
  }
}

/** Where the daemon is; every field is optional and found like the CLI finds it. */
export interface ConnectionOptions {
  /** The daemon's Unix socket. */
  socketPath?: string;
  /** `http://127.0.0.1:PORT`, used when there is no socket. */
  baseUrl?: string;
  /** The bearer token of TCP requests. */
  token?: string;
  /** A different BELLJAR_HOME than the environment's. */
  home?: string;
}

interface Paths {
  socket: string;
  portFile: string;
  tokenFile: string;
}

function paths(home: string | undefined): Paths {
  if (home) {
    return {
      socket: join(home, "run", "belljard.sock"),
      portFile: join(home, "run", "port"),
      tokenFile: join(home, "config", "token"),
    };
  }
  const env = process.env;
  const data = join(env.XDG_DATA_HOME || join(homedir(), ".local", "share"), "belljar");
  const config = join(env.XDG_CONFIG_HOME || join(homedir(), ".config"), "belljar");
  const runtime = env.XDG_RUNTIME_DIR ? join(env.XDG_RUNTIME_DIR, "belljar") : join(data, "run");
  return {
    socket: join(runtime, "belljard.sock"),
    portFile: join(runtime, "port"),
    tokenFile: join(config, "token"),
  };
}

function readTrimmed(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8").trim() || undefined;
  } catch {
    return undefined;
  }
}

export interface RequestOptions {
  body?: Buffer | string | Readable | Uint8Array;
  contentType?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/** A connection to one daemon. */
export class Transport {
  readonly socketPath: string | undefined;
  readonly baseUrl: string | undefined;
  readonly token: string | undefined;

  constructor(opts: ConnectionOptions = {}) {
    if (opts.socketPath || opts.baseUrl) {
      this.socketPath = opts.socketPath;
      this.baseUrl = opts.baseUrl;
      this.token = opts.token;
      return;
    }
    const p = paths(opts.home ?? (process.env.BELLJAR_HOME || undefined));
    if (existsSync(p.socket)) {
      this.socketPath = p.socket;
    } else {
      const port = readTrimmed(p.portFile);
      this.baseUrl = port ? `http://127.0.0.1:${port}` : undefined;
      this.token = opts.token ?? readTrimmed(p.tokenFile);
    }
  }

  /** Where requests go, for messages. */
  where(): string {
    return this.socketPath ?? this.baseUrl ?? "(no daemon found: run `belljar daemon start`)";
  }

  /** Sends a request; answers the response, or throws the API's error for an error status. */
  async request(method: string, path: string, opts: RequestOptions = {}): Promise<http.IncomingMessage> {
    const res = await this.send(method, path, opts);
    const status = res.statusCode ?? 0;
    if (status >= 200 && status < 300) return res;
    const body = await readAll(res);
    throw apiError(status, body);
  }

  /** `method path` with an optional JSON body, decoded from JSON. */
  async json<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.request(method, path, {
      body: body === undefined ? undefined : JSON.stringify(body),
      contentType: body === undefined ? undefined : "application/json",
      signal,
    });
    const text = (await readAll(res)).toString("utf8");
    if (res.statusCode === 204 || text === "") return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new BelljarError("bad_response", `Unexpected answer from the daemon (${path}): ${String(e)}`);
    }
  }

  /** Items of an NDJSON answer as they arrive (`opts` give a request body). */
  async *ndjson<T>(method: string, path: string, signal?: AbortSignal, opts: RequestOptions = {}): AsyncGenerator<T> {
    const res = await this.request(method, path, { ...opts, signal });
    let pending = "";
    try {
      for await (const chunk of res) {
        pending += (chunk as Buffer).toString("utf8");
        let nl: number;
        while ((nl = pending.indexOf("\n")) >= 0) {
          const line = pending.slice(0, nl).trim();
          pending = pending.slice(nl + 1);
          if (line) yield JSON.parse(line) as T;
        }
      }
    } catch (e) {
      throw local(e, signal);
    }
    if (pending.trim()) yield JSON.parse(pending) as T;
  }

  private send(method: string, path: string, opts: RequestOptions): Promise<http.IncomingMessage> {
    const headers: Record<string, string> = { ...opts.headers };
    if (opts.contentType) headers["content-type"] = opts.contentType;
    let target: http.RequestOptions;
    if (this.socketPath) {
      target = { socketPath: this.socketPath, path, headers: { host: "localhost", ...headers } };
    } else if (this.baseUrl) {
      const url = new URL(path, this.baseUrl);
      if (this.token) headers.authorization = `Bearer ${this.token}`;
      target = { host: url.hostname, port: url.port, path: url.pathname + url.search, headers };
    } else {
      return Promise.reject(
        new BelljarError("daemon_unavailable", "The daemon is not running: start it with `belljar daemon start`"),
      );
    }
    return new Promise((resolve, reject) => {
      if (opts.signal?.aborted) {
        reject(local(opts.signal.reason, opts.signal));
        return;
      }
      const req = http.request({ ...target, method, signal: opts.signal }, resolve);
      req.on("error", (e) => reject(local(e, opts.signal, this.where())));
      const body = opts.body;
      if (body instanceof Readable) {
        body.on("error", (e) => req.destroy(e));
        body.pipe(req);
      } else {
        req.end(body);
      }
    });
  }
}

/** The whole body of a response. */
export async function readAll(res: AsyncIterable<Uint8Array | Buffer | string>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(typeof c === "string" ? Buffer.from(c) : Buffer.from(c as Uint8Array));
  return Buffer.concat(chunks);
}

/** The API's error from an error answer, or one naming the status. */
export function apiError(status: number, body: Buffer): BelljarError {
  try {
    const e = JSON.parse(body.toString("utf8")) as ErrorBody;
    if (e?.error?.code) return new BelljarError(e.error.code, e.error.message, status);
  } catch {
    // Not the API's error body: name the status below.
  }
  const text = body.toString("utf8").trim().slice(0, 300);
  return new BelljarError(`http_${status}`, text || `HTTP ${status}`, status);
}

/** A local failure as a BelljarError with a local code. */
function local(e: unknown, signal?: AbortSignal, where?: string): BelljarError {
  if (e instanceof BelljarError) return e;
  if (signal?.aborted) return new BelljarError("aborted", "The operation was aborted");
  const err = e as NodeJS.ErrnoException;
  if (where && (err?.code === "ENOENT" || err?.code === "ECONNREFUSED")) {
    return new BelljarError("daemon_unavailable", `Cannot connect to the daemon at ${where}: ${err.message}`);
  }
  return new BelljarError("connection_lost", `Connection to the daemon failed: ${err?.message ?? String(e)}`);
}
