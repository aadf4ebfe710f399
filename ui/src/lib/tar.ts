// A ustar writer for the build context the browser sends to `POST /v1/images/build`: the
// typed Dockerfile, or a dropped folder. Only what a context needs (regular files and
// directories); a name that fits neither ustar's 100-byte name field nor its 155-byte prefix
// split is refused with the name, rather than written in an extension the daemon may not read.

/** One entry of the archive; a directory's name may end in `/`. */
export interface TarEntry {
  name: string;
  /** Absent or "file": a regular file of `data`. */
  kind?: "file" | "dir";
  data?: Uint8Array;
  /** Permission bits; 0o644 for files and 0o755 for directories by default. */
  mode?: number;
  /** Seconds since the epoch; 0 by default, so the same context makes the same archive. */
  mtime?: number;
}

/** A context that cannot be written as ustar. */
export class TarError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TarError";
  }
}

const BLOCK = 512;
/** The largest size the 11 octal digits of the size field hold (8 GiB - 1). */
const MAX_SIZE = 0o77777777777;
const utf8 = new TextEncoder();

/** The archive of `entries`, in their order, with the two zero blocks that end it. */
export function tar(entries: TarEntry[]): Uint8Array<ArrayBuffer> {
  const parts: Uint8Array[] = [];
  let total = 0;
  const seen = new Set<string>();
  for (const e of entries) {
    const dir = e.kind === "dir";
    const name = clean(e.name) + (dir ? "/" : "");
    if (seen.has(name)) throw new TarError(`${name}: in the context twice`);
    seen.add(name);
    const data = dir ? new Uint8Array(0) : (e.data ?? new Uint8Array(0));
    if (data.length > MAX_SIZE) throw new TarError(`${name}: larger than ustar's 8 GiB`);
    const header = headerOf(name, dir, data.length, e.mode ?? (dir ? 0o755 : 0o644), e.mtime ?? 0);
    parts.push(header, data);
    total += BLOCK + padded(data.length);
  }
  const out = new Uint8Array(total + 2 * BLOCK);
  let at = 0;
  for (let i = 0; i < parts.length; i += 2) {
    out.set(parts[i], at);
    at += BLOCK;
    out.set(parts[i + 1], at);
    at += padded(parts[i + 1].length);
  }
  return out;
}

/** `name` without `./` and repeated slashes; refuses what would land outside the context. */
function clean(raw: string): string {
  const segments = raw.split("/").filter((s) => s !== "" && s !== ".");
  if (raw.startsWith("/")) throw new TarError(`${raw}: an absolute name; names are relative to the context`);
  if (segments.includes("..")) throw new TarError(`${raw}: a name with ".." would lead out of the context`);
  if (segments.length === 0) throw new TarError(`"${raw}": an empty name`);
  if (raw.includes("\0")) throw new TarError(`${JSON.stringify(raw)}: a name with a NUL byte`);
  return segments.join("/");
}

function padded(n: number): number {
  return Math.ceil(n / BLOCK) * BLOCK;
}

function headerOf(name: string, dir: boolean, size: number, mode: number, mtime: number): Uint8Array {
  const h = new Uint8Array(BLOCK);
  const [prefix, rest] = split(name);
  put(h, 0, 100, rest);
  put(h, 100, 8, octal(mode & 0o7777, 7));
  put(h, 108, 8, octal(0, 7)); // uid: root, as Docker's COPY makes it anyway
  put(h, 116, 8, octal(0, 7)); // gid
  put(h, 124, 12, octal(size, 11));
  put(h, 136, 12, octal(Math.max(0, Math.floor(mtime)), 11));
  h.fill(0x20, 148, 156); // the checksum counts its own field as spaces
  h[156] = dir ? 0x35 : 0x30; // '5' directory, '0' regular file
  put(h, 257, 6, "ustar\0");
  put(h, 263, 2, "00");
  put(h, 345, 155, prefix);
  let sum = 0;
  for (const b of h) sum += b;
  put(h, 148, 8, octal(sum, 6) + "\0 ");
  return h;
}

/**
 * ustar's (prefix, name) for a path: the whole path in `name` when it fits in 100 bytes, else
 * split at a `/` so that the prefix holds at most 155 bytes and the rest at most 100.
 */
function split(path: string): [Uint8Array, Uint8Array] {
  const whole = utf8.encode(path);
  if (whole.length <= 100) return [new Uint8Array(0), whole];
  // A directory's trailing slash belongs to the name part; split before it.
  for (let i = whole.length - 1; i > 0; i--) {
    if (whole[i] !== 0x2f || i === whole.length - 1) continue;
    const prefix = whole.subarray(0, i);
    const rest = whole.subarray(i + 1);
    if (rest.length > 100) break;
    if (prefix.length <= 155) return [prefix, rest];
  }
  throw new TarError(
    `${path}: too long for a ustar archive (at most 100 bytes, or 155 bytes of folders and a name of 100)`,
  );
}

function put(h: Uint8Array, at: number, len: number, value: string | Uint8Array) {
  const bytes = typeof value === "string" ? utf8.encode(value) : value;
  h.set(bytes.subarray(0, len), at);
}

function octal(n: number, digits: number): string {
  return n.toString(8).padStart(digits, "0") + "\0";
}
