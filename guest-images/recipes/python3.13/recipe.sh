# shellcheck shell=bash
# python3.13: base plus trixie's Python 3.13 with pip and venv.
PARENT=base
PACKAGES=(python3.13 python3 python3-pip python3-venv)
# `pip install x` works as on the cloud products, instead of Debian's PEP 668 refusal
# ("externally-managed-environment"): as the sandbox's user it installs into ~/.local (the
# user site), as root into /usr/local; apt's own packages stay where they are.
SETUP='printf "[global]\nbreak-system-packages = true\n" > /etc/pip.conf'
VERIFY='python3.13 --version && python3 -m pip --version && python3 -m pip config list | grep -q break-system-packages && python3 -m venv /tmp/venv-check && rm -rf /tmp/venv-check'
