"""``python -m bench``: the pipeline's performance report, measured side by side in one run.

The package starts its own local stack (or uses the servers NATS_URL and KUBECONFIG name), runs each
scenario against it and writes ``report.md`` and ``report.json``. Every figure stands next to its target
with "met" or "not met"; figures without a target are reported for reference only.

Modules:

* ``stats``: pure helpers (percentiles, targets, apiserver metric parsing, Markdown rendering);
* ``workload``: TrainJob bodies, runtimes and the events the planner sees, with no I/O;
* ``micro``: the planner microbenchmark (CPU only, no servers);
* ``cluster``: the I/O the scenarios share (counting API client, metrics scrapes, waiting for quiet);
* ``scenarios``: apiserver floor, end to end, write amplification and memory;
* ``reference``: Trainer v2.3.0's own controller and the pipeline side by side, measured the same way;
* ``runner``: the order of things, and the report files.
"""
