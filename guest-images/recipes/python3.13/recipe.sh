# shellcheck shell=bash
# python3.13: base plus trixie's Python 3.13 with pip and venv.
PARENT=base
PACKAGES=(python3.13 python3 python3-pip python3-venv)
VERIFY='python3.13 --version && python3 -m pip --version && python3 -m venv /tmp/venv-check && rm -rf /tmp/venv-check'
