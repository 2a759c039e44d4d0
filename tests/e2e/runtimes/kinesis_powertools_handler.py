"""The SQS recipe's Kinesis consumer on Powertools for AWS Lambda
(docs/src/recipes/sqs/kinesis_powertools.py, copied beside this file) for the end-to-end tests
(tests/e2e/tests/e2e/powertools.rs), run by awslambdaric: `flightlock` comes from the layer's
/opt/python, aws_lambda_powertools from the function's own dependencies (PYTHONPATH).

Each record's data is {"shard": S, "seq": N, "sleepMs": M}, N counting the records of shard S
from 0. Under the partition key's lock the record handler sleeps M ms and writes one JSON line
(its interval, key, shard, seq and fencing token) to DEMO_RECORD_FILE. E2E_WAIT_MS is the
consumer's wait for a busy key.
"""

import json
import os
import time

import flightlock
from kinesis_powertools import consumer


def _write(line):
    line |= {"env": os.environ.get("DEMO_ENV_NAME", ""), "client": flightlock.__file__}
    # One write of a short line with O_APPEND: lines of concurrent writers never interleave.
    fd = os.open(os.environ["DEMO_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def work(record, token):
    data = record.kinesis.data_as_json()
    start = time.time_ns()
    time.sleep(data["sleepMs"] / 1000)
    _write(
        {
            "what": "record",
            "sequenceNumber": record.kinesis.sequence_number,
            "key": record.kinesis.partition_key,
            "shard": data["shard"],
            "seq": data["seq"],
            "token": token,
            "start": start,
            "end": time.time_ns(),
        }
    )


_consume = consumer(work, wait_ms=int(os.environ.get("E2E_WAIT_MS", "0")))


def handler(event, context):
    if not event.get("Records"):
        # The tests' warm-up (Lambda never sends an empty batch; Powertools refuses one).
        return {"batchItemFailures": []}
    return _consume(event, context)
