# The one image the daemons run from (the example tenants have their own, slim one:
# clients/python/Dockerfile):
#   baton agent | baton deviceplugin | baton extender
# Build: docker build -t baton:dev .   (BATON_EXTRAS="" leaves out the CUDA/NVML bindings)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG BATON_EXTRAS=cuda
WORKDIR /src
COPY pyproject.toml README.md ./
COPY baton ./baton
COPY agent ./agent
COPY deviceplugin ./deviceplugin
COPY dra ./dra
COPY nodegpu ./nodegpu
COPY extender ./extender
COPY coordinator ./coordinator
COPY commands ./commands
RUN python -m venv /opt/baton \
    && /opt/baton/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/baton/bin/pip install --no-cache-dir ".${BATON_EXTRAS:+[${BATON_EXTRAS}]}"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/baton /opt/baton
ENV PATH=/opt/baton/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Unprivileged by default; the node DaemonSet runs its containers as root explicitly because the
# kubelet's device-plugin directory and the agent socket directory are root-owned host paths.
USER 65532:65532
ENTRYPOINT ["baton"]
CMD ["--help"]
