// The live state of the daemon, kept from its event stream (`/v1/events` WebSocket): the
// sandboxes, their commands, and whether the daemon is reachable. No polling: after the first
// list, every change arrives as an event; after a disconnect the socket reconnects with
// `since=<last seq>` and the list is fetched once more.

import type { Command, Event, Info, Sandbox, Snapshot } from "../generated/api";
import { api } from "./api";
import { ApiError, client } from "./client";

export type Connection = "connecting" | "connected" | "offline" | "unauthorized";

class Live {
  sandboxes = $state<Record<string, Sandbox>>({});
  /** Snapshots seen on the event stream (or fetched by a timeline), by id. */
  snapshots = $state<Record<string, Snapshot>>({});
  /** Commands seen on the event stream, by sandbox id then command id. */
  commands = $state<Record<string, Record<string, Command>>>({});
  connection = $state<Connection>("connecting");
  error = $state<string | null>(null);
  info = $state<Info | null>(null);
  /** Increases on every (re)connect, so views can refetch what they show. */
  epoch = $state(0);
  /** A clock for ages and times left; ticks each second. */
  now = $state(Date.now());

  private seq = 0;
  private ws: WebSocket | null = null;
  private backoff = 500;
  private started = false;

  start() {
    if (this.started) return;
    this.started = true;
    setInterval(() => (this.now = Date.now()), 1000);
    void this.connect();
  }

  private async connect() {
    this.connection = this.connection === "unauthorized" ? "unauthorized" : "connecting";
    let ws: WebSocket;
    try {
      // Check that the daemon answers and we are allowed in before opening the socket, so the
      // user sees why not.
      this.info = await api.info();
      ws = await client.websocket("/v1/events" + (this.seq ? `?since=${this.seq}` : ""));
    } catch (e) {
      this.fail(e);
      return;
    }
    this.ws = ws;
    ws.onopen = async () => {
      this.backoff = 500;
      try {
        const list = await api.listSandboxes();
        const next: Record<string, Sandbox> = {};
        for (const s of list) next[s.id] = s;
        this.sandboxes = next;
        this.connection = "connected";
        this.error = null;
        this.epoch++;
      } catch (e) {
        this.fail(e);
        ws.close();
      }
    };
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") return;
      for (const line of m.data.split("\n")) {
        if (line.trim()) this.apply(JSON.parse(line) as Event);
      }
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.connection === "connected") this.connection = "offline";
      this.retry();
    };
  }

  private fail(e: unknown) {
    if (e instanceof ApiError && e.status === 401) {
      this.connection = "unauthorized";
      this.error = e.message;
    } else {
      this.connection = "offline";
      this.error = e instanceof Error ? e.message : String(e);
      client.reset();
    }
    this.retry();
  }

  private retry() {
    const wait = this.backoff;
    this.backoff = Math.min(this.backoff * 2, 5000);
    setTimeout(() => void this.connect(), wait);
  }

  apply(e: Event) {
    this.seq = Math.max(this.seq, e.seq);
    switch (e.type) {
      case "sandbox":
        this.sandboxes[e.sandbox.id] = e.sandbox;
        break;
      case "sandbox_deleted":
        delete this.sandboxes[e.sandbox_id];
        delete this.commands[e.sandbox_id];
        break;
      case "snapshot":
        this.snapshots[e.snapshot.id] = e.snapshot;
        break;
      case "command": {
        const c = e.command;
        (this.commands[c.sandbox_id] ??= {})[c.id] = c;
        break;
      }
    }
  }

  /**
   * Reads the images again into `info`: images are not on the event stream, so whoever
   * pulls, builds, imports or removes one (or opens a list of them) calls this.
   */
  async refreshImages() {
    this.setImages(await api.listImages());
  }
  setImages(images: Info["images"]) {
    if (this.info) this.info = { ...this.info, images };
  }

  /** Records a sandbox the UI itself changed, before its event arrives. */
  put(s: Sandbox) {
    this.sandboxes[s.id] = s;
  }
  remove(id: string) {
    delete this.sandboxes[id];
  }
}

export const live = new Live();
