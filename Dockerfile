# syntax=docker/dockerfile:1.7
# One image for the node agent (dsagent), dsctl (init-containers and sidecars), the
# scheduler extender (python -m scheduler_plugin) and the admission webhook
# (python -m dsagent.webhook). Build: docker build -t ghcr.io/dsplatform/dsplatform:0.1.0 .
ARG PYTHON_VERSION=3.12

# -- build: install the distribution and its dependencies into a self-contained venv
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/dsplatform
ENV PATH=/opt/dsplatform/bin:$PATH
WORKDIR /src
# The versions the project tests with: requirements-test.txt (the lock) constrains the install.
COPY pyproject.toml setup.py MANIFEST.in README.md requirements-test.txt ./
COPY dsplatform ./dsplatform
COPY dsagent ./dsagent
COPY scheduler_plugin ./scheduler_plugin
COPY scheduling ./scheduling
COPY gpu_topology ./gpu_topology
# The native digest, pack and unpack loops (C, docs/design-native.md): the package's own build
# (setup.py) compiles them against this Python's headers, required here (a failed compile
# fails the image); the runtime stage carries no compiler. The build fails if they do not
# load. --build-arg NATIVE=0: the pure-Python loops.
ARG NATIVE=1
COPY native ./native
RUN if [ "${NATIVE}" = 1 ]; then \
        apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
# [agent]: every storage backend (s3://, gs://, az:// and abfs://, http://), so the chart's
# s3:// examples work in the default image, and the kubelet plugins (grpcio, protobuf);
# --build-arg EXTRAS=http,kubelet for a slimmer one. uv installs, outside the venv it fills.
ARG EXTRAS=agent
ARG UV_VERSION=0.13.9
RUN pip install "uv==${UV_VERSION}" \
    && if [ "${NATIVE}" = 1 ]; then build_native=require; else build_native=0; fi \
    && DSPLATFORM_BUILD_NATIVE="${build_native}" uv pip install --python /opt/dsplatform/bin/python \
       --constraint requirements-test.txt --build-constraint requirements-test.txt ".[${EXTRAS}]" \
    && if [ "${NATIVE}" = 1 ]; then /opt/dsplatform/bin/python -I -c \
       'from dsagent.format import native; assert native.AVAILABLE, "the native loops did not load"'; fi \
    && python -m compileall -q /opt/dsplatform

# -- runtime: slim, no compilers, no pip cache, a fixed non-root user
FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="dsplatform" \
      org.opencontainers.image.description="Dataset caching and data-affinity scheduling for Kubernetes GPU training clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532: the uid/gid the chart runs every dsplatform process as. The agent's host
# directories are handed to it by the DaemonSet's root init-container (chown of two
# directories); everything else never needs root.
# iproute2: `ip -j address` gives GPU topology discovery the NICs' addresses (RoCE classes).
RUN apt-get update && apt-get install -y --no-install-recommends iproute2 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 65532 dsagent \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin dsagent
COPY --from=build /opt/dsplatform /opt/dsplatform
ENV PATH=/opt/dsplatform/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DSAGENT_ROOT=/var/lib/dsagent \
    DSAGENT_SOCKET=/run/dsagent/dsagent.sock
# nvidia-smi is not baked in: the NVIDIA container runtime mounts it when the agent's
# pod sets NVIDIA_DRIVER_CAPABILITIES=utility (the chart does); sysfs discovery needs none.
USER 65532:65532
WORKDIR /
# The chart sets each component's command; alone, the image runs the agent.
CMD ["dsagent", "serve"]
