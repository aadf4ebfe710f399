// A sandbox's files: read and write (whole or streamed), stat, list (every page), mkdir,
// move and remove, each one API call.

import { Readable } from "node:stream";

import type { FileEntry, FileList } from "./generated/api.js";
import { BelljarError, type Transport, readAll } from "./transport.js";
import { path, query } from "./routes.js";

export interface FileOptions {
  signal?: AbortSignal;
}

/** The files of one sandbox. */
export class Files {
  constructor(
    private readonly transport: Transport,
    private readonly sandboxId: string,
  ) {}

  private route(rest: string, filePath: string, extra: Record<string, string | undefined> = {}): string {
    return path("sandboxes", this.sandboxId, "files") + rest + query({ path: filePath, ...extra });
  }

  /** The file's bytes. */
  async read(filePath: string, opts: FileOptions = {}): Promise<Buffer> {
    return readAll(await this.readStream(filePath, opts));
  }

  /** The file's bytes, or `null` when nothing is at `filePath`. */
  async readOrNull(filePath: string, opts: FileOptions = {}): Promise<Buffer | null> {
    try {
      return await this.read(filePath, opts);
    } catch (e) {
      if (e instanceof BelljarError && e.code === "not_found") return null;
      throw e;
    }
  }

  /** The file's bytes as they arrive. */
  async readStream(filePath: string, opts: FileOptions = {}): Promise<Readable> {
    return this.transport.request("GET", this.route("", filePath), { signal: opts.signal });
  }

  /** Writes a file (missing parents are created), with permission bits `mode` when given. */
  async write(
    filePath: string,
    content: string | Uint8Array | Readable,
    opts: FileOptions & { mode?: number } = {},
  ): Promise<FileEntry> {
    const body = typeof content === "string" ? Buffer.from(content, "utf8") : content instanceof Readable ? content : Buffer.from(content);
    const mode = opts.mode === undefined ? undefined : opts.mode.toString(8);
    const res = await this.transport.request("PUT", this.route("", filePath, { mode }), {
      body,
      contentType: "application/octet-stream",
      signal: opts.signal,
    });
    return JSON.parse((await readAll(res)).toString("utf8")) as FileEntry;
  }

  /** The entry at `filePath` (a symlink is described, not followed). */
  stat(filePath: string, opts: FileOptions = {}): Promise<FileEntry> {
    return this.transport.json("GET", this.route("/stat", filePath), undefined, opts.signal);
  }

  /** The entry at `filePath`, or `null` when nothing is there. */
  async statOrNull(filePath: string, opts: FileOptions = {}): Promise<FileEntry | null> {
    try {
      return await this.stat(filePath, opts);
    } catch (e) {
      if (e instanceof BelljarError && e.code === "not_found") return null;
      throw e;
    }
  }

  /** Every entry of a directory, sorted by name (all pages). */
  async list(dir: string, opts: FileOptions = {}): Promise<FileEntry[]> {
    const all: FileEntry[] = [];
    let cursor: string | undefined;
    do {
      const page: FileList = await this.transport.json("GET", this.route("/list", dir, { cursor }), undefined, opts.signal);
      all.push(...page.entries);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  }

  /** `mkdir -p`. */
  mkdir(dir: string, opts: FileOptions = {}): Promise<FileEntry> {
    return this.transport.json("POST", path("sandboxes", this.sandboxId, "files", "mkdir"), { path: dir }, opts.signal);
  }

  /** Moves or renames an entry. */
  move(from: string, to: string, opts: FileOptions & { overwrite?: boolean } = {}): Promise<FileEntry> {
    const body = { from, to, overwrite: opts.overwrite ?? false };
    return this.transport.json("POST", path("sandboxes", this.sandboxId, "files", "move"), body, opts.signal);
  }

  /** Removes a file, or a directory (with `recursive` when not empty). */
  async remove(filePath: string, opts: FileOptions & { recursive?: boolean } = {}): Promise<void> {
    const res = await this.transport.request("DELETE", this.route("", filePath, { recursive: opts.recursive ? "true" : undefined }), {
      signal: opts.signal,
    });
    res.resume();
  }
}
