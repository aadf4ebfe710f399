// Short messages for the user about what just happened (and what to do when it went wrong).

export interface Note {
  key: number;
  kind: "info" | "error";
  text: string;
}

let next = 1;

class Notes {
  list = $state<Note[]>([]);
  push(kind: Note["kind"], text: string, ms = kind === "error" ? 9000 : 3500) {
    const key = next++;
    this.list.push({ key, kind, text });
    setTimeout(() => this.dismiss(key), ms);
  }
  dismiss(key: number) {
    this.list = this.list.filter((n) => n.key !== key);
  }
}

export const notes = new Notes();

/** Reports a failed action with its reason. */
export function reportError(what: string, e: unknown) {
  notes.push("error", `${what}: ${e instanceof Error ? e.message : String(e)}`);
}
