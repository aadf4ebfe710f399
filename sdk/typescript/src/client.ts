// What belongs to the daemon rather than to one sandbox: its images (list, pull, import,
// remove, prune, export). A pull's and an import's progress arrive as NDJSON events that end
// with `done` or `error`; the error keeps the daemon's code.

import { createReadStream, createWriteStream } from "node:fs";
import { rename, rm } from "node:fs/promises";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

import type { Image, ImageBuildEvent, PruneImages, PrunedImages, PullImage } from "./generated/api.js";
import { imagePath, path, query } from "./routes.js";
import { BelljarError, type ConnectionOptions, type RequestOptions, Transport } from "./transport.js";

export interface ImageOptions {
  signal?: AbortSignal;
  /** Given each NDJSON event of a pull or an import as it arrives. */
  onProgress?: (event: ImageBuildEvent) => void;
}

/** A connection to the daemon, for what is not one sandbox's. */
export class Client {
  readonly transport: Transport;

  constructor(opts: ConnectionOptions | Transport = {}) {
    this.transport = opts instanceof Transport ? opts : new Transport(opts);
  }

  /** Every image: Belljar's own and the user's (with `source`, `used_by`, `shared_bytes`, ...). */
  images(opts: { signal?: AbortSignal } = {}): Promise<Image[]> {
    return this.transport.json("GET", path("images"), undefined, opts.signal);
  }

  /** Pulls `reference` from its registry (`insecure`: plain HTTP off loopback); the image. */
  async pullImage(reference: string, opts: ImageOptions & { insecure?: boolean } = {}): Promise<Image> {
    const body: PullImage = { reference, insecure: opts.insecure || undefined };
    const [image] = await this.events(path("images", "pull"), "pull", opts, {
      body: JSON.stringify(body),
      contentType: "application/json",
    });
    return image;
  }

  /** Imports a `docker save` archive or an OCI layout as a tar (a file's path, its bytes or
   * a stream), also named `tag` when given; the images it held. */
  importImage(archive: string | Uint8Array | Readable, opts: ImageOptions & { tag?: string } = {}): Promise<Image[]> {
    const body = typeof archive === "string" ? createReadStream(archive) : archive instanceof Readable ? archive : Buffer.from(archive);
    const url = path("images", "import") + query({ tag: opts.tag });
    return this.events(url, "import", opts, { body, contentType: "application/x-tar" });
  }

  /** Removes a pulled, imported or built image's name (`conflict` while a sandbox, snapshot or
   * template uses it); the image goes with its last name. */
  async removeImage(name: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.transport.json("DELETE", imagePath(name), undefined, opts.signal);
  }

  /** Removes the images nothing stands on: unnamed ones, with `all` every named one of the
   * user's, with `build_cache` the Dockerfile step cache. */
  pruneImages(opts: PruneImages & { signal?: AbortSignal } = {}): Promise<PrunedImages> {
    const { signal, ...body } = opts;
    return this.transport.json("POST", path("images", "prune"), body, signal);
  }

  /** A user's image as an OCI archive (`importImage`, `podman load` and `docker load` read
   * it), as it arrives. */
  exportImageStream(name: string, opts: { signal?: AbortSignal } = {}): Promise<Readable> {
    return this.transport.request("GET", imagePath(name, "export"), { signal: opts.signal });
  }

  /** Writes a user's image to `toPath` as an OCI archive: streamed beside it, renamed when whole. */
  async exportImage(name: string, toPath: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    const res = await this.exportImageStream(name, opts);
    const part = `${toPath}.belljar-part`;
    try {
      await pipeline(res, createWriteStream(part), { signal: opts.signal });
      await rename(part, toPath);
    } catch (e) {
      await rm(part, { force: true });
      if (e instanceof BelljarError) throw e;
      if (opts.signal?.aborted) throw new BelljarError("aborted", "The export was aborted");
      throw new BelljarError("connection_lost", `The export of ${name} broke: ${(e as Error).message}`);
    }
  }

  /** The images an NDJSON answer's `done` events name, or its `error` as a BelljarError. */
  private async events(url: string, what: string, opts: ImageOptions, req: RequestOptions): Promise<Image[]> {
    const images: Image[] = [];
    for await (const event of this.transport.ndjson<ImageBuildEvent>("POST", url, opts.signal, req)) {
      opts.onProgress?.(event);
      if (event.type === "done") images.push(event.image);
      if (event.type === "error") throw new BelljarError(event.code, event.message);
    }
    if (!images.length) throw new BelljarError("connection_lost", `The ${what} ended with neither done nor error`);
    return images;
  }
}
