# The set-up's few steps that need root (Debian packages, the guest images), for root and for a
# user with sudo, who may have to type a password; sourced by scripts/setup.sh and
# guest-images/build-all.sh.
#
# `as_root WHY COMMAND...` runs COMMAND as root: directly for root, else through sudo. WHY
# completes "to ...": sudo's prompt says what the password is for. After it was given once, a background `sudo -v` keeps
# sudo's ticket fresh until the script that asked ends, so that a later step (the images, after
# a build of many minutes) does not ask again. With no terminal to ask on and no ticket (nor
# NOPASSWD), it stops at once and says how to go on.

as_root() {
  local why=$1
  shift
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
    return
  fi
  command -v sudo >/dev/null || {
    echo "error: root is needed to $why, and sudo is not installed: run this as root" >&2
    return 1
  }
  if ! sudo -n true 2>/dev/null; then
    # sudo asks on the terminal, not on standard input; without one it cannot ask at all.
    if ! { : </dev/tty; } 2>/dev/null; then
      echo "error: root is needed to $why, and sudo needs your password, but there is no terminal to ask on." >&2
      echo "  Run it from a terminal (sudo asks there), or as root." >&2
      return 1
    fi
    echo "==> root is needed to $why: sudo asks for your password (once for this set-up)" >&2
    sudo -p "[sudo] password for %u, to $why: " -v || {
      echo "error: sudo refused, and root is needed to $why (is $(id -un) in the sudo group? \`sudo -l\` says)" >&2
      return 1
    }
    root_keepalive
  fi
  sudo "$@"
}

# Keeps sudo's ticket fresh while the calling script runs (sudo forgets it after 15 minutes by
# default): the refresher ends within a minute of the script ($$, also in a subshell).
root_keepalive() {
  [ -z "${BELLJAR_SUDO_KEEPALIVE:-}" ] || return 0
  local script=$$
  (while kill -0 "$script" 2>/dev/null && sudo -n -v 2>/dev/null; do sleep 60; done) </dev/null >/dev/null 2>&1 &
  BELLJAR_SUDO_KEEPALIVE=$!
  export BELLJAR_SUDO_KEEPALIVE
}
