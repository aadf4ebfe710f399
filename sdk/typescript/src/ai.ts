// The AI SDK adapter: a Belljar sandbox as the `Experimental_SandboxSession` that `ai`'s
// `generateText`, `streamText` and agents pass to tools as `experimental_sandbox`. Commands run
// through `sh -c` in the sandbox; an abort kills them. Relative paths resolve against the
// session's working directory (default /workspace), as the interface asks.

import { posix } from "node:path";

import type {
  Experimental_SandboxDirectoryEntry as DirectoryEntry,
  Experimental_SandboxFileStat as FileStat,
  Experimental_SandboxProcess as SandboxProcess,
  Experimental_SandboxSession as SandboxSession,
} from "ai";

import type { Command } from "./command.js";
import type { FileEntry, NetworkInfo } from "./generated/api.js";
import type { Sandbox } from "./sandbox.js";
import { BelljarError, readAll } from "./transport.js";

export interface SessionOptions {
  /** Where commands start and relative paths resolve (default /workspace). */
  workingDirectory?: string;
  /** Run commands as root. */
  sudo?: boolean;
  /** Appended to the description the model reads. */
  description?: string;
  /** The sandbox's network (`await sandbox.network.info()`), so the description names its
   * exposed ports; without it, only the policy on the sandbox's record is described. */
  network?: NetworkInfo;
}

/** The sandbox as the AI SDK's experimental sandbox session. */
export function toSandboxSession(sandbox: Sandbox, opts: SessionOptions = {}): SandboxSession {
  const base = opts.workingDirectory ?? "/workspace";
  const abs = (p: string) => posix.resolve(base, p);
  const files = sandbox.files;
  const orNull = async <T>(f: () => Promise<T>): Promise<T | null> => {
    try {
      return await f();
    } catch (e) {
      if (e instanceof BelljarError && e.code === "not_found") return null;
      throw e;
    }
  };

  async function start(o: { command: string; workingDirectory?: string; env?: Record<string, string>; abortSignal?: AbortSignal; stdin?: boolean }) {
    return sandbox.runCommand({
      cmd: "sh",
      args: ["-c", o.command],
      cwd: o.workingDirectory === undefined ? base : abs(o.workingDirectory),
      env: o.env,
      sudo: opts.sudo,
      stdin: o.stdin,
      detached: true,
      signal: o.abortSignal,
    });
  }

  async function spawn(o: Parameters<SandboxSession["spawn"]>[0]): Promise<SandboxProcess & { stdin?: WritableStream<Uint8Array> }> {
    const cmd = await start(o);
    const onAbort = () => void cmd.kill("KILL").catch(() => undefined);
    o.abortSignal?.addEventListener("abort", onAbort, { once: true });
    const proc = processOf(cmd, o.abortSignal);
    if (!o.stdin) return proc;
    const stdin = new WritableStream<Uint8Array>({
      write: (chunk) => cmd.writeStdin(chunk),
      close: () => cmd.closeStdin(),
    });
    return { ...proc, stdin };
  }

  const session: SandboxSession = {
    description: describe(sandbox, base, opts),
    run: async (o) => {
      const done = await sandbox.runCommand({
        cmd: "sh",
        args: ["-c", o.command],
        cwd: o.workingDirectory === undefined ? base : abs(o.workingDirectory),
        env: o.env,
        sudo: opts.sudo,
        signal: o.abortSignal,
      });
      return { exitCode: done.exitCode, stdout: done.stdout(), stderr: done.stderr() };
    },
    spawn: spawn as SandboxSession["spawn"],
    readFile: (o) =>
      orNull(async () => {
        const body = await files.readStream(abs(o.path), { signal: o.abortSignal });
        return ReadableStreamFrom(body);
      }),
    readBinaryFile: (o) => orNull(async () => new Uint8Array(await files.read(abs(o.path), { signal: o.abortSignal }))),
    readTextFile: (o) =>
      orNull(async () => {
        const text = new TextDecoder(o.encoding ?? "utf-8").decode(await files.read(abs(o.path), { signal: o.abortSignal }));
        if (o.startLine === undefined && o.endLine === undefined) return text;
        const lines = text.split("\n");
        return lines.slice((o.startLine ?? 1) - 1, o.endLine ?? lines.length).join("\n");
      }),
    writeFile: async (o) => {
      const bytes = await readAll(ReadableFrom(o.content));
      await files.write(abs(o.path), bytes, { signal: o.abortSignal });
    },
    writeBinaryFile: async (o) => {
      await files.write(abs(o.path), o.content, { signal: o.abortSignal });
    },
    writeTextFile: async (o) => {
      const enc = (o.encoding ?? "utf-8").toLowerCase();
      if (enc !== "utf-8" && enc !== "utf8") {
        throw new BelljarError("bad_request", `Encoding ${o.encoding} is not supported; write bytes with writeBinaryFile`);
      }
      await files.write(abs(o.path), o.content, { signal: o.abortSignal });
    },
    stat: (o) => orNull(async () => statOf(await follow(sandbox, abs(o.path), o.abortSignal))),
    listDirectory: (o) =>
      orNull(async () => {
        const entries = await files.list(abs(o.path), { signal: o.abortSignal });
        return entries.map((e): DirectoryEntry => ({ name: e.name, type: e.kind }));
      }),
    deleteFile: async (o) => {
      const entry = await files.statOrNull(abs(o.path), { signal: o.abortSignal });
      if (!entry) return false;
      if (entry.kind === "directory") {
        throw new BelljarError("is_a_directory", `${entry.path} is a directory`);
      }
      await files.remove(entry.path, { signal: o.abortSignal });
      return true;
    },
  };
  return session;
}

