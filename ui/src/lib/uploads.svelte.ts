// Uploads of dropped files and folders into a sandbox, each with its own progress and, when it
// fails, its own message. Files go up one PUT each (the daemon creates parent folders), read
// from the browser's File objects or, in the app, from natively dropped paths.

import type { ErrorBody } from "../generated/api";
import { api } from "./api";
import { client } from "./client";
import { joinPath } from "./paths";

export interface Upload {
  key: number;
  name: string;
  dest: string;
  loaded: number;
  total: number;
  state: "queued" | "uploading" | "done" | "failed";
  error?: string;
}

/** One file to send: where it goes under the target folder, and its bytes. */
export interface UploadItem {
  relative: string;
  size: number;
  body: () => Promise<Blob | ArrayBuffer>;
}

const CONCURRENCY = 2;
const DONE_VISIBLE_MS = 8000;
let nextKey = 1;

class Uploads {
  list = $state<Upload[]>([]);
  private queue: { up: Upload; sandbox: string; item: UploadItem }[] = [];
  private running = 0;

  /** Queues files (and creates empty folders) under `dir` of a sandbox. */
  async add(sandbox: string, dir: string, items: UploadItem[], folders: string[] = [], errors: string[] = []) {
    for (const message of errors) {
      this.list.push({ key: nextKey++, name: message, dest: dir, loaded: 0, total: 0, state: "failed", error: message });
    }
    for (const f of folders) {
      const path = joinPath(dir, f);
      api.mkdir(sandbox, path).catch((e) => {
        this.list.push({
          key: nextKey++, name: f + "/", dest: path, loaded: 0, total: 0, state: "failed",
          error: `Could not create folder ${path}: ${e instanceof Error ? e.message : e}`,
        });
      });
    }
    for (const item of items) {
      const up: Upload = {
        key: nextKey++,
        name: item.relative,
        dest: joinPath(dir, item.relative),
        loaded: 0,
        total: item.size,
        state: "queued",
      };
      this.list.push(up);
      // Keep the reactive proxy the list made, so progress updates show.
      this.queue.push({ up: this.list[this.list.length - 1], sandbox, item });
    }
    this.pump();
  }

  dismiss(key: number) {
    this.list = this.list.filter((u) => u.key !== key);
  }

  clearFinished() {
    this.list = this.list.filter((u) => u.state === "queued" || u.state === "uploading");
  }

  private pump() {
    while (this.running < CONCURRENCY && this.queue.length) {
      const job = this.queue.shift()!;
      this.running++;
      void this.send(job.up, job.sandbox, job.item).finally(() => {
        this.running--;
        this.pump();
      });
    }
  }

  private async send(up: Upload, sandbox: string, item: UploadItem) {
    up.state = "uploading";
    try {
      const data = await item.body();
      const xhr = await client.xhr("PUT", api.uploadPath(sandbox, up.dest));
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      await new Promise<void>((resolve, reject) => {
        xhr.upload.onprogress = (e) => {
          up.loaded = e.loaded;
          if (e.lengthComputable) up.total = e.total;
        };
        xhr.onload = () => (xhr.status < 300 ? resolve() : reject(new Error(errorText(xhr))));
        xhr.onerror = () => reject(new Error("the daemon did not answer"));
        xhr.send(data);
      });
      up.loaded = up.total;
      up.state = "done";
      // Finished uploads leave the panel after a while; failures stay until dismissed.
      setTimeout(() => this.dismiss(up.key), DONE_VISIBLE_MS);
    } catch (e) {
      up.state = "failed";
      up.error = `Could not upload ${up.name} to ${up.dest}: ${e instanceof Error ? e.message : e}`;
    }
  }
}

function errorText(xhr: XMLHttpRequest): string {
  try {
    const body = JSON.parse(xhr.responseText) as ErrorBody;
    return `${body.error.message} (${body.error.code})`;
  } catch {
    return `HTTP ${xhr.status}`;
  }
}

/** Files and folders of a browser drop, walked recursively (folders via the entries API). */
export async function fromDataTransfer(dt: DataTransfer): Promise<{ items: UploadItem[]; folders: string[]; errors: string[] }> {
  const items: UploadItem[] = [];
  const folders: string[] = [];
  const errors: string[] = [];
  const entries = Array.from(dt.items)
    .filter((i) => i.kind === "file")
    .map((i) => ({ entry: i.webkitGetAsEntry?.() ?? null, file: i.getAsFile() }));
  for (const { entry, file } of entries) {
    if (entry) await walk(entry, entry.name, items, folders, errors);
    else if (file) items.push(fileItem(file, file.name));
  }
  return { items, folders, errors };
}

function fileItem(file: File, relative: string): UploadItem {
  return { relative, size: file.size, body: async () => file };
}

async function walk(entry: FileSystemEntry, rel: string, items: UploadItem[], folders: string[], errors: string[]) {
  if (entry.isFile) {
    try {
      const file = await new Promise<File>((res, rej) => (entry as FileSystemFileEntry).file(res, rej));
      items.push(fileItem(file, rel));
    } catch (e) {
      errors.push(`Could not read ${rel}: ${e instanceof Error ? e.message : e}`);
    }
    return;
  }
  const reader = (entry as FileSystemDirectoryEntry).createReader();
  const children: FileSystemEntry[] = [];
  for (;;) {
    const batch = await new Promise<FileSystemEntry[]>((res, rej) => reader.readEntries(res, rej)).catch(() => []);
    if (!batch.length) break;
    children.push(...batch);
  }
  if (!children.length) folders.push(rel);
  for (const c of children) await walk(c, `${rel}/${c.name}`, items, folders, errors);
}

export const uploads = new Uploads();
