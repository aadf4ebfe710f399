#!/usr/bin/env bash
# Renders the app and tray icons that Tauri and the web UI need from the two SVGs drawn for
# Belljar (needs rsvg-convert from librsvg2-bin, and node for the ICO container).
set -euo pipefail
cd "$(dirname "$0")"
r() { rsvg-convert -w "$2" -h "$2" "$1" -o "$3"; }
r belljar.svg 32 32x32.png
r belljar.svg 128 128x128.png
r belljar.svg 256 128x128@2x.png
r belljar.svg 512 icon.png
r belljar.svg 16 16x16.png
r belljar.svg 48 48x48.png
r belljar.svg 64 64x64.png
r tray.svg 32 tray.png
r tray.svg 64 tray@2x.png
node make-ico.mjs icon.ico 16x16.png 32x32.png 48x48.png 64x64.png 128x128@2x.png
rm -f 16x16.png 48x48.png 64x64.png