/** What the model should know about the sandbox. */
function describe(sandbox: Sandbox, base: string, opts: SessionOptions): string {
  const d = sandbox.data;
  const lines = [
    `A Belljar sandbox (${d.id}): Linux, image ${d.image}, ${d.vcpus} vCPUs, ${d.memory_mib} MiB of memory, ${d.disk_mib} MiB of disk.`,
    `Commands run with sh -c as ${opts.sudo ? "root" : "the user belljar (sudo works)"}; the working directory is ${base}.`,
    `Network policy: ${JSON.stringify(opts.network?.policy ?? d.network_policy ?? "allow-all")}.`,
  ];
  const ports = opts.network?.ports ?? [];
  if (ports.length) {
    lines.push(`Exposed ports (sandbox port -> URL on the user's machine): ${ports.map((p) => `${p.port} -> ${p.url}`).join(", ")}.`);
  }
  if (opts.description) lines.push(opts.description);
  return lines.join("\n");
}

/** The entry at `p`, following symbolic links (at most 16). */
async function follow(sandbox: Sandbox, p: string, signal?: AbortSignal): Promise<FileEntry> {
  let entry = await sandbox.files.stat(p, { signal });
  for (let i = 0; entry.kind === "symlink" && entry.link_target !== undefined; i++) {
    if (i === 16) throw new BelljarError("invalid_path", `Too many symbolic links at ${p}`);
    entry = await sandbox.files.stat(posix.resolve(posix.dirname(entry.path), entry.link_target), { signal });
  }
  return entry;
}

function statOf(e: FileEntry): FileStat {
  return { type: e.kind === "file" || e.kind === "directory" ? e.kind : "other", size: e.size };
}

/** A spawned command as the AI SDK's process handle: both streams fed by one followed log. */
function processOf(cmd: Command, signal?: AbortSignal): SandboxProcess {
  let out!: ReadableStreamDefaultController<Uint8Array>;
  let err!: ReadableStreamDefaultController<Uint8Array>;
  const stdout = new ReadableStream<Uint8Array>({ start: (c) => void (out = c) });
  const stderr = new ReadableStream<Uint8Array>({ start: (c) => void (err = c) });
  const pumped = (async () => {
    try {
      for await (const c of cmd.logs({ follow: true, signal })) {
        (c.stream === "stdout" ? out : err).enqueue(new Uint8Array(c.data));
      }
      out.close();
      err.close();
    } catch (e) {
      out.error(e);
      err.error(e);
    }
  })();
  return {
    stdout,
    stderr,
    wait: async () => {
      await pumped;
      const done = await cmd.wait({ signal });
      if (signal?.aborted) throw signal.reason ?? new BelljarError("aborted", "The command was aborted and killed");
      return { exitCode: done.exitCode };
    },
    kill: () => cmd.kill("KILL"),
  };
}

function ReadableStreamFrom(body: AsyncIterable<Buffer>): ReadableStream<Uint8Array> {
  const it = body[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(c) {
      const { value, done } = await it.next();
      if (done) c.close();
      else c.enqueue(new Uint8Array(value));
    },
  });
}

async function* ReadableFrom(stream: ReadableStream<Uint8Array>): AsyncGenerator<Buffer> {
  const reader = stream.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    yield Buffer.from(value);
  }
}
