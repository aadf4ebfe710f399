// Typed calls of the daemon's API (crates/api/src/routes.rs), all through the one client.

import type {
  Command,
  CommandList,
  CreateSandbox,
  DoctorReport,
  FileEntry,
  FileList,
  Info,
  LogLine,
  NetworkFlow,
  NetworkInfo,
  NetworkPolicy,
  Port,
  PortList,
  Sandbox,
  SandboxList,
  Snapshot,
  SnapshotDiff,
  SnapshotList,
} from "../generated/api";
import { ApiError, check, client } from "./client";

async function json<T>(path: string, init?: RequestInit): Promise<T> {
  const res = await check(await client.fetch(path, init));
  try {
    return (await res.json()) as T;
  } catch {
    throw new ApiError("bad_answer", `${path} did not answer JSON: is this belljard's address?`, res.status);
  }
}

function body(method: string, value: unknown): RequestInit {
  return { method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(value) };
}

const sbx = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;
const q = (params: Record<string, string | number | boolean>) =>
  new URLSearchParams(Object.entries(params).map(([k, v]) => [k, String(v)])).toString();

export const api = {
  info: () => json<Info>("/v1/info"),
  doctor: () => json<DoctorReport>("/v1/doctor"),

  async listSandboxes(): Promise<Sandbox[]> {
    const all: Sandbox[] = [];
    let cursor: string | undefined;
    do {
      const page = await json<SandboxList>(
        "/v1/sandboxes?" + q(cursor ? { limit: 200, cursor } : { limit: 200 }),
      );
      all.push(...page.sandboxes);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  },
  getSandbox: (id: string) => json<Sandbox>(sbx(id)),
  createSandbox: (req: CreateSandbox) => json<Sandbox>("/v1/sandboxes", body("POST", req)),
  stopSandbox: (id: string) => json<Sandbox>(sbx(id) + "/stop", { method: "POST" }),
  extendSandbox: (id: string, duration_ms: number) =>
    json<Sandbox>(sbx(id) + "/extend", body("POST", { duration_ms })),
  async deleteSandbox(id: string): Promise<void> {
    await check(await client.fetch(sbx(id), { method: "DELETE" }));
  },

  /** Replaces the sandbox's firewall whole; flows it now denies are cut. */
  setNetworkPolicy: (id: string, network_policy: NetworkPolicy) =>
    json<Sandbox>(sbx(id), body("PATCH", { network_policy })),
  network: (id: string) => json<NetworkInfo>(sbx(id) + "/network"),
  /** The flow log, oldest first; with `follow`, new flows (and again when they end) until
   *  `signal` aborts. */
  async flows(id: string, follow: boolean, onFlow: (f: NetworkFlow) => void, signal?: AbortSignal) {
    const res = await check(await client.fetch(sbx(id) + "/network/flows?" + q({ follow }), { signal }));
    await readNdjson<NetworkFlow>(res, onFlow);
  },
  ports: (id: string) => json<PortList>(sbx(id) + "/ports"),
  addPort: (id: string, port: number, host_port?: number) =>
    json<Port>(sbx(id) + "/ports", body("POST", host_port ? { port, host_port } : { port })),
  async removePort(id: string, port: number): Promise<void> {
    await check(await client.fetch(`${sbx(id)}/ports/${port}`, { method: "DELETE" }));
  },

  pauseSandbox: (id: string) => json<Sandbox>(sbx(id) + "/pause", { method: "POST" }),
  resumeSandbox: (id: string) => json<Sandbox>(sbx(id) + "/resume", { method: "POST" }),
  startSandbox: (id: string) => json<Sandbox>(sbx(id) + "/start", { method: "POST" }),
  forkSandbox: (id: string) => json<Sandbox>(sbx(id) + "/fork", body("POST", {})),
  takeSnapshot: (id: string, keep_running: boolean) =>
    json<Snapshot>(sbx(id) + "/snapshots", body("POST", { keep_running })),
  /** Every snapshot taken of a sandbox, newest first. */
  async listSnapshots(sandbox_id: string): Promise<Snapshot[]> {
    const all: Snapshot[] = [];
    let cursor: string | undefined;
    do {
      const params: Record<string, string | number> = { sandbox_id, limit: 200 };
      if (cursor) params.cursor = cursor;
      const page = await json<SnapshotList>("/v1/snapshots?" + q(params));
      all.push(...page.snapshots);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  },
  deleteSnapshot: (id: string) =>
    json<Snapshot>(`/v1/snapshots/${encodeURIComponent(id)}`, { method: "DELETE" }),
  setSnapshotExpiration: (id: string, expiration_ms: number) =>
    json<Snapshot>(`/v1/snapshots/${encodeURIComponent(id)}`, body("PATCH", { expiration_ms })),
  diffSnapshot: (id: string, to?: string) =>
    json<SnapshotDiff>(`/v1/snapshots/${encodeURIComponent(id)}/diff` + (to ? "?" + q({ to }) : "")),

  listCommands: (id: string) => json<CommandList>(sbx(id) + "/commands"),
  killCommand: (id: string, cid: string) =>
    json<Command>(`${sbx(id)}/commands/${cid}/kill`, body("POST", {})),
  /** Streams a command's output; returns when it ends or `signal` aborts. */
  async logs(id: string, cid: string, follow: boolean, onLine: (l: LogLine) => void, signal?: AbortSignal) {
    const res = await check(
      await client.fetch(`${sbx(id)}/commands/${cid}/logs?` + q({ follow }), { signal }),
    );
    await readNdjson<LogLine>(res, onLine);
  },

  /** One page of a folder; pass the previous page's `next_cursor` for the next one. */
  listFiles: (id: string, path: string, cursor?: string) =>
    json<FileList>(`${sbx(id)}/files/list?` + q(cursor ? { path, cursor } : { path })),
  stat: (id: string, path: string) => json<FileEntry>(`${sbx(id)}/files/stat?` + q({ path })),
  async readFile(id: string, path: string): Promise<Blob> {
    const res = await check(await client.fetch(`${sbx(id)}/files?` + q({ path })));
    return res.blob();
  },
  async thumbnail(id: string, path: string, size = 512): Promise<Blob> {
    const res = await check(await client.fetch(`${sbx(id)}/files/thumbnail?` + q({ path, size })));
    return res.blob();
  },
  mkdir: (id: string, path: string) => json<FileEntry>(`${sbx(id)}/files/mkdir`, body("POST", { path })),
  move: (id: string, from: string, to: string) =>
    json<FileEntry>(`${sbx(id)}/files/move`, body("POST", { from, to, overwrite: false })),
  async remove(id: string, path: string): Promise<void> {
    await check(await client.fetch(`${sbx(id)}/files?` + q({ path, recursive: true }), { method: "DELETE" }));
  },
  /** The route an upload PUTs to. */
  uploadPath: (id: string, path: string) => `${sbx(id)}/files?` + q({ path }),
  watchPath: (id: string, path: string) => `${sbx(id)}/files/watch?` + q({ path, recursive: true }),
  terminalPath: (id: string, rows: number, cols: number) => `${sbx(id)}/terminal?` + q({ rows, cols }),
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
