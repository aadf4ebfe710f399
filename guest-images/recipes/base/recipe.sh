# shellcheck shell=bash
# base: Debian 13 "trixie" (debootstrap minbase) with the tools every sandbox
# expects. The other images start from this tree.
PACKAGES=(
    bash coreutils tar gzip xz-utils bzip2 unzip
    git curl openssl ca-certificates sudo
    build-essential pkg-config
    procps iproute2 iputils-ping less
)
VERIFY='bash --version | head -n1 && git --version && curl --version | head -n1 && gcc --version | head -n1 && sudo --version | head -n1'
