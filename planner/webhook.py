"""``tjpipe webhook``: the admission webhook's thin shell, serving ``planner.admission`` over HTTPS.

It holds no state and talks to no bus, so any number of replicas can answer the API server; each review
costs one GET of the runtime the TrainJob names (and, only when ``runtimePatches`` change around a
suspension, one GET of its JobSet), read live as Trainer's webhook reads them. A read that fails for
any reason other than "not found" is answered with HTTP 500, so the API server applies the
configuration's ``failurePolicy`` (``Fail``): nothing is admitted unchecked.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from aiohttp import web
from prometheus_client import Counter

from contracts.resources import JOBSET, PRIORITY_CLASS
from planner import admission
from planner.core import FRAMEWORK
from planner.settings import WebhookSettings
from plumbing.kube import KubeApiError, KubeClient, KubeConfig
from plumbing.observability import REGISTRY
from plumbing.runner import started
from plumbing.tls_serving import TlsServing

log = logging.getLogger(__name__)

REVIEWS = Counter(
    "tjpipe_admission_reviews_total",
    "Admission reviews answered, by kind and outcome (allowed, denied, malformed, error)",
    ["kind", "outcome"],
    registry=REGISTRY,
)


class _Meta(msgspec.Struct):
    name: str = ""


class _Named(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_name_decoder = msgspec.json.Decoder(_Named)


class Webhook:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post(admission.PATH_TRAINJOB, self._trainjob)
        app.router.add_post(admission.PATH_TRAINING_RUNTIME, self._runtime)
        app.router.add_post(admission.PATH_CLUSTER_TRAINING_RUNTIME, self._runtime)
        return app

    @staticmethod
    async def _read_review(request: web.Request) -> admission.AdmissionRequest | web.Response:
        """The review in the body, or the HTTP 400 that answers a body that is none."""
        try:
            return admission.parse_review(await request.read())
        except admission.MalformedReview as exc:
            REVIEWS.labels("unknown", "malformed").inc()
            return web.Response(status=400, text=f"{exc}\n")

    async def _runtime(self, request: web.Request) -> web.Response:
        review = await self._read_review(request)
        if isinstance(review, web.Response):
            return review
        return self._answer(review, admission.review_runtime(review))

    async def _trainjob(self, request: web.Request) -> web.Response:
        review = await self._read_review(request)
        if isinstance(review, web.Response):
            return review
        try:
            fetched = await self._fetch(review)
        except KubeApiError as exc:
            REVIEWS.labels(review.kind.kind, "error").inc()
            log.warning("cannot read what review %s needs: %s", review.uid, exc)
            return web.Response(status=500, text=f"cannot read from the API server: {exc}\n")
        return self._answer(review, admission.review_trainjob(review, fetched, FRAMEWORK))

    async def _fetch(self, review: admission.AdmissionRequest) -> admission.Fetched:
        if review.operation not in (admission.CREATE, admission.UPDATE):
            return admission.Fetched()
        try:
            new, old = admission.decode_trainjobs(review)
        except Exception:
            return admission.Fetched()  # the decision reports it
        lookup = admission.runtime_lookup(new, review.namespace)
        if lookup.unsupported:
            return admission.Fetched()
        runtime = await self.kube.get(lookup.resource, namespace=lookup.namespace, name=lookup.name)
        if runtime is None:
            return admission.Fetched()
        jobset = None
        if admission.needs_jobset(new, old):
            jobset = await self.kube.get(JOBSET, namespace=review.namespace, name=review.name)
        priority_classes = None
        if admission.needs_priority_classes(runtime):
            priority_classes = await self._priority_class_names()
        return admission.Fetched(runtime=runtime, jobset=jobset, priority_classes=priority_classes)

    async def _priority_class_names(self) -> frozenset[str]:
        names: set[str] = set()
        async for page in self.kube.list_pages(PRIORITY_CLASS, metadata_only=True):
            names.update(_name_decoder.decode(item).metadata.name for item in page.items)
        return frozenset(names)

    def _answer(self, review: admission.AdmissionRequest, verdict: admission.Verdict) -> web.Response:
        outcome = "allowed" if verdict.allowed else "denied"
        REVIEWS.labels(review.kind.kind, outcome).inc()
        if not verdict.allowed:
            log.info(
                "denied %s %s %s/%s: %s",
                review.operation,
                review.kind.kind,
                review.namespace,
                review.name,
                verdict.message,
            )
        return web.Response(body=admission.response_body(review.uid, verdict), content_type="application/json")


async def run_webhook(settings: WebhookSettings, stop: asyncio.Event) -> None:
    tls = TlsServing(settings.tls_cert, settings.tls_key)
    async with started(
        "tjpipe-webhook",
        settings,
        kube=lambda: KubeClient(KubeConfig.load(settings.kubeconfig, context=settings.kube_context)),
    ) as service:
        await tls.serve(
            Webhook(service.kube_client()).app(),
            host=settings.host,
            port=settings.port,
            health=service.health,
            stop=stop,
            cert_check_seconds=settings.cert_check_seconds,
            serving="serving admission reviews",
        )
