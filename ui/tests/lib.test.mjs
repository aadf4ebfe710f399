// Unit tests of the UI's pure helpers (formatting, durations, KEY=value parsing, paths).
// The TypeScript is bundled by esbuild (Vite's own) into memory and imported; run with
// `npm test` (node --test).
import { test } from "node:test";
import assert from "node:assert/strict";
import { build } from "esbuild";

async function load(entry) {
  const out = await build({ entryPoints: [entry], bundle: true, format: "esm", write: false, platform: "neutral" });
  return import("data:text/javascript;base64," + Buffer.from(out.outputFiles[0].text).toString("base64"));
}

const fmt = await load(new URL("../src/lib/format.ts", import.meta.url).pathname);
const paths = await load(new URL("../src/lib/paths.ts", import.meta.url).pathname);

test("durations read like a person would say them", () => {
  assert.equal(fmt.duration(0), "0 s");
  assert.equal(fmt.duration(59_999), "59 s");
  assert.equal(fmt.duration(5 * 60_000), "5 min");
  assert.equal(fmt.duration(2 * 3_600_000 + 10 * 60_000), "2 h 10 min");
  assert.equal(fmt.duration(3 * 86_400_000), "3 d");
  assert.equal(fmt.duration(-90_000), "-1 min");
  assert.equal(fmt.runTime(420), "0.42 s");
});

test("sizes use binary units", () => {
  assert.equal(fmt.bytes(512), "512 B");
  assert.equal(fmt.bytes(1536), "1.5 KiB");
  assert.equal(fmt.bytes(20 * 1024 * 1024), "20 MiB");
  assert.equal(fmt.mib(1024), "1 GiB");
  assert.equal(fmt.mib(512), "512 MiB");
  assert.equal(fmt.mib(1536), "1.5 GiB");
});

test("timeouts parse from 5m, 90s, 1h30m or plain minutes, and reject the rest", () => {
  assert.equal(fmt.parseDuration("5m"), 300_000);
  assert.equal(fmt.parseDuration("90s"), 90_000);
  assert.equal(fmt.parseDuration("1h30m"), 5_400_000);
  assert.equal(fmt.parseDuration("1h 30min"), 5_400_000);
  assert.equal(fmt.parseDuration("10"), 600_000);
  assert.equal(fmt.parseDuration("soon"), null);
  assert.equal(fmt.parseDuration("5 parsecs"), null);
  assert.equal(fmt.parseDuration(""), null);
});

test("KEY=value lines parse, and a bad line is named", () => {
  assert.deepEqual(fmt.parsePairs("A=1\n B = two \n\nC=x=y", "Env"), { value: { A: "1", B: "two", C: "x=y" } });
  assert.deepEqual(fmt.parsePairs("a=1,b=2", "Tags"), { value: { a: "1", b: "2" } });
  assert.deepEqual(fmt.parsePairs("oops", "Tags"), { error: 'Tags: "oops" is not KEY=value' });
});

test("sandbox paths join and split", () => {
  assert.equal(paths.joinPath("/workspace", "a/b.txt"), "/workspace/a/b.txt");
  assert.equal(paths.joinPath("/workspace/", "/c"), "/workspace/c");
  assert.equal(paths.dirname("/workspace/a/b.txt"), "/workspace/a");
  assert.equal(paths.dirname("/workspace"), "/");
  assert.equal(paths.basename("/workspace/a/"), "a");
  assert.equal(paths.isImage("x.PNG"), true);
  assert.equal(paths.isImage("x.txt"), false);
  assert.equal(paths.language("main.rs"), "rust");
  assert.equal(paths.language("Dockerfile"), "dockerfile");
  assert.equal(paths.language("noext"), null);
});
