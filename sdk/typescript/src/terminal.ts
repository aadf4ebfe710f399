// An interactive shell in a sandbox over the daemon's terminal WebSocket: binary frames carry
// terminal bytes both ways, text frames carry `TerminalMessage`s (resize, started, exit,
// error).

import { EventEmitter } from "node:events";

import WebSocket from "ws";

import type { TerminalMessage } from "./generated/api.js";
import { path, query } from "./routes.js";
import { BelljarError, type Transport } from "./transport.js";

export interface TerminalOptions {
  rows?: number;
  cols?: number;
  cwd?: string;
  /** A root shell. */
  sudo?: boolean;
}

/** How the shell ended. */
export interface TerminalExit {
  exitCode: number | null;
  signal: number | null;
}

/** An open terminal. `data` events carry its output. */
export class Terminal extends EventEmitter {
  /** The shell's command id, once it started. */
  commandId: string | undefined;
  /** Settles when the shell exits (or the terminal fails). */
  readonly exited: Promise<TerminalExit>;

  private constructor(
    private readonly ws: WebSocket,
    started: (t: Terminal) => void,
    failed: (e: BelljarError) => void,
  ) {
    super();
    let settle!: (e: TerminalExit) => void;
    let fail!: (e: BelljarError) => void;
    this.exited = new Promise<TerminalExit>((res, rej) => {
      settle = res;
      fail = rej;
    });
    this.exited.catch(() => undefined);
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        this.emit("data", data);
        return;
      }
      const msg = JSON.parse(data.toString("utf8")) as TerminalMessage;
      if (msg.type === "started") {
        this.commandId = msg.command_id;
        started(this);
      } else if (msg.type === "exit") {
        settle({ exitCode: msg.exit_code ?? null, signal: msg.signal ?? null });
      } else if (msg.type === "error") {
        const e = new BelljarError(msg.code, msg.message);
        failed(e);
        fail(e);
      }
    });
    ws.on("error", (e) => {
      const err = new BelljarError("connection_lost", `Terminal connection failed: ${e.message}`);
      failed(err);
      fail(err);
    });
    ws.on("close", () => fail(new BelljarError("connection_lost", "The terminal closed before the shell exited")));
  }

  /** Opens a shell; resolves once it started. */
  static open(transport: Transport, sandboxId: string, opts: TerminalOptions = {}): Promise<Terminal> {
    const route =
      path("sandboxes", sandboxId, "terminal") +
      query({ rows: opts.rows, cols: opts.cols, cwd: opts.cwd, sudo: opts.sudo ? "true" : undefined });
    let url: string;
    const headers: Record<string, string> = {};
    if (transport.socketPath) {
      url = `ws+unix://${transport.socketPath}:${route}`;
      headers.host = "localhost";
    } else if (transport.baseUrl) {
      url = new URL(route, transport.baseUrl.replace(/^http/, "ws")).toString();
      if (transport.token) headers.authorization = `Bearer ${transport.token}`;
    } else {
      return Promise.reject(new BelljarError("daemon_unavailable", "The daemon is not running"));
    }
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { headers });
      ws.on("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8");
          try {
            const e = JSON.parse(body).error;
            reject(new BelljarError(e.code, e.message, res.statusCode));
          } catch {
            reject(new BelljarError(`http_${res.statusCode}`, body || "Terminal refused", res.statusCode));
          }
        });
      });
      new Terminal(ws, resolve, reject);
    });
  }

  /** Types into the terminal. */
  write(data: string | Uint8Array): void {
    this.ws.send(typeof data === "string" ? Buffer.from(data, "utf8") : data, { binary: true });
  }

  /** The terminal's new size. */
  resize(rows: number, cols: number): void {
    const msg: TerminalMessage = { type: "resize", rows, cols };
    this.ws.send(JSON.stringify(msg));
  }

  /** Closes the connection (the shell ends with it). */
  close(): void {
    this.ws.close();
  }
}
