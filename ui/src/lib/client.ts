// The one interface between the UI and wherever it runs. In a browser the UI is served by
// belljard and calls it same-origin with the session cookie; inside the desktop app it calls
// http://127.0.0.1:<port> with the bearer token the app reads from the daemon's config dir,
// and a few things (tray, windows, native file drops) go through the app. When the daemon does
// not accept those cross-origin calls (no CORS for the app's origin, or no token on WebSockets)
// the app's window loads the daemon's own copy of the UI instead, signed in like a browser.
// Nothing outside this file knows which of these it is.

import type { ErrorBody, ErrorCode } from "../generated/api";

/** Codes that do not come from the daemon: the desktop app's own failures (src-tauri's
 *  `CommandError::code`), an answer that is not the daemon's JSON, or a bare HTTP status. */
export type ClientErrorCode =
  | "daemon_unavailable"
  | "daemon_config"
  | "io"
  | "no_browser"
  | "bad_answer"
  | `http_${number}`;

/** An error answered by the daemon (or the app), with its stable code. */
export class ApiError extends Error {
  constructor(
    readonly code: ErrorCode | ClientErrorCode,
    message: string,
    readonly status = 0,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** A file dropped onto the window from the desktop (app only). */
export interface NativeDropFile {
  relative: string;
  size: number;
  read(): Promise<ArrayBuffer>;
}

export interface NativeDrop {
  x: number;
  y: number;
  files: NativeDropFile[];
  folders: string[];
  errors: string[];
}

export interface TrayState {
  images: string[];
  sandboxes: { id: string; label: string }[];
}

/** What the desktop shell asks of the UI (tray clicks). */
export type ShellRequest =
  | { kind: "quick-launch"; image: string }
  | { kind: "open-sandbox"; id: string }
  | { kind: "stop-sandbox"; id: string };

export interface Client {
  /** An HTTP request to the daemon; `path` starts with `/v1/`. */
  fetch(path: string, init?: RequestInit): Promise<Response>;
  /** A WebSocket on a daemon route, authorised. */
  websocket(path: string): Promise<WebSocket>;
  /** An XMLHttpRequest opened on a daemon route, authorised (uploads report progress). */
  xhr(method: string, path: string): Promise<XMLHttpRequest>;
  /** Forget the daemon's address so the next call finds it again (after a daemon restart). */
  reset(): void;
  /** Opens a window (or tab) with one terminal on a sandbox. */
  openTerminalWindow(sandboxId: string): Promise<void>;
  /**
   * Opens a link's address in the user's browser: in the app, which follows no
   * `target=_blank` link, through the desktop (`xdg-open`); in a browser it returns null and
   * the link's own click does it.
   */
  openInBrowser(url: string): Promise<void> | null;
  /** Tells the tray what to show; nothing in a browser. */
  setTray(state: TrayState): void;
  /** Native file drops (app only); returns an unsubscribe function. */
  onNativeDrop(
    over: (p: { x: number; y: number } | null) => void,
    drop: (d: NativeDrop) => void,
  ): () => void;
  /** Requests from the tray (app only). */
  onShellRequest(handler: (r: ShellRequest) => void): () => void;
  /** True when the page should show only one terminal (a terminal window). */
  terminalOnly(): string | null;
}

declare global {
  interface Window {
    __TAURI_INTERNALS__?: unknown;
    __BELLJAR_TERMINAL__?: string;
  }
}

/** Throws an `ApiError` for a non-2xx answer. */
export async function check(res: Response): Promise<Response> {
  if (res.ok) return res;
  let code: ApiError["code"] = res.status === 401 ? "unauthorized" : `http_${res.status}`;
  let message = res.statusText || "Request failed";
  try {
    const body = (await res.json()) as ErrorBody;
    if (body?.error) ({ code, message } = body.error);
  } catch {
    // Not JSON: keep the status line.
  }
  throw new ApiError(code, message, res.status);
}

class BrowserClient implements Client {
  fetch(path: string, init: RequestInit = {}): Promise<Response> {
    return fetch(path, { ...init, credentials: "same-origin" });
  }
  async websocket(path: string): Promise<WebSocket> {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}${path}`);
    ws.binaryType = "arraybuffer";
    return ws;
  }
  async xhr(method: string, path: string): Promise<XMLHttpRequest> {
    const x = new XMLHttpRequest();
    x.open(method, path);
    x.withCredentials = true;
    return x;
  }
  reset(): void {}
  async openTerminalWindow(sandboxId: string): Promise<void> {
    window.open(`${location.pathname}#/terminal/${encodeURIComponent(sandboxId)}`, "_blank");
  }
  openInBrowser(): null {
    return null;
  }
  setTray(): void {}
  onNativeDrop(): () => void {
    return () => {};
  }
  onShellRequest(): () => void {
    return () => {};
  }
  terminalOnly(): string | null {
    const m = /^#\/terminal\/(.+)$/.exec(location.hash);
    return m ? decodeURIComponent(m[1]) : null;
  }
}

interface Connection {
  base_url: string;
  token: string;
}

class TauriClient implements Client {
  private conn: Promise<Connection> | null = null;
  private relogging = false;

