"""``tjpipe history-server``: the event history in a browser and over a JSON API, for people who may not hold
the ``reader`` NATS identity.

The ``reader`` identity sees every namespace, so the CLI's history tools are for operators. This server holds
that identity on their behalf and hands each caller only what the cluster itself would let the caller read:
it asks the API server who a bearer token belongs to (TokenReview) and whether that user may list or get
TrainJobs in the namespace asked about (SubjectAccessReview), the way Argo Workflows' archive and Tekton
Results decide. It reads the streams with direct gets only, so it can neither write to the bus nor disturb
a consumer, and it never writes to the cluster.
"""
