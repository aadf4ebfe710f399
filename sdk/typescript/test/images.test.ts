// Image management against a real daemon (sdk/run-tests.sh starts one and sets BELLJAR_HOME):
// a tiny OCI layout made here imported, listed with its source, exported and imported back
// under another name with the same files, its removal refused while a sandbox uses it, then
// removed; a prune's answer; a pull from a port nothing listens on failing with a code.
// The image store outlives the daemon's home and other runs share it, so every name holds
// this run's id, and what the run made is removed at its end.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { BelljarError, Client, type ImageBuildEvent, Sandbox } from "../src/index.js";

const run = `${process.pid}-${Date.now()}`;
const tag = `ts-images-${process.pid}`;
const file = "belljar-sdk.txt";
const content = "from the layout\n";
const client = new Client();
const dir = mkdtempSync(join(tmpdir(), "belljar-sdk-images-"));

function imageName(which: string): string {
  return `localhost/belljar-sdk-ts-${run}/${which}:1`;
}

/** A ustar archive of regular files. */
function tar(files: Record<string, Buffer>): Buffer {
  const blocks: Buffer[] = [];
  for (const [name, data] of Object.entries(files)) {
    const h = Buffer.alloc(512);
    h.write(name, 0, 100, "utf8");
    h.write("0000644\0", 100);
    h.write("0000000\0", 108);
    h.write("0000000\0", 116);
    h.write(data.length.toString(8).padStart(11, "0") + "\0", 124);
    h.write("00000000000\0", 136);
    h.write("        ", 148);
    h.write("0", 156);
    h.write("ustar\0" + "00", 257);
    let sum = 0;
    for (const b of h) sum += b;
    h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148);
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

/** An OCI image layout, as a tar, of one image with one layer holding one file. */
function ociLayoutTar(): Buffer {
  const blobs: Record<string, Buffer> = {};
  const blob = (mediaType: string, data: Buffer) => {
    const hex = createHash("sha256").update(data).digest("hex");
    blobs[`blobs/sha256/${hex}`] = data;
    return { mediaType, digest: `sha256:${hex}`, size: data.length };
  };
  const json = (v: unknown) => Buffer.from(JSON.stringify(v));
  const layer = blob("application/vnd.oci.image.layer.v1.tar", tar({ [file]: Buffer.from(content) }));
  const config = { architecture: "amd64", os: "linux", config: { Cmd: ["/bin/sh"] }, rootfs: { type: "layers", diff_ids: [layer.digest] } };
  const manifest = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: blob("application/vnd.oci.image.config.v1+json", json(config)),
    layers: [layer],
  };
  const index = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [blob("application/vnd.oci.image.manifest.v1+json", json(manifest))],
  };
  return tar({ "oci-layout": json({ imageLayoutVersion: "1.0.0" }), "index.json": json(index), ...blobs });
}

async function rejectsWith(p: Promise<unknown>, code: string): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof BelljarError, `not a BelljarError: ${String(e)}`);
    assert.equal(e.code, code, e.message);
    return true;
  });
}

after(async () => {
  for (const s of await Sandbox.list({ tag: `suite=${tag}` })) await s.delete();
  for (const i of await client.images()) if (i.name.includes(run)) await client.removeImage(i.name);
  rmSync(dir, { recursive: true, force: true });
});

describe("images", () => {
  test("import, list, export, import back, remove refused while used, then removed", async () => {
    const layout = join(dir, "layout.tar");
    writeFileSync(layout, ociLayoutTar());
    const events: ImageBuildEvent[] = [];
    const imported = await client.importImage(layout, { tag: imageName("a"), onProgress: (e) => events.push(e) });
    assert.ok(imported.some((i) => i.name === imageName("a")));
    assert.equal(events.at(-1)?.type, "done");
    const listed = (await client.images()).find((i) => i.name === imageName("a"));
    assert.equal(listed?.status, "ready");
    assert.match(listed?.source ?? "", /^import/);
    assert.match(listed?.digest ?? "", /^sha256:/);
    assert.deepEqual(listed?.used_by, { sandboxes: [], snapshots: [], templates: [] });

    const archive = join(dir, "a.tar");
    await client.exportImage(imageName("a"), archive);
    assert.ok(!readdirSync(dir).some((n) => n.endsWith(".belljar-part")));
    const head = readFileSync(archive);
    for (const member of ["oci-layout", "index.json", "manifest.json"]) assert.ok(head.includes(member), member);

    // The archive records the name it was exported under: both names now name the image it
    // holds, a new one (each layer written anew), and the first image is left unnamed.
    const back = await client.importImage(readFileSync(archive), { tag: imageName("b") });
    assert.deepEqual(back.map((i) => i.name), [imageName("a")]);
    assert.notEqual(back[0].digest, listed?.digest);
    assert.equal((await client.images()).find((i) => i.name === imageName("b"))?.digest, back[0].digest);
    const sbx = await Sandbox.create({ image: imageName("b"), tags: { suite: tag }, timeout_ms: 300_000 });
    try {
      assert.equal((await sbx.files.read(`/${file}`)).toString(), content);
      const used = (await client.images()).find((i) => i.name === imageName("b"));
      assert.deepEqual(used?.used_by?.sandboxes, [sbx.id]);
      await client.removeImage(imageName("a"));
      await rejectsWith(client.removeImage(imageName("b")), "conflict");
    } finally {
      await sbx.delete();
    }
    await client.removeImage(imageName("b"));
    assert.ok(!(await client.images()).some((i) => i.name.includes(run)));
    await rejectsWith(client.removeImage(imageName("a")), "image_not_available");
    await rejectsWith(client.exportImage(imageName("a"), join(dir, "gone.tar")), "image_not_available");
    assert.ok(!readdirSync(dir).some((n) => n.startsWith("gone.tar")));
    assert.ok(statSync(archive).size > 0);
  });

  test("prune answers what it removed", async () => {
    const pruned = await client.pruneImages();
    assert.deepEqual(Object.keys(pruned).sort(), ["reclaimed_bytes", "removed"]);
    assert.equal(typeof pruned.reclaimed_bytes, "number");
    for (const r of pruned.removed) for (const k of ["id", "names", "build_step", "size_bytes"]) assert.ok(k in r, k);
  });

  test("a pull from a port nothing listens on fails with a code", async () => {
    const started = Date.now();
    await rejectsWith(client.pullImage("127.0.0.1:1/none:1"), "registry_unavailable");
    assert.ok(Date.now() - started < 60_000);
  });
});