  private core() {
    return import("@tauri-apps/api/core");
  }
  /** True when the window shows the daemon's own copy of the UI (same origin, cookie). */
  private served(): boolean {
    return location.protocol === "http:" && location.hostname === "127.0.0.1";
  }
  private connection(): Promise<Connection> {
    if (this.served()) return Promise.resolve({ base_url: "", token: "" });
    if (!this.conn) {
      this.conn = this.core()
        .then((c) => c.invoke<Connection>("daemon_connection"))
        .then((c) => this.probe(c))
        .catch((e) => {
          this.conn = null;
          throw toApiError(e);
        });
    }
    return this.conn;
  }
  /**
   * The embedded page calls the daemon cross-origin. A daemon that does not answer CORS for the
   * app's origin makes that fail as a network error although it runs; then the window loads the
   * daemon's own UI, signed in with a one-time token, where every call is same-origin.
   */
  private async probe(c: Connection): Promise<Connection> {
    try {
      const res = await fetch(c.base_url + "/v1/info", { headers: { Authorization: `Bearer ${c.token}` } });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      const ws = c.base_url.replace(/^http/, "ws") + "/v1/events?access_token=" + encodeURIComponent(c.token);
      const opened = await new Promise<boolean>((resolve) => {
        const w = new WebSocket(ws);
        w.onopen = () => (w.close(), resolve(true));
        w.onerror = () => resolve(false);
        setTimeout(() => resolve(false), 5000);
      });
      if (!opened) throw new Error("WebSocket refused");
      return c;
    } catch {
      const { invoke } = await this.core();
      const url = await invoke<string>("daemon_ui_url");
      location.replace(url);
      return new Promise<Connection>(() => {});
    }
  }
  async fetch(path: string, init: RequestInit = {}): Promise<Response> {
    const c = await this.connection();
    const headers = new Headers(init.headers);
    if (c.token) headers.set("Authorization", `Bearer ${c.token}`);
    try {
      const res = await fetch(c.base_url + path, { ...init, headers, credentials: "same-origin" });
      // A restarted daemon forgets browser sessions: sign in again.
      if (res.status === 401 && this.served()) void this.relogin();
      return res;
    } catch (e) {
      this.reset();
      throw e;
    }
  }
  async websocket(path: string): Promise<WebSocket> {
    // A page cannot set headers on a WebSocket; the token rides in the query instead.
    const c = await this.connection();
    const sep = path.includes("?") ? "&" : "?";
    const base = c.base_url ? c.base_url.replace(/^http/, "ws") : `ws://${location.host}`;
    const url = base + path + (c.token ? sep + "access_token=" + encodeURIComponent(c.token) : "");
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    return ws;
  }
  async xhr(method: string, path: string): Promise<XMLHttpRequest> {
    const c = await this.connection();
    const x = new XMLHttpRequest();
    x.open(method, c.base_url + path);
    if (c.token) x.setRequestHeader("Authorization", `Bearer ${c.token}`);
    else x.withCredentials = true;
    return x;
  }
  reset(): void {
    this.conn = null;
    // The daemon may have come back on another port: load its UI from there.
    if (this.served()) void this.relogin();
  }
  private async relogin() {
    if (this.relogging) return;
    this.relogging = true;
    try {
      const { invoke } = await this.core();
      location.replace(await invoke<string>("daemon_ui_url"));
    } catch {
      this.relogging = false;
    }
  }
  async openTerminalWindow(sandboxId: string): Promise<void> {
    const { invoke } = await this.core();
    await invoke("open_terminal_window", { sandboxId }).catch((e) => {
      throw toApiError(e);
    });
  }
  async openInBrowser(url: string): Promise<void> {
    const { invoke } = await this.core();
    await invoke("open_url", { url }).catch((e) => {
      throw toApiError(e);
    });
  }
  setTray(state: TrayState): void {
    void this.core().then(({ invoke }) => invoke("set_tray", { tray: state }).catch(() => {}));
  }
  onNativeDrop(
    over: (p: { x: number; y: number } | null) => void,
    drop: (d: NativeDrop) => void,
  ): () => void {
    const offs: (() => void)[] = [];
    let closed = false;
    void import("@tauri-apps/api/webviewWindow").then(async ({ getCurrentWebviewWindow }) => {
      const { invoke } = await this.core();
      const w = getCurrentWebviewWindow();
      const a = await w.listen<{ x: number; y: number } | null>("belljar://drag-over", (e) => over(e.payload));
      const b = await w.listen<RawDrop>("belljar://drop", (e) => {
        over(null);
        drop({
          ...e.payload,
          files: e.payload.files.map((f) => ({
            relative: f.relative,
            size: f.size,
            read: () => invoke<ArrayBuffer>("read_dropped_file", { path: f.path }),
          })),
        });
      });
      offs.push(a, b);
      if (closed) offs.forEach((f) => f());
    });
    return () => {
      closed = true;
      offs.forEach((f) => f());
    };
  }
  onShellRequest(handler: (r: ShellRequest) => void): () => void {
    const offs: (() => void)[] = [];
    void import("@tauri-apps/api/webviewWindow").then(async ({ getCurrentWebviewWindow }) => {
      const w = getCurrentWebviewWindow();
      offs.push(
        await w.listen<{ image: string }>("belljar://quick-launch", (e) =>
          handler({ kind: "quick-launch", image: e.payload.image }),
        ),
        await w.listen<{ id: string }>("belljar://open-sandbox", (e) =>
          handler({ kind: "open-sandbox", id: e.payload.id }),
        ),
        await w.listen<{ id: string }>("belljar://stop-sandbox", (e) =>
          handler({ kind: "stop-sandbox", id: e.payload.id }),
        ),
      );
    });
    return () => offs.forEach((f) => f());
  }
  terminalOnly(): string | null {
    return window.__BELLJAR_TERMINAL__ ?? null;
  }
}

interface RawDrop {
  x: number;
  y: number;
  files: { path: string; relative: string; size: number }[];
  folders: string[];
  errors: string[];
}

function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e && typeof e === "object" && "code" in e && "message" in e) {
    const o = e as { code: ApiError["code"]; message: string };
    return new ApiError(o.code, o.message);
  }
  return new ApiError("internal", String(e));
}

/** The client for wherever this page runs. */
export const client: Client = window.__TAURI_INTERNALS__ ? new TauriClient() : new BrowserClient();
