# trainjob-pipeline images. Targets:
#   runtime: the services, `docker run IMAGE watcher|planner|applier|webhook` (build it with --target runtime:
#            the last stage, and so the default, is init).
#   init:    the compose stack's one-shot steps (python -m tjpipe.local.compose): the runtime image plus the
#            module files they read (the Trainer, JobSet and PodGroup CRDs, Trainer's runtimes, JobSet's
#            webhooks) and deploy/'s identity objects, exported while the image builds by a stage that carries
#            Go (the manifests), so `compose up` needs no
#            network access for them. Offline, scripts/compose-images.sh builds the same image from the
#            modules this machine has.
# The runtime stage comes before the Go stage: the classic builder runs every stage up to its target, and the
# runtime image must build where no Go image can be pulled.
ARG PYTHON_IMAGE=python:3.11-slim
ARG GO_IMAGE=golang:1.26

# ---------------------------------------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The runtime dependencies, exactly as locked: every file's sha256 is checked, and a dependency missing
# from the lock fails the build. All but one ship binary wheels for CPython 3.11, so nothing is compiled;
# nkeys (pure Python) is published only as a source archive, which is checked the same way and packed.
COPY requirements.lock ./
RUN python -m venv /opt/tjpipe \
 && /opt/tjpipe/bin/pip install --require-hashes --only-binary=:all: --no-binary=nkeys -r requirements.lock
# The project itself: its wheel (the import roots tjpipe, contracts, plumbing, watcher, planner, applier,
# history_server and status_server, each a top-level folder), installed without resolving anything more.
COPY pyproject.toml README.md LICENSE ./
COPY contracts ./contracts
COPY plumbing ./plumbing
COPY watcher ./watcher
COPY planner ./planner
COPY applier ./applier
COPY tjpipe ./tjpipe
COPY history_server ./history_server
COPY status_server ./status_server
RUN /opt/tjpipe/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/tjpipe/bin/pip install --no-deps /wheels/*.whl \
 && /opt/tjpipe/bin/pip check \
 && /opt/tjpipe/bin/pip uninstall -y pip setuptools

# -------------------------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/tjpipe/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/tjpipe /opt/tjpipe
USER 10001:10001
EXPOSE 9090
ENTRYPOINT ["tjpipe"]
CMD ["--help"]

# ----------------------------------------------------------------------------------------------- init
FROM ${GO_IMAGE} AS go

FROM ${PYTHON_IMAGE} AS manifests
COPY --from=go /usr/local/go /usr/local/go
COPY --from=build /opt/tjpipe /opt/tjpipe
ENV PATH=/opt/tjpipe/bin:/usr/local/go/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 GOTOOLCHAIN=local CGO_ENABLED=0 GOPATH=/tmp/go GOCACHE=/tmp/go-build \
    TJPIPE_CACHE_DIR=/tmp/tjpipe-cache HOME=/tmp
RUN python -m tjpipe.local.compose export-manifests /opt/tjpipe-manifests && rm -rf /tmp/*

FROM runtime AS init
COPY --from=manifests /opt/tjpipe-manifests /opt/tjpipe-manifests
# The pipeline's ServiceAccounts, roles and admission policies, which setup applies (tjpipe.local.identities).
COPY deploy/base /opt/tjpipe-deploy/base
COPY deploy/components /opt/tjpipe-deploy/components
ENV TJPIPE_MANIFESTS_DIR=/opt/tjpipe-manifests TJPIPE_DEPLOY_DIR=/opt/tjpipe-deploy
