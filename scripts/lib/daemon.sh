# shellcheck shell=bash
# A throwaway belljard for the script suites (API fuzzing, the SDKs, Vercel compatibility), in
# one place: started on a fresh home by the CLI's launcher (`belljar daemon start`, which waits
# for the daemon's READY=1 on a notify socket instead of polling for files), and, at exit,
# every sandbox it made deleted and the daemon stopped.
#
#   . scripts/lib/daemon.sh
#   daemon_start "$target/debug/belljar" belljar-compat    # needs belljard beside belljar
#
# Sets: home (BELLJAR_HOME, exported), socket, port, token, daemon_log; defines api (curl on
# the daemon's Unix socket). Installs an EXIT trap (daemon_stop); a caller with its own
# cleanup calls daemon_stop from it.

api() { curl -sS --max-time 60 --unix-socket "$socket" "$@"; }

daemon_start() {
  local cli=$1 prefix=$2
  _daemon_cli=$cli
  home=$(mktemp -d "/tmp/$prefix.XXXXXX")
  export BELLJAR_HOME="$home"
  socket="$home/run/belljard.sock"
  daemon_log="$home/data/belljard.log"
  trap daemon_stop EXIT
  if ! "$cli" daemon start --port 0 > /dev/null; then
    echo "belljard did not start; its log:" >&2
    cat "$daemon_log" >&2 2> /dev/null
    return 1
  fi
  port=$(cat "$home/run/port")
  token=$(cat "$home/config/token")
}

daemon_stop() {
  set +e
  [ -n "${home:-}" ] || return 0
  if [ -S "$socket" ]; then
    # Sandboxes outlive their daemon: delete every one it made (a page of 200 at a time).
    local ids id
    for _ in $(seq 20); do
      ids=$(api "http://belljard/v1/sandboxes?limit=200" |
        python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)["sandboxes"]]')
      [ -n "$ids" ] || break
      for id in $ids; do
        api -X DELETE "http://belljard/v1/sandboxes/$id" > /dev/null
      done
    done
    "$_daemon_cli" daemon stop > /dev/null
  fi
  rm -rf "$home"
  home=""
}
