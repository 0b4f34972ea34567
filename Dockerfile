# Pingo server image: `docker build -t pingo .` then
#   docker run -p 8642:8642 -v pingo-home:/var/lib/pingo \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined pingo
# The security options let the sandbox of command-line actions (bubblewrap, shipped in
# the locked environment) create user namespaces; without them PINGO_SANDBOX=auto (the
# default) refuses non-admin users' command-line actions and /readyz says "unavailable"
# (README, docs/security.md). PINGO_ADMIN_TOKEN, if given, is consumed at first start.
# Configured by the PINGO_* variables of the README (PINGO_STORE_URL=mongodb://… for a
# shared store, PINGO_DATA_ROOT=hdfs://… or s3://… for datasets, PINGO_PUBLIC_URL for
# the URL the cluster calls back).

FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/pingo
RUN pip install "uv==0.13.8"

WORKDIR /src
# Dependencies first, exactly as locked, so that code changes reuse this layer.
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project --python /usr/local/bin/python3.11
# Then Pingo itself, as a wheel (not editable): the schemas ship inside the package.
COPY README.md ./
COPY schemas ./schemas
COPY pingo ./pingo
RUN uv sync --frozen --no-dev --no-editable --python /usr/local/bin/python3.11


FROM python:3.11-slim

RUN groupadd --system --gid 10001 pingo \
 && useradd --system --uid 10001 --gid pingo --home-dir /var/lib/pingo --create-home pingo

COPY --from=build /opt/pingo /opt/pingo
# The examples' commands use paths relative to the server's working directory.
WORKDIR /srv/pingo
COPY examples ./examples

ENV PATH=/opt/pingo/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PINGO_HOME=/var/lib/pingo \
    PINGO_HOST=0.0.0.0 \
    PINGO_PORT=8642

USER pingo
VOLUME ["/var/lib/pingo"]
EXPOSE 8642

# python:slim has no curl; the interpreter is there anyway.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PINGO_PORT', '8642'), timeout=2)"]

# `pingo server` stops gracefully on SIGTERM (docker stop): it stops claiming, lets running
# local actions finish or hands them back through their leases, and closes the store.
STOPSIGNAL SIGTERM
CMD ["pingo", "server"]
