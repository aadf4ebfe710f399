// A sandbox's network: its firewall (`NetworkPolicy`, replaced whole while it runs), byte
// totals, the flow log (NDJSON, followed live) and the ports exposed on 127.0.0.1.

import type { NetworkFlow, NetworkInfo, NetworkPolicy, Port, PortList, Sandbox as SandboxData } from "./generated/api.js";
import { path, query } from "./routes.js";
import type { Transport } from "./transport.js";

export interface NetOptions {
  signal?: AbortSignal;
}

/** The network of one sandbox. */
export class Network {
  constructor(
    private readonly transport: Transport,
    private readonly sandboxId: string,
    private readonly updated: (data: SandboxData) => void,
  ) {}

  /** The policy (brokered header values redacted), exposed ports and byte totals. */
  info(opts: NetOptions = {}): Promise<NetworkInfo> {
    return this.transport.json("GET", path("sandboxes", this.sandboxId, "network"), undefined, opts.signal);
  }

  /** Replaces the firewall; flows it now denies are cut. */
  async setPolicy(policy: NetworkPolicy, opts: NetOptions = {}): Promise<void> {
    const body = { network_policy: policy };
    this.updated(await this.transport.json("PATCH", path("sandboxes", this.sandboxId), body, opts.signal));
  }

  /** The flows so far (oldest first); with `follow`, new ones as they are decided. */
  flows(opts: NetOptions & { follow?: boolean } = {}): AsyncGenerator<NetworkFlow> {
    const url = path("sandboxes", this.sandboxId, "network", "flows") + query({ follow: opts.follow ? "true" : undefined });
    return this.transport.ndjson<NetworkFlow>("GET", url, opts.signal);
  }

  /** Exposes the sandbox's TCP `port` on 127.0.0.1 (`hostPort`, else a free one). */
  exposePort(port: number, opts: NetOptions & { hostPort?: number } = {}): Promise<Port> {
    const body = { port, host_port: opts.hostPort };
    return this.transport.json("POST", path("sandboxes", this.sandboxId, "ports"), body, opts.signal);
  }

  /** The exposed ports. */
  async ports(opts: NetOptions = {}): Promise<Port[]> {
    const list: PortList = await this.transport.json("GET", path("sandboxes", this.sandboxId, "ports"), undefined, opts.signal);
    return list.ports;
  }

  /** Stops exposing `port`. */
  async removePort(port: number, opts: NetOptions = {}): Promise<void> {
    await this.transport.json("DELETE", path("sandboxes", this.sandboxId, "ports", String(port)), undefined, opts.signal);
  }
}
