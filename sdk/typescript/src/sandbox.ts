// The SDK's main object: a sandbox, created, found or listed through the daemon's API, with
// its commands, files, terminals and snapshots. Every method takes an AbortSignal.

import type { Writable } from "node:stream";

import { Command, CommandFinished } from "./command.js";
import { Files } from "./files.js";
import { Network } from "./network.js";
import type {
  Command as CommandData,
  CreateSandbox,
  CreateSnapshot,
  ListSandboxesQuery,
  ListSnapshotsQuery,
  PtySize,
  Sandbox as SandboxData,
  SandboxList,
  SandboxMounts,
  SandboxUsage,
  Snapshot,
  SnapshotList,
  SnapshotMount,
} from "./generated/api.js";
import { path, query } from "./routes.js";
import { Terminal, type TerminalOptions } from "./terminal.js";
import { BelljarError, type ConnectionOptions, Transport } from "./transport.js";

export interface Signalled {
  signal?: AbortSignal;
}

/** What `Sandbox.create` takes: the API's body plus how to reach the daemon. */
export type CreateOptions = CreateSandbox & ConnectionOptions & Signalled;

export interface RunOptions extends Signalled {
  cmd: string;
  args?: string[];
  cwd?: string;
  env?: Record<string, string>;
  /** As root. */
  sudo?: boolean;
  /** Return the running command at once instead of waiting. */
  detached?: boolean;
  /** Keep stdin open for `writeStdin`. */
  stdin?: boolean;
  /** On a pseudo-terminal of this size. */
  pty?: PtySize;
  /** Output copied here as it arrives (the command is waited for). */
  stdout?: Writable;
  stderr?: Writable;
}

function transportOf(opts: ConnectionOptions | Transport | undefined): Transport {
  return opts instanceof Transport ? opts : new Transport(opts);
}

/** A sandbox. `data` is its record as the daemon last answered it. */
export class Sandbox {
  data: SandboxData;
  /** Its files. */
  readonly files: Files;
  /** Its firewall, flows and exposed ports. */
  readonly network: Network;

  private constructor(
    readonly transport: Transport,
    data: SandboxData,
  ) {
    this.data = data;
    this.files = new Files(transport, data.id);
    this.network = new Network(transport, data.id, (d) => (this.data = d));
  }

  get id(): string {
    return this.data.id;
  }
  get status(): SandboxData["status"] {
    return this.data.status;
  }

