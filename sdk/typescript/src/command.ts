// A command in a sandbox: its record, waiting for it, its output (stored or followed live),
// signals and stdin. A finished command also holds its collected output.

import type { Writable } from "node:stream";

import type { Command as CommandData, LogLine } from "./generated/api.js";
import { BelljarError, type Transport } from "./transport.js";
import { path, query } from "./routes.js";

/** One chunk of output. */
export interface LogChunk {
  stream: "stdout" | "stderr";
  data: Buffer;
}

function chunk(line: LogLine): LogChunk {
  const data = line.data_base64 !== undefined
    ? Buffer.from(line.data_base64, "base64")
    : Buffer.from(line.data ?? "", "utf8");
  return { stream: line.stream, data };
}

/** A running (or finished) command. */
export class Command {
  /** The record as the daemon last answered it. */
  data: CommandData;

  constructor(
    protected readonly transport: Transport,
    data: CommandData,
  ) {
    this.data = data;
  }

  get id(): string {
    return this.data.id;
  }
  get sandboxId(): string {
    return this.data.sandbox_id;
  }
  /** The exit code once it exited; `null` while it runs or when a signal ended it. */
  get exitCode(): number | null {
    return this.data.exit_code ?? null;
  }

  private route(rest = ""): string {
    return path("sandboxes", this.sandboxId, "commands", this.id) + rest;
  }

  /** Waits until the command exits. With `signal`, aborting stops the wait (not the command). */
  async wait(opts: { signal?: AbortSignal } = {}): Promise<CommandFinished> {
    this.data = await this.transport.json<CommandData>("GET", this.route(query({ wait: "true" })), undefined, opts.signal);
    const out = await collect(this.logs({ signal: opts.signal }));
    return new CommandFinished(this.transport, this.data, out);
  }

  /** The output so far; with `follow`, as it arrives until the command exits. */
  async *logs(opts: { follow?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<LogChunk> {
    const url = this.route("/logs" + query({ follow: opts.follow ? "true" : undefined }));
    for await (const line of this.transport.ndjson<LogLine>("GET", url, opts.signal)) yield chunk(line);
  }

  /** Sends a signal (a name such as `TERM`, `KILL` or a number; default TERM). */
  async kill(signal?: string | number, opts: { signal?: AbortSignal } = {}): Promise<void> {
    const body = signal === undefined ? {} : { signal: String(signal) };
    this.data = await this.transport.json<CommandData>("POST", this.route("/kill"), body, opts.signal);
  }

  /** Writes to the command's stdin (started with `stdin: true`); `close` then closes it. */
  async writeStdin(data: string | Uint8Array, opts: { close?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    const buf = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    const res = await this.transport.request("POST", this.route("/stdin" + query({ close: opts.close ? "true" : undefined })), {
      body: buf,
      contentType: buf.length ? "application/octet-stream" : undefined,
      signal: opts.signal,
    });
    res.resume();
  }

  /** Closes the command's stdin; a command that already exited has nothing left to close. */
  async closeStdin(opts: { signal?: AbortSignal } = {}): Promise<void> {
    try {
      await this.writeStdin("", { close: true, signal: opts.signal });
    } catch (e) {
      // 409: the command already exited (the agent may know before the daemon's record
      // does) or its stdin is closed: either way nothing is left to close.
      if (!(e instanceof BelljarError) || e.status !== 409) throw e;
    }
  }

  /** Copies the output, as it arrives, into `stdout`/`stderr` until the command exits. */
  async pipe(stdout?: Writable, stderr?: Writable, signal?: AbortSignal): Promise<void> {
    for await (const c of this.logs({ follow: true, signal })) {
      const to = c.stream === "stdout" ? stdout : stderr;
      if (to && !to.write(c.data)) await new Promise((r) => to.once("drain", r));
    }
  }
}

/** A command that exited, with its output. */
export class CommandFinished extends Command {
  private readonly out: LogChunk[];

  constructor(transport: Transport, data: CommandData, out: LogChunk[]) {
    super(transport, data);
    this.out = out;
  }

  /** The exit code; a command ended by a signal reports 128 + the signal, as a shell does. */
  override get exitCode(): number {
    return this.data.exit_code ?? 128 + (this.data.signal ?? 0);
  }
  /** Standard output as text. */
  stdout(): string {
    return this.bytes("stdout").toString("utf8");
  }
  /** Standard error as text. */
  stderr(): string {
    return this.bytes("stderr").toString("utf8");
  }
  /** Both streams interleaved as they were written. */
  output(): string {
    return Buffer.concat(this.out.map((c) => c.data)).toString("utf8");
  }
  private bytes(stream: "stdout" | "stderr"): Buffer {
    return Buffer.concat(this.out.filter((c) => c.stream === stream).map((c) => c.data));
  }
}

async function collect(it: AsyncIterable<LogChunk>): Promise<LogChunk[]> {
  const out: LogChunk[] = [];
  for await (const c of it) out.push(c);
  return out;
}
