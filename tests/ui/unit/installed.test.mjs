// How the app test reads an installed desktop entry: a wrong reading would start something
// other than what a desktop starts, or fail a good package.

import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { execArgv, installedApp, parseDesktopEntry } from "../installed.mjs";

test("Exec= quoting and field codes", () => {
  assert.deepEqual(execArgv("belljar-app"), ["belljar-app"]);
  assert.deepEqual(execArgv('"/opt/my app/run" --flag %U'), ["/opt/my app/run", "--flag"]);
  assert.deepEqual(execArgv('app "say \\"hi\\"" 100%%'), ["app", 'say "hi"', "100%"]);
  assert.throws(() => execArgv('app "open'), /unterminated/);
});

test("only the [Desktop Entry] group counts", () => {
  const e = parseDesktopEntry("# c\n[Desktop Entry]\nExec=a %F\nName=A\n[Desktop Action x]\nExec=b\n");
  assert.equal(e.get("Exec"), "a %F");
  assert.equal(e.get("Name"), "A");
});

test("a bare Exec= name resolves inside the prefix, never elsewhere", () => {
  const prefix = mkdtempSync(join(tmpdir(), "belljar-installed-"));
  try {
    mkdirSync(join(prefix, "usr/share/applications"), { recursive: true });
    mkdirSync(join(prefix, "usr/share/icons/hicolor/32x32/apps"), { recursive: true });
    mkdirSync(join(prefix, "usr/bin"), { recursive: true });
    const entry = "[Desktop Entry]\nType=Application\nName=X\nExec=x-app %U\nIcon=x-app\n";
    writeFileSync(join(prefix, "usr/share/applications/X.desktop"), entry);
    writeFileSync(join(prefix, "usr/share/icons/hicolor/32x32/apps/x-app.png"), "");
    // `ls` exists on the machine but not in the package: that is a broken package.
    writeFileSync(join(prefix, "usr/share/applications/X.desktop"), entry.replace("x-app %U", "ls"));
    assert.throws(() => installedApp(prefix), /no executable ls in the package/);
    writeFileSync(join(prefix, "usr/share/applications/X.desktop"), entry);
    writeFileSync(join(prefix, "usr/bin/x-app"), "#!/bin/sh\n");
    assert.throws(() => installedApp(prefix), /no executable x-app/);
    chmodSync(join(prefix, "usr/bin/x-app"), 0o755);
    const app = installedApp(prefix);
    assert.equal(app.exe, join(prefix, "usr/bin/x-app"));
    assert.deepEqual(app.args, []);
    rmSync(join(prefix, "usr/share/icons/hicolor/32x32/apps/x-app.png"));
    assert.throws(() => installedApp(prefix), /Icon=x-app is not in the package/);
  } finally {
    rmSync(prefix, { recursive: true, force: true });
  }
});
