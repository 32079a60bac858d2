"""Project-owned local infrastructure: nats-server, etcd and kube-apiserver on loopback, plus the CRDs.

Why it lives in the product and not only in the tests: `tjpipe up` and the test suite must run against
the same servers started the same way, so a green test run means the developer stack works too. The
submodules are imported explicitly (`tjpipe.local.kubeapi`, ...) so that importing this package costs
nothing and does no I/O.
"""
