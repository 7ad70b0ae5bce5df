# A Python-capable session image for sandbox-docker, for engines that can pull.
#   docker build -t jupyter-tai-sandbox/python:3.12 -f python.Dockerfile .
#   c.DockerSandbox.image = "jupyter-tai-sandbox/python:3.12"
# The provider needs sh, setsid, mkfifo, mv, rm, cat, kill, readlink, ls and a
# fractional sleep (coreutils + util-linux in the slim base), /proc, a writable
# /tmp and /workspace. Commands run as the unprivileged user "sandbox".
FROM python:3.12-slim

RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends coreutils util-linux procps ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    for tool in sh setsid mkfifo mv rm cat kill readlink ls sleep; do command -v "$tool"; done; \
    sleep 0.01; \
    groupadd --gid 1000 sandbox; \
    useradd --uid 1000 --gid 1000 --home-dir /workspace --no-create-home --shell /bin/sh sandbox; \
    mkdir -p /workspace; \
    chown sandbox:sandbox /workspace; \
    chmod 1777 /tmp

ENV HOME=/workspace PYTHONUNBUFFERED=1
WORKDIR /workspace
USER 1000:1000
CMD ["sh"]
