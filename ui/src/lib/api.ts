// Typed calls of the daemon's API (crates/api/src/routes.rs), all through the one client, on
// routes built by the TypeScript SDK's own builders (sdk/typescript/src/routes.ts).

import type {
  Command,
  CommandList,
  CreateSandbox,
  DoctorReport,
  FileEntry,
  FileList,
  Image,
  ImageBuildEvent,
  Info,
  LogLine,
  NetworkFlow,
  NetworkInfo,
  NetworkPolicy,
  Port,
  PortList,
  PrunedImages,
  PruneImages,
  PullImage,
  Sandbox,
  SandboxList,
  Snapshot,
  SnapshotDiff,
  SnapshotList,
  TemplateList,
} from "../generated/api";
import { path, query } from "../../../sdk/typescript/src/routes";
import { ApiError, check, client } from "./client";

async function json<T>(path: string, init?: RequestInit): Promise<T> {
  const res = await check(await client.fetch(path, init));
  try {
    return (await res.json()) as T;
  } catch {
    throw new ApiError("bad_answer", `${path} did not answer JSON: is this belljard's address?`, res.status);
  }
}

/** Calls `onItem` for each line of a streamed (NDJSON) answer; returns when it ends. */
async function stream<T>(path: string, init: RequestInit, onItem: (item: T) => void): Promise<void> {
  const res = await check(await client.fetch(path, init));
  await readNdjson<T>(res, onItem);
}

function body(method: string, value: unknown): RequestInit {
  return { method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(value) };
}

// Routes are built as the TypeScript SDK builds them (every variable part encoded).
const sbx = (id: string, ...rest: string[]) => path("sandboxes", id, ...rest);
const snap = (id: string, ...rest: string[]) => path("snapshots", id, ...rest);

