// Unit tests of the browser's ustar writer (src/lib/tar.ts) and of the Images page's readers
// of the daemon's answers (src/lib/images.ts): the archive is read back field by field and by
// the system's tar, names are split into ustar's prefix or refused, a pull's progress messages
// add up to a fraction.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { build } from "esbuild";

async function load(entry) {
  const out = await build({ entryPoints: [entry], bundle: true, format: "esm", write: false, platform: "neutral" });
  return import("data:text/javascript;base64," + Buffer.from(out.outputFiles[0].text).toString("base64"));
}

const { tar, TarError } = await load(new URL("../src/lib/tar.ts", import.meta.url).pathname);
const images = await load(new URL("../src/lib/images.ts", import.meta.url).pathname);
const bytes = (s) => new TextEncoder().encode(s);

/** The entries of a ustar archive, each header checked against its checksum. */
function read(buf) {
  const text = (at, len) => Buffer.from(buf.subarray(at, at + len)).toString("utf8").replace(/\0.*$/s, "");
  const out = [];
  let at = 0;
  for (;;) {
    const h = buf.subarray(at, at + 512);
    if (h.every((b) => b === 0)) break;
    let sum = 0;
    for (let i = 0; i < 512; i++) sum += i >= 148 && i < 156 ? 0x20 : h[i];
    assert.equal(parseInt(text(at + 148, 8), 8), sum, "header checksum");
    assert.equal(text(at + 257, 6), "ustar");
    const prefix = text(at + 345, 155);
    const name = (prefix ? prefix + "/" : "") + text(at, 100);
    const size = parseInt(text(at + 124, 12), 8);
    const type = String.fromCharCode(h[156]);
    const mode = parseInt(text(at + 100, 8), 8);
    out.push({ name, size, type, mode, data: Buffer.from(buf.subarray(at + 512, at + 512 + size)).toString("utf8") });
    at += 512 + Math.ceil(size / 512) * 512;
  }
  assert.equal(buf.length, at + 1024, "two zero blocks end the archive");
  return out;
}

test("files and directories are written as ustar and read back", () => {
  const buf = tar([
    { name: "src", kind: "dir" },
    { name: "./src//main.sh", data: bytes("echo hi\n"), mode: 0o755 },
    { name: "Dockerfile", data: bytes("FROM base\nRUN echo hi > /hi\n") },
    { name: "empty" },
  ]);
  assert.equal(buf.length % 512, 0);
  assert.deepEqual(read(buf), [
    { name: "src/", size: 0, type: "5", mode: 0o755, data: "" },
    { name: "src/main.sh", size: 8, type: "0", mode: 0o755, data: "echo hi\n" },
    { name: "Dockerfile", size: 28, type: "0", mode: 0o644, data: "FROM base\nRUN echo hi > /hi\n" },
    { name: "empty", size: 0, type: "0", mode: 0o644, data: "" },
  ]);
});

