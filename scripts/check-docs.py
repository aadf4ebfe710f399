#!/usr/bin/env python3
"""Checks that the documentation shows only what exists.

For README.md, CONTRIBUTING.md, CHANGELOG.md and every Markdown file under docs/:
- every `belljar SUBCOMMAND [SUBSUB]` in a sh/bash/shell/console block or an inline code span
  is a real command (`belljar SUBCOMMAND --help` succeeds), and every flag shown with it
  appears in that command's --help; `belljard` and `belljar-vmm` flags likewise when those
  binaries sit beside `belljar`;
- every repository path named (scripts/..., tests/..., bench/..., crates/..., ...) exists,
  or is one git ignores (build output such as fuzz/runs/);
- every relative Markdown link resolves inside the repository (anchors are not checked);
- no lab-notebook text: session numbers, UTC times of runs, load averages, issue numbers
  (#NN), dates of runs;
- README.md stays at most 200 lines, has a Test(s/ing) heading and names scripts/test.sh.

Prints every problem as FILE:LINE: message and exits 1 if there was any. Needs the built CLI:
$BELLJAR_BIN, else `belljar` on PATH.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
COMMAND_LANGS = {"sh", "bash", "shell", "console"}
PROGRAMS = ("belljar", "belljard", "belljar-vmm")
PATH_ROOTS = (
    "scripts", "tests", "bench", "crates", "vmm", "guest-images", "fuzz", "sdk", "ui",
    "src-tauri", "docs", "icons", ".ci",
)
PATH_RE = re.compile(
    r"(?<![\w./~$<-])((?:%s)/[\w./@+-]*)" % "|".join(re.escape(p) for p in PATH_ROOTS)
)
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE_RE = re.compile(r"(`+)(.+?)\1")
DIARY = [
    (re.compile(r"\bsessions? \d+", re.I), "a session number"),
    (re.compile(r"\b\d{1,2}:\d{2}(?:[–-]\d{1,2}:\d{2})? UTC\b"), "a UTC time of a run"),
    (re.compile(r"\bload average", re.I), "a load average"),
    (re.compile(r"(?<![\w&/#])#\d{1,5}\b"), "an issue number"),
    (re.compile(r"(?<!passt )\b20\d\d-[01]\d-[0-3]\d\b"), "a date of a run"),
]
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}"}
PREFIXES = {"sudo", "env", "exec", "time", "timeout", "eval", "then", "do", "!"}


class Checker:
    def __init__(self, binary: Path):
        self.binary = binary
        self.bindir = binary.resolve().parent
        self.helps = {}
        self.problems = []
        self.commands = 0

    def problem(self, where, message):
        self.problems.append(f"{where}: {message}")

    # --- --help of a (sub)command, cached ---------------------------------------------
    def help(self, program, path):
        key = (program, tuple(path))
        if key not in self.helps:
            exe = self.binary if program == "belljar" else self.bindir / program
            if program != "belljar" and not exe.exists():
                self.helps[key] = None
                return None
            run = subprocess.run(
                [str(exe), *path, "--help"], capture_output=True, text=True, timeout=20,
                env={**os.environ, "NO_COLOR": "1"},
            )
            self.helps[key] = run.stdout if run.returncode == 0 else ""
        return self.helps[key]

    @staticmethod
    def subcommands(help_text):
        m = re.search(r"^Commands:\n((?:  .*\n?)+)", help_text, re.M)
        if not m:
            return set()
        return {line.split()[0] for line in m.group(1).splitlines() if line.strip()}

    @staticmethod
    def has_flag(help_text, flag):
        if flag.startswith("--"):
            return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(flag), help_text) is not None
        return re.search(r"(?<![\w-])%s(?=[ ,=<\n])" % re.escape(flag), help_text) is not None

    # --- one invocation: tokens after the program name -------------------------------------
    def invocation(self, where, program, args):
        self.commands += 1
        path = []
        base = self.help(program, [])
        if base is None:
            return  # that binary is not built here
        text = base
        flags = []
        i = 0
        while i < len(args):
            tok = args[i]
            if tok == "--":
                break
            if tok.startswith("-") and tok != "-":
                flags.append((tok, list(path)))
            elif program == "belljar":
                subs = self.subcommands(text)
                if subs and not path_is_placeholder(tok):
                    if tok not in subs:
                        shown = " ".join([program, *path, tok])
                        self.problem(where, f"`{shown}`: no such command (`{' '.join([program, *path])} --help`)")
                        return
                    path.append(tok)
                    text = self.help(program, path)
                    if not text:
                        self.problem(where, f"`{program} {' '.join(path)} --help` fails")
                        return
                elif subs:
                    return  # a placeholder where a subcommand goes: nothing to check
            i += 1
        for flag, _ in flags:
            name = flag.split("=", 1)[0]
            if re.fullmatch(r"-[A-Za-z]{2,}", name):
                names = ["-" + c for c in name[1:]]
            else:
                names = [name]
            for n in names:
                if not re.fullmatch(r"--?[A-Za-z][\w-]*", n):
                    continue
                if not self.has_flag(text, n):
                    shown = " ".join([program, *path])
                    self.problem(where, f"`{shown}` has no flag {n} (see `{shown} --help`)")

    # --- a shell line: find the programs' invocations --------------------------------------
    def shell(self, where, line):
        for inner in re.findall(r"\$\(([^()]*)\)", line):
            self.shell(where, inner)
        try:
            lex = shlex.shlex(line, posix=True, punctuation_chars=";&|(){}")
            lex.whitespace_split = True
            lex.commenters = "#"
            tokens = list(lex)
        except ValueError:
            tokens = line.split()
        start = True
        cmd = None
        for tok in tokens + [";"]:
            if tok in SEPARATORS:
                if cmd:
                    self.invocation(where, cmd[0], cmd[1:])
                cmd, start = None, True
                continue
            if cmd is not None:
                cmd.append(tok)
                continue
            if not start:
                continue
            if tok in PREFIXES or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tok):
                continue
            name = os.path.basename(tok)
            if name in PROGRAMS:
                cmd = [name]
            start = False

    # --- paths and links ---------------------------------------------------------------------
    def paths(self, where, text):
        for m in PATH_RE.finditer(text):
            p = m.group(1).rstrip(".,:;")
            if re.search(r"[A-Z]{3,}|[*{}…<>$]", p) or p.endswith(("/N", ".N")):
                continue
            if (ROOT / p).exists() or self.ignored(p):
                continue
            self.problem(where, f"{p}: no such file or directory")

    @staticmethod
    def ignored(path):
        """Build output that git ignores (fuzz/runs/, ui/dist): named, never committed."""
        for p in (path, path.rstrip("/") + "/"):
            if subprocess.run(["git", "check-ignore", "-q", "--no-index", p], cwd=ROOT).returncode == 0:
                return True
        return False

    def links(self, where, file, text):
        for m in LINK_RE.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            rel, _, anchor = target.partition("#")
            resolved = (file.parent / rel).resolve()
            if ROOT not in resolved.parents and resolved != ROOT:
                self.problem(where, f"link {target}: outside the repository")
            elif not resolved.exists():
                self.problem(where, f"link {target}: does not resolve")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                self.problem(where, f"link {target}: no heading with that anchor")

    # --- one file ----------------------------------------------------------------------------
    def file(self, file):
        rel = file.relative_to(ROOT)
        fence = None
        lang = ""
        pending = ""
        lines = file.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines, 1):
            where = f"{rel}:{n}"
            for pattern, what in DIARY:
                if pattern.search(line):
                    self.problem(where, f"{what} ({pattern.search(line).group(0)!r}): the docs say what is true now; history is git's")
            m = re.match(r"\s*(`{3,}|~{3,})\s*([\w+-]*)", line)
            if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
                if fence is None:
                    fence, lang = m.group(1), m.group(2).lower()
                else:
                    fence, lang, pending = None, "", ""
                continue
            if fence is not None:
                if lang in COMMAND_LANGS:
                    cmdline = line.strip()
                    if lang == "console":
                        if not cmdline.startswith("$ "):
                            continue
                        cmdline = cmdline[2:]
                    cmdline = pending + cmdline
                    if cmdline.endswith("\\"):
                        pending = cmdline[:-1] + " "
                        continue
                    pending = ""
                    self.shell(where, cmdline)
                    self.paths(where, cmdline)
                continue
            self.links(where, file, line)
            for code in INLINE_CODE_RE.finditer(line):
                span = code.group(2).strip()
                self.paths(where, span)
                if re.match(r"(sudo )?(belljar|belljard|belljar-vmm)( |$)", span):
                    self.shell(where, span)
        if rel == Path("README.md"):
            if len(lines) > README_MAX_LINES:
                self.problem(f"{rel}:{len(lines)}", f"README has {len(lines)} lines, more than {README_MAX_LINES}: move detail to docs/")
            if not any(re.match(r"#+ *(Test|Tests|Testing)\b", l) for l in lines):
                self.problem(f"{rel}:1", "no heading Test/Tests/Testing")
            if "scripts/test.sh" not in "\n".join(lines):
                self.problem(f"{rel}:1", "does not name the test command, scripts/test.sh")


def main():
    found = os.environ.get("BELLJAR_BIN") or shutil.which("belljar")
    if not found:
        print("check-docs: no belljar binary: set BELLJAR_BIN or put belljar on PATH", file=sys.stderr)
        return 2
    checker = Checker(Path(found))
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    for f in files:
        if f.exists():
            checker.file(f)
        else:
            checker.problem(f.relative_to(ROOT), "missing")
    for p in checker.problems:
        print(p)
    status = "FAILED" if checker.problems else "ok"
    print(
        f"check-docs: {len(files)} files, {checker.commands} commands, {len(checker.problems)} problems: {status}",
        file=sys.stderr,
    )
    return 1 if checker.problems else 0


def anchors(md):
    """The anchors GitHub gives a Markdown file's headings."""
    found = set()
    for line in md.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{1,6} +(.*?) *#*$", line)
        if m:
            text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", m.group(1)).lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def path_is_placeholder(tok):
    return bool(re.match(r"[<\[]|[A-Z_]+$|.*…", tok))


if __name__ == "__main__":
    sys.exit(main())
