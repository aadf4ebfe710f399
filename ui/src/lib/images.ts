// What the Images page reads out of the daemon's answers: a pull's progress from its NDJSON
// messages (crates/daemon/src/images/oci.rs `progress_line`), whose an image is and who uses
// it, and the build context as a tar.

import type { Image, ImageUsers, Sandbox, Template } from "../generated/api";
import { tar, type TarEntry } from "./tar";

/** The `sha256:…` id of an image, if the daemon told it. */
export function imageId(i: Image): string | undefined {
  return i.digest;
}

/** `sha256:0123456789ab` → `0123456789ab` (the first 12 hex digits, as Docker shows ids). */
export function shortId(id: string | undefined): string {
  if (!id) return "—";
  const hex = id.replace(/^sha256:/, "");
  return hex.slice(0, 12);
}

/**
 * Whether an image is one of Belljar's own (built from a recipe, removed with the cache):
 * only a user's image has a `source`, and ours have plain names (`base`, `python3.13`) where
 * users' are references (`localhost/app:dev`) or ids.
 */
export function isOwn(i: Image): boolean {
  return !i.source && !i.name.includes("/") && !i.name.includes(":");
}

/** The words the page shows for an image's source: `pull REF`, `import FILE`, `build`. */
export function sourceLabel(i: Image): string {
  return i.source ?? (isOwn(i) ? "Belljar" : "yours");
}

/**
 * Who uses an image: the daemon's `used_by` when it sends one; else what the UI knows itself,
 * the live sandboxes made from the image (by id where recorded, else by name) and the
 * templates that name it. Snapshots are only known through `used_by`.
 */
export function usersOf(i: Image, sandboxes: Sandbox[], templates: Template[]): ImageUsers {
  if (i.used_by) return i.used_by;
  const id = imageId(i);
  return {
    sandboxes: sandboxes
      .filter((s) => (s.image_id && id ? s.image_id === id : s.image === i.name))
      .map((s) => s.id),
    snapshots: [],
    templates: templates.filter((t) => t.image === i.name).map((t) => t.name),
  };
}

/** A pull's progress so far; `total` is null until the manifest is read. */
export interface PullProgress {
  layers: number | null;
  total: number | null;
  /** Bytes fetched, per layer (1-based, as the messages number them). */
  done: Record<number, number>;
  unpacked: number;
  cached: boolean;
}

export function newPullProgress(): PullProgress {
  return { layers: null, total: null, done: {}, unpacked: 0, cached: false };
}

/** Folds one `progress` message into `p`; returns false for a message it does not know. */
export function readPullMessage(p: PullProgress, message: string): boolean {
  let m: RegExpExecArray | null;
  if ((m = /^(\d+) layers?, (\d+) bytes$/.exec(message))) {
    p.layers = Number(m[1]);
    p.total = Number(m[2]);
  } else if ((m = /^layer (\d+): (\d+)\/(\d+) bytes$/.exec(message))) {
    p.done[Number(m[1])] = Number(m[2]);
  } else if ((m = /^layer (\d+): unpacked\b/.exec(message))) {
    p.unpacked = Math.max(p.unpacked, Number(m[1]));
  } else if (message === "already here") {
    p.cached = true;
  } else {
    return false;
  }
  return true;
}

/** Bytes fetched so far. */
export function pulledBytes(p: PullProgress): number {
  return Object.values(p.done).reduce((a, b) => a + b, 0);
}

/** 0 to 1, or null while the size is not known (the bar is then indeterminate). */
export function pullFraction(p: PullProgress): number | null {
  if (p.cached) return 1;
  if (!p.total) return null;
  return Math.min(1, pulledBytes(p) / p.total);
}

/** A file of a build context: its path under the context's root, and its bytes. */
export interface ContextFile {
  relative: string;
  data: Uint8Array;
}

/**
 * The build context as a tar: its folders (every parent of a file, and the empty ones), its
 * files, and `Dockerfile` with the text typed in the page (over the context's own, if any).
 * Throws a `TarError` naming a path ustar cannot hold.
 */
export function contextTar(files: ContextFile[], folders: string[], dockerfile: string): Uint8Array<ArrayBuffer> {
  const dirs = new Set<string>();
  const addParents = (p: string) => {
    const parts = p.split("/").filter(Boolean);
    for (let i = 1; i < parts.length; i++) dirs.add(parts.slice(0, i).join("/"));
  };
  for (const f of folders) {
    addParents(f + "/x");
  }
  for (const f of files) addParents(f.relative);
  const entries: TarEntry[] = [...dirs].sort().map((name) => ({ name, kind: "dir" as const }));
  for (const f of files) {
    if (f.relative.replace(/^\.?\/+/, "") !== "Dockerfile") entries.push({ name: f.relative, data: f.data });
  }
  entries.push({ name: "Dockerfile", data: new TextEncoder().encode(dockerfile) });
  return tar(entries);
}

/**
 * Paths of a dropped or picked folder without the folder's own name, so that it is the
 * context's root; `root` is that name, or null when the paths are not all in one folder.
 */
export function underRoot(paths: string[]): { root: string | null; paths: string[] } {
  const root = paths[0]?.split("/")[0];
  const one = root !== undefined && paths.every((p) => p.startsWith(root + "/") && p.length > root.length + 1);
  return one ? { root, paths: paths.map((p) => p.slice(root.length + 1)) } : { root: null, paths };
}