test("the system's tar reads the archive, long names included", { skip: !hasTar() }, () => {
  const dir = mkdtempSync(join(tmpdir(), "belljar-tar-"));
  try {
    const deep = `${"d".repeat(90)}/${"e".repeat(60)}`;
    const file = `${deep}/${"f".repeat(99)}`;
    writeFileSync(join(dir, "a.tar"), tar([
      { name: "d".repeat(90), kind: "dir" },
      { name: deep, kind: "dir" },
      { name: file, data: bytes("deep\n") },
      { name: "naïve.txt", data: bytes("ü\n") },
    ]));
    const listed = execFileSync("tar", ["-tf", join(dir, "a.tar")], { encoding: "utf8" }).trim().split("\n");
    assert.deepEqual(listed, [`${"d".repeat(90)}/`, `${deep}/`, file, "naïve.txt"]);
    execFileSync("tar", ["-xf", join(dir, "a.tar"), "-C", dir]);
    assert.equal(readFileSync(join(dir, file), "utf8"), "deep\n");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a name over 100 bytes goes in the prefix field, split at a slash", () => {
  const name = `${"p".repeat(150)}/${"n".repeat(100)}`;
  const [e] = read(tar([{ name, data: bytes("x") }]));
  assert.equal(e.name, name);
});

test("names ustar cannot hold, or that lead out of the context, are refused with the name", () => {
  const refuse = (name, what) => assert.throws(() => tar([{ name, data: bytes("") }]), (e) => e instanceof TarError && e.message.includes(what));
  refuse("x".repeat(101), "too long for a ustar archive");
  refuse(`${"p".repeat(156)}/n`, "too long");
  refuse(`p/${"n".repeat(101)}`, "too long");
  refuse("/etc/passwd", "absolute");
  refuse("a/../../b", "lead out of the context");
  refuse("./", "empty name");
  assert.throws(() => tar([{ name: "a", data: bytes("") }, { name: "./a", data: bytes("") }]), /twice/);
});

test("a build context: the typed Dockerfile over the folder's, every parent folder made", () => {
  const buf = images.contextTar(
    [
      { relative: "app/bin/run", data: bytes("#!/bin/sh\n") },
      { relative: "Dockerfile", data: bytes("FROM old\n") },
    ],
    ["empty/dir"],
    "FROM base\nCOPY app /app\n",
  );
  assert.deepEqual(read(buf).map((e) => [e.name, e.data]), [
    ["app/", ""], ["app/bin/", ""], ["empty/", ""], ["empty/dir/", ""],
    ["app/bin/run", "#!/bin/sh\n"], ["Dockerfile", "FROM base\nCOPY app /app\n"],
  ]);
  assert.deepEqual(images.underRoot(["ctx/Dockerfile", "ctx/src/a"]), { root: "ctx", paths: ["Dockerfile", "src/a"] });
  assert.deepEqual(images.underRoot(["a.txt", "ctx/b"]), { root: null, paths: ["a.txt", "ctx/b"] });
});

test("a pull's progress messages add up to bytes of the total, indeterminate until it is known", () => {
  const p = images.newPullProgress();
  assert.equal(images.pullFraction(p), null);
  for (const m of ["2 layers, 1000 bytes", "layer 1: 300/600 bytes", "layer 1: 600/600 bytes", "layer 2: 100/400 bytes"]) {
    assert.ok(images.readPullMessage(p, m), m);
  }
  assert.equal(images.pulledBytes(p), 700);
  assert.equal(images.pullFraction(p), 0.7);
  assert.ok(images.readPullMessage(p, "layer 1: unpacked 12 entries, 4096 bytes (1 device nodes left out)"));
  assert.equal(p.unpacked, 1);
  assert.equal(images.readPullMessage(p, "something else"), false);
  const cached = images.newPullProgress();
  images.readPullMessage(cached, "already here");
  assert.equal(images.pullFraction(cached), 1);
});

test("images: short ids, whose they are, and who uses them", () => {
  assert.equal(images.shortId("sha256:0123456789abcdef"), "0123456789ab");
  assert.equal(images.shortId(undefined), "—");
  assert.equal(images.isOwn({ name: "base", status: "ready" }), true);
  assert.equal(images.isOwn({ name: "localhost/app:dev", status: "ready" }), false);
  assert.equal(images.isOwn({ name: "app", status: "ready", source: "build" }), false);
  const img = { name: "localhost/app:dev", status: "ready", digest: "sha256:aa" };
  const sandboxes = [
    { id: "sbx_1", image: "localhost/app:dev", image_id: "sha256:aa" },
    { id: "sbx_2", image: "localhost/app:dev", image_id: "sha256:old" },
    { id: "sbx_3", image: "base" },
  ];
  const templates = [{ name: "web", image: "localhost/app:dev" }];
  assert.deepEqual(images.usersOf(img, sandboxes, templates), { sandboxes: ["sbx_1"], snapshots: [], templates: ["web"] });
  const told = { sandboxes: ["sbx_9"], snapshots: ["snap_1"], templates: [] };
  assert.deepEqual(images.usersOf({ ...img, used_by: told }, sandboxes, templates), told);
});

function hasTar() {
  try {
    execFileSync("tar", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}