  /** Creates a sandbox; resolves once it runs. */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const { socketPath, baseUrl, token, home, signal, ...body } = opts;
    const t = new Transport({ socketPath, baseUrl, token, home });
    return new Sandbox(t, await t.json<SandboxData>("POST", "/v1/sandboxes", body, signal));
  }

  /** A sandbox by id. */
  static async get(opts: { sandboxId: string } & ConnectionOptions & Signalled): Promise<Sandbox> {
    const t = transportOf(opts);
    return new Sandbox(t, await t.json<SandboxData>("GET", path("sandboxes", opts.sandboxId), undefined, opts.signal));
  }

  /** Every sandbox that matches (all pages), newest first. */
  static async list(opts: Partial<Omit<ListSandboxesQuery, "cursor" | "limit">> & ConnectionOptions & Signalled = {}): Promise<Sandbox[]> {
    const t = transportOf(opts);
    const out: Sandbox[] = [];
    let cursor: string | undefined;
    do {
      const url = "/v1/sandboxes" + query({ status: opts.status, tag: opts.tag, since: opts.since, until: opts.until, limit: 200, cursor });
      const page = await t.json<SandboxList>("GET", url, undefined, opts.signal);
      out.push(...page.sandboxes.map((s) => new Sandbox(t, s)));
      cursor = page.next_cursor;
    } while (cursor);
    return out;
  }

  /** Reads the record again. */
  async refresh(opts: Signalled = {}): Promise<this> {
    this.data = await this.transport.json("GET", path("sandboxes", this.id), undefined, opts.signal);
    return this;
  }

  /** What the running or paused sandbox uses now (memory, CPU time, processes), measured by
   *  the host; a figure the host cannot know on this backend is `null`. E2B's `getMetrics`. */
  async usage(opts: Signalled = {}): Promise<SandboxUsage> {
    return this.transport.json("GET", path("sandboxes", this.id, "usage"), undefined, opts.signal);
  }

  /** Runs a command: waits for it and collects its output, or (`detached`) returns it running. */
  runCommand(opts: RunOptions & { detached: true }): Promise<Command>;
  runCommand(opts: RunOptions): Promise<CommandFinished>;
  runCommand(cmd: string, args?: string[], opts?: Signalled): Promise<CommandFinished>;
  async runCommand(a: string | RunOptions, args?: string[], extra?: Signalled): Promise<Command | CommandFinished> {
    const o: RunOptions = typeof a === "string" ? { cmd: a, args, signal: extra?.signal } : a;
    const body = {
      argv: [o.cmd, ...(o.args ?? [])],
      cwd: o.cwd,
      env: o.env,
      sudo: o.sudo ?? false,
      detached: true,
      stdin: o.stdin ?? false,
      pty: o.pty,
    };
    const started = new Command(this.transport, await this.transport.json<CommandData>("POST", path("sandboxes", this.id, "commands"), body, o.signal));
    if (o.detached) return started;
    // Waited for here rather than by the daemon, so that an abort can kill the command.
    const onAbort = () => void started.kill("KILL").catch(() => undefined);
    o.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      if (o.stdout || o.stderr) await started.pipe(o.stdout, o.stderr, o.signal);
      return await started.wait({ signal: o.signal });
    } catch (e) {
      if (o.signal?.aborted) throw new BelljarError("aborted", "The command was aborted and killed");
      throw e;
    } finally {
      o.signal?.removeEventListener("abort", onAbort);
    }
  }

  /** A command of this sandbox by id. */
  async getCommand(commandId: string, opts: Signalled = {}): Promise<Command> {
    const data = await this.transport.json<CommandData>("GET", path("sandboxes", this.id, "commands", commandId), undefined, opts.signal);
    return new Command(this.transport, data);
  }

  /** Opens an interactive shell. */
  openTerminal(opts: TerminalOptions = {}): Promise<Terminal> {
    return Terminal.open(this.transport, this.id, opts);
  }

  /** Replaces the tags. */
  async setTags(tags: Record<string, string>, opts: Signalled = {}): Promise<void> {
    this.data = await this.transport.json("PATCH", path("sandboxes", this.id), { tags }, opts.signal);
  }

  /** Adds `ms` to the timeout. */
  async extendTimeout(ms: number, opts: Signalled = {}): Promise<void> {
    this.data = await this.transport.json("POST", path("sandboxes", this.id, "extend"), { duration_ms: ms }, opts.signal);
  }

  /** Snapshots the files; the sandbox stops unless `keep_running`. */
  async snapshot(opts: CreateSnapshot & Signalled = {}): Promise<Snapshot> {
    const { signal, ...body } = opts;
    const snap = await this.transport.json<Snapshot>("POST", path("sandboxes", this.id, "snapshots"), body, signal);
    await this.refresh();
    return snap;
  }

  /** Mounts a directory snapshot (one taken with `path`) at `path` of this running sandbox,
   * copy-on-write (Modal's `mount_image`): a missing path is made, an existing one hidden. */
  async mountSnapshot(snapshotId: string, mountPath: string, opts: Signalled = {}): Promise<SnapshotMount> {
    const body: SnapshotMount = { snapshot_id: snapshotId, path: mountPath };
    return this.transport.json("POST", path("sandboxes", this.id, "mounts"), body, opts.signal);
  }

  /** Unmounts the snapshot mounted at exactly `mountPath`; the writes under it are discarded. */
  async unmountSnapshot(mountPath: string, opts: Signalled = {}): Promise<void> {
    const url = path("sandboxes", this.id, "mounts") + query({ path: mountPath });
    await this.transport.json("DELETE", url, undefined, opts.signal);
  }

  /** The directory snapshots mounted in this sandbox, in the order they were mounted. */
  async mounts(opts: Signalled = {}): Promise<SnapshotMount[]> {
    const got = await this.transport.json<SandboxMounts>("GET", path("sandboxes", this.id, "mounts"), undefined, opts.signal);
    return got.mounts;
  }

  /** Stops the sandbox (its record and files stay until `delete`). */
  async stop(opts: Signalled = {}): Promise<void> {
    this.data = await this.transport.json("POST", path("sandboxes", this.id, "stop"), undefined, opts.signal);
  }

  /** Deletes the sandbox, stopping it first. */
  async delete(opts: Signalled = {}): Promise<void> {
    await this.transport.json("DELETE", path("sandboxes", this.id), undefined, opts.signal);
  }
}

/** Snapshots across sandboxes. Restore one with `Sandbox.create({ source: { type: "snapshot", snapshot_id } })`. */
export const Snapshots = {
  async list(opts: Partial<Omit<ListSnapshotsQuery, "cursor" | "limit">> & ConnectionOptions & Signalled = {}): Promise<Snapshot[]> {
    const t = transportOf(opts);
    const out: Snapshot[] = [];
    let cursor: string | undefined;
    do {
      const url = "/v1/snapshots" + query({ sandbox_id: opts.sandbox_id, status: opts.status, since: opts.since, until: opts.until, cursor });
      const page = await t.json<SnapshotList>("GET", url, undefined, opts.signal);
      out.push(...page.snapshots);
      cursor = page.next_cursor;
    } while (cursor);
    return out;
  },
  get(opts: { snapshotId: string } & ConnectionOptions & Signalled): Promise<Snapshot> {
    return transportOf(opts).json("GET", path("snapshots", opts.snapshotId), undefined, opts.signal);
  },
  delete(opts: { snapshotId: string } & ConnectionOptions & Signalled): Promise<Snapshot> {
    return transportOf(opts).json("DELETE", path("snapshots", opts.snapshotId), undefined, opts.signal);
  },
};
