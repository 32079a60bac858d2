"""Trainer's TrainJob status server (``tjpipe status-server``): ``core`` decides, ``auth`` checks the caller
against the live cluster, ``server`` serves, records and writes."""