export const api = {
  info: () => json<Info>(path("info")),
  doctor: () => json<DoctorReport>(path("doctor")),

  /** Belljar's images and the user's, each name its own row (unnamed ones by their id). */
  listImages: () => json<Image[]>(path("images")),
  /** Pulls from a registry; `onEvent` sees its progress, then `done` or `error`. */
  pullImage: (req: PullImage, onEvent: (e: ImageBuildEvent) => void, signal?: AbortSignal) =>
    stream(path("images", "pull"), { ...body("POST", req), signal }, onEvent),
  /** Builds `dockerfile` of the context `tar` into an image named `tag`. */
  buildImage: (
    context: Uint8Array<ArrayBuffer>,
    q: { tag: string; dockerfile?: string; build_args?: Record<string, string>; no_cache?: boolean },
    onEvent: (e: ImageBuildEvent) => void,
    signal?: AbortSignal,
  ) =>
    stream(
      path("images", "build") +
        query({
          tag: q.tag,
          dockerfile: q.dockerfile,
          build_args: q.build_args && Object.keys(q.build_args).length ? JSON.stringify(q.build_args) : undefined,
          no_cache: q.no_cache || undefined,
        }),
      { method: "POST", headers: { "Content-Type": "application/x-tar" }, body: context, signal },
      onEvent,
    ),
  /** Imports a `docker save` / `podman save` archive or an OCI layout tar. */
  importImage: (archive: Blob, tag: string | undefined, onEvent: (e: ImageBuildEvent) => void, signal?: AbortSignal) =>
    stream(
      path("images", "import") + query({ tag }),
      { method: "POST", headers: { "Content-Type": "application/x-tar" }, body: archive, signal },
      onEvent,
    ),
  /** Removes a name; the image goes with its last one (`conflict` while something uses it). */
  async removeImage(name: string): Promise<void> {
    await check(await client.fetch(path("images", name), { method: "DELETE" }));
  },
  pruneImages: (req: PruneImages) => json<PrunedImages>(path("images", "prune"), body("POST", req)),
  listTemplates: () => json<TemplateList>(path("templates")),

  async listSandboxes(): Promise<Sandbox[]> {
    const all: Sandbox[] = [];
    let cursor: string | undefined;
    do {
      const page = await json<SandboxList>(
        path("sandboxes") + query({ limit: 200, cursor }),
      );
      all.push(...page.sandboxes);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  },
  getSandbox: (id: string) => json<Sandbox>(sbx(id)),
  createSandbox: (req: CreateSandbox) => json<Sandbox>(path("sandboxes"), body("POST", req)),
  stopSandbox: (id: string) => json<Sandbox>(sbx(id, "stop"), { method: "POST" }),
  extendSandbox: (id: string, duration_ms: number) =>
    json<Sandbox>(sbx(id, "extend"), body("POST", { duration_ms })),
  async deleteSandbox(id: string): Promise<void> {
    await check(await client.fetch(sbx(id), { method: "DELETE" }));
  },

  /** Replaces the sandbox's firewall whole; flows it now denies are cut. */
  setNetworkPolicy: (id: string, network_policy: NetworkPolicy) =>
    json<Sandbox>(sbx(id), body("PATCH", { network_policy })),
  network: (id: string) => json<NetworkInfo>(sbx(id, "network")),
  /** The flow log, oldest first; with `follow`, new flows (and again when they end) until
   *  `signal` aborts. */
  async flows(id: string, follow: boolean, onFlow: (f: NetworkFlow) => void, signal?: AbortSignal) {
    const res = await check(await client.fetch(sbx(id, "network", "flows") + query({ follow }), { signal }));
    await readNdjson<NetworkFlow>(res, onFlow);
  },
  ports: (id: string) => json<PortList>(sbx(id, "ports")),
  addPort: (id: string, port: number, host_port?: number) =>
    json<Port>(sbx(id, "ports"), body("POST", host_port ? { port, host_port } : { port })),
  async removePort(id: string, port: number): Promise<void> {
    await check(await client.fetch(sbx(id, "ports", String(port)), { method: "DELETE" }));
  },

  pauseSandbox: (id: string) => json<Sandbox>(sbx(id, "pause"), { method: "POST" }),
  resumeSandbox: (id: string) => json<Sandbox>(sbx(id, "resume"), { method: "POST" }),
  startSandbox: (id: string) => json<Sandbox>(sbx(id, "start"), { method: "POST" }),
  forkSandbox: (id: string) => json<Sandbox>(sbx(id, "fork"), body("POST", {})),
  takeSnapshot: (id: string, keep_running: boolean) =>
    json<Snapshot>(sbx(id, "snapshots"), body("POST", { keep_running })),
  /** Every snapshot taken of a sandbox, newest first. */
  async listSnapshots(sandbox_id: string): Promise<Snapshot[]> {
    const all: Snapshot[] = [];
    let cursor: string | undefined;
    do {
      const page = await json<SnapshotList>(path("snapshots") + query({ sandbox_id, limit: 200, cursor }));
      all.push(...page.snapshots);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  },
  deleteSnapshot: (id: string) => json<Snapshot>(snap(id), { method: "DELETE" }),
  setSnapshotExpiration: (id: string, expiration_ms: number) =>
    json<Snapshot>(snap(id), body("PATCH", { expiration_ms })),
  diffSnapshot: (id: string, to?: string) => json<SnapshotDiff>(snap(id, "diff") + query({ to })),

  listCommands: (id: string) => json<CommandList>(sbx(id, "commands")),
  killCommand: (id: string, cid: string) =>
    json<Command>(sbx(id, "commands", cid, "kill"), body("POST", {})),
  /** Streams a command's output; returns when it ends or `signal` aborts. */
  async logs(id: string, cid: string, follow: boolean, onLine: (l: LogLine) => void, signal?: AbortSignal) {
    const res = await check(
      await client.fetch(sbx(id, "commands", cid, "logs") + query({ follow }), { signal }),
    );
    await readNdjson<LogLine>(res, onLine);
  },

  /** One page of a folder; pass the previous page's `next_cursor` for the next one. */
  listFiles: (id: string, file: string, cursor?: string) =>
    json<FileList>(sbx(id, "files", "list") + query({ path: file, cursor })),
  stat: (id: string, file: string) => json<FileEntry>(sbx(id, "files", "stat") + query({ path: file })),
  async readFile(id: string, file: string): Promise<Blob> {
    const res = await check(await client.fetch(sbx(id, "files") + query({ path: file })));
    return res.blob();
  },
  async thumbnail(id: string, file: string, size = 512): Promise<Blob> {
    const res = await check(await client.fetch(sbx(id, "files", "thumbnail") + query({ path: file, size })));
    return res.blob();
  },
  mkdir: (id: string, file: string) => json<FileEntry>(sbx(id, "files", "mkdir"), body("POST", { path: file })),
  move: (id: string, from: string, to: string) =>
    json<FileEntry>(sbx(id, "files", "move"), body("POST", { from, to, overwrite: false })),
  async remove(id: string, file: string): Promise<void> {
    await check(await client.fetch(sbx(id, "files") + query({ path: file, recursive: true }), { method: "DELETE" }));
  },
  /** The route an upload PUTs to. */
  uploadPath: (id: string, file: string) => sbx(id, "files") + query({ path: file }),
  watchPath: (id: string, file: string) => sbx(id, "files", "watch") + query({ path: file, recursive: true }),
  terminalPath: (id: string, rows: number, cols: number) => sbx(id, "terminal") + query({ rows, cols }),
};

/** Calls `onItem` for each JSON line of a streamed answer. */
export async function readNdjson<T>(res: Response, onItem: (item: T) => void): Promise<void> {
  if (!res.body) return;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) onItem(JSON.parse(line) as T);
    }
  }
  if (buf.trim()) onItem(JSON.parse(buf) as T);
}
