# The Python session image for sandbox-docker, for engines that can pull: the same image
# `jupyter tai-sandbox build-image --python [--pip PKG ...]` builds offline (debootstrap + docker import).
#   docker build -t jupyter-tai-sandbox/python:latest -f python.Dockerfile .
#   docker build -t jupyter-tai-sandbox/python:latest --build-arg PIP="pandas pyarrow" -f python.Dockerfile .
# A docker server with no DockerSandbox.image set uses jupyter-tai-sandbox/python:latest when the engine
# has it. What it holds: Debian's python3 and python3-ipykernel (sandboxed kernels), procps, the
# provider's wrapper tools (sh, setsid, mkfifo, mv, rm, cat, kill, readlink, ls, a fractional sleep),
# a writable /tmp and /workspace; with PIP, those packages from wheels. The user is the image's root,
# as build-image makes it: the provider drops every capability and sets no-new-privileges (set
# DockerSandbox.user to run as another uid).
FROM debian:bookworm

ARG PIP=""
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends python3 procps python3-ipykernel; \
    if [ -n "$PIP" ]; then \
        apt-get install -y --no-install-recommends python3-pip; \
        pip3 install --no-cache-dir --break-system-packages --only-binary=:all: $PIP; \
        apt-get purge -y python3-pip; apt-get autoremove -y; \
    fi; \
    apt-get clean; rm -rf /var/lib/apt/lists/*; \
    for tool in sh setsid mkfifo mv rm cat kill readlink ls sleep; do command -v "$tool"; done; \
    sleep 0.01; \
    mkdir -p /workspace; \
    chmod 777 /workspace; \
    chmod 1777 /tmp

ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /workspace
CMD ["sh"]
