"""flightlock.powertools with the real Powertools for AWS Lambda (aws-lambda-powertools 3.x from
PyPI) against the stand-in lock API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    SqsFifoPartialProcessor,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from conftest import Context
from standin import StandIn

from flightlock import LockBusy, Locks
from flightlock.powertools import RecordKeyError, locked, process_locked_batch

Api = tuple[StandIn, dict[str, str]]


def sqs(messages: list[tuple[str, str | None]]) -> dict[str, Any]:
    """An SQS event of (messageId, MessageGroupId or None for a standard queue) messages."""
    records = []
    for mid, group in messages:
        attributes = {"ApproximateReceiveCount": "1", "SentTimestamp": "1764230400000"}
        if group is not None:
            attributes |= {"MessageGroupId": group, "MessageDeduplicationId": mid, "SequenceNumber": "1"}
        records.append(
            {
                "messageId": mid,
                "receiptHandle": "AQEB",
                "body": json.dumps({"id": mid}),
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q.fifo",
                "awsRegion": "us-east-1",
            }
        )
    return {"Records": records}


def failed(response: Any) -> list[str]:
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


class Seen:
    """A record handler that notes what it got and checks the record's lock is held meanwhile."""

    def __init__(self, state: StandIn, key: Any = None) -> None:
        self.state, self.key, self.calls = state, key, []

    def __call__(self, record: SQSRecord, token: int) -> None:
        key = self.key(record) if self.key else record.attributes.message_group_id
        assert self.state.held_by(key) == ["req-1"], f"{key} not held while its record runs"
        self.calls.append((record.message_id, token))


def hold(state: StandIn, environ: dict[str, str], key: str) -> None:
    state.start("other")
    assert Locks(Context("other"), environ=environ).acquire(key, 0) is not None


def test_each_record_runs_under_its_group_lock_and_gets_the_whole_record(api: Api, context: Context) -> None:
    state, environ = api
    seen = Seen(state)
    handler = locked(environ=environ)(seen)
    event = sqs([("m1", "g1"), ("m2", "g2"), ("m3", "g1")])
    response = process_partial_response(event, handler, SqsFifoPartialProcessor(), context)
    assert failed(response) == []
    assert seen.calls == [("m1", 1), ("m2", 1), ("m3", 2)]
    assert state.held_by("g1") == [] and state.held_by("g2") == []


def test_a_busy_group_fails_the_rest_of_the_batch_with_the_fifo_processor(api: Api, context: Context) -> None:
    state, environ = api
    hold(state, environ, "g2")
    seen = Seen(state)
    event = sqs([("m1", "g1"), ("m2", "g2"), ("m3", "g1"), ("m4", "g3")])
    processor = SqsFifoPartialProcessor()
    response = process_partial_response(event, locked(environ=environ)(seen), processor, context)
    assert failed(response) == ["m2", "m3", "m4"]
    assert [m for m, _ in seen.calls] == ["m1"]
    assert isinstance(processor.exceptions[0][1], LockBusy)


def test_skip_group_on_error_fails_only_the_busy_group(api: Api, context: Context) -> None:
    state, environ = api
    hold(state, environ, "g2")
    seen = Seen(state)
    event = sqs([("m1", "g2"), ("m2", "g1"), ("m3", "g2"), ("m4", "g3")])
    processor = SqsFifoPartialProcessor(skip_group_on_error=True)
    response = process_partial_response(event, locked(environ=environ)(seen), processor, context)
    assert failed(response) == ["m1", "m3"]
    assert [m for m, _ in seen.calls] == ["m2", "m4"]


def test_a_failing_record_handler_releases_and_fails_its_record(api: Api, context: Context) -> None:
    state, environ = api

    @locked(environ=environ)
    def boom(record: SQSRecord, token: int) -> None:
        raise RuntimeError("the work failed")

    event = sqs([("m1", "g1"), ("m2", "g2")])
    processor = SqsFifoPartialProcessor(skip_group_on_error=True)
    processor.raise_on_entire_batch_failure = False
    assert failed(process_partial_response(event, boom, processor, context)) == ["m1", "m2"]
    assert state.held_by("g1") == [] and state.held_by("g2") == []


def test_a_key_function_keys_a_standard_queue(api: Api, context: Context) -> None:
    state, environ = api

    def entity(record: SQSRecord) -> str:
        return str(json.loads(record.body)["id"]).upper()

    seen = Seen(state, key=lambda r: "orders/" + entity(r))
    handler = locked(key=entity, prefix="orders/", environ=environ)(seen)
    response = process_partial_response(sqs([("m1", None)]), handler, BatchProcessor(EventType.SQS), context)
    assert failed(response) == [] and seen.calls == [("m1", 1)]


def test_a_record_without_a_group_id_fails_naming_the_fix(api: Api, context: Context) -> None:
    state, environ = api
    seen = Seen(state)
    processor = BatchProcessor(EventType.SQS)
    event = sqs([("m1", None), ("m2", "g1")])
    response = process_partial_response(event, locked(environ=environ)(seen), processor, context)
    assert failed(response) == ["m1"]
    error = processor.exceptions[0][1]
    assert isinstance(error, RecordKeyError)
    assert "m1 has no attributes.MessageGroupId" in str(error) and "pass key=" in str(error)
    assert [m for m, _ in seen.calls] == ["m2"]


def test_a_key_function_that_raises_fails_the_record_naming_it(api: Api, context: Context) -> None:
    state, environ = api

    def order(record: SQSRecord) -> str:
        return str(json.loads(record.body)["order"])

    seen = Seen(state)
    processor = SqsFifoPartialProcessor(skip_group_on_error=True)
    processor.raise_on_entire_batch_failure = False
    response = process_partial_response(
        sqs([("m1", "g1")]), locked(key=order, environ=environ)(seen), processor, context
    )
    assert failed(response) == ["m1"] and seen.calls == []
    error = processor.exceptions[0][1]
    assert isinstance(error, RecordKeyError)
    assert "'order' raised on record m1" in str(error) and "KeyError" in str(error)


@pytest.mark.parametrize(
    ("drop", "fix"),
    [
        ("_FLIGHTLOCK_RUNTIME_PID", "AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper"),
        ("AWS_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
        ("AWS_LAMBDA_RUNTIME_API", "AWS_LAMBDA_RUNTIME_API"),
    ],
)
def test_no_lock_api_processes_nothing_and_says_why(api: Api, context: Context, drop: str, fix: str) -> None:
    state, environ = api
    seen = Seen(state)
    environ = {k: v for k, v in environ.items() if k != drop}
    with pytest.raises(BatchProcessingError) as e:
        process_partial_response(
            sqs([("m1", "g1"), ("m2", "g2")]),
            locked(environ=environ)(seen),
            SqsFifoPartialProcessor(skip_group_on_error=True),
            context,
        )
    assert seen.calls == []
    assert fix in str(e.value)


def test_without_the_context_nothing_is_processed(api: Api, context: Context) -> None:
    state, environ = api
    seen = Seen(state)
    processor = BatchProcessor(EventType.SQS, raise_on_entire_batch_failure=False)
    response = process_partial_response(sqs([("m1", "g1")]), locked(environ=environ)(seen), processor)
    assert failed(response) == ["m1"] and seen.calls == []
    assert "pass the handler's context" in str(processor.exceptions[0][1])


def test_kinesis_records_lock_their_partition_key(api: Api, context: Context) -> None:
    state, environ = api
    keys: list[tuple[str, int]] = []

    @locked(environ=environ)
    def record_handler(record: Any, token: int) -> None:
        assert state.held_by(record.kinesis.partition_key) == ["req-1"]
        keys.append((record.kinesis.partition_key, token))

    def kinesis(seq: str, partition: str) -> dict[str, Any]:
        return {
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": partition,
                "sequenceNumber": seq,
                "data": "e30=",
                "approximateArrivalTimestamp": 1.0,
            },
            "eventSource": "aws:kinesis",
            "eventID": f"shard-0:{seq}",
            "eventVersion": "1.0",
            "eventName": "aws:kinesis:record",
            "awsRegion": "us-east-1",
            "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/s",
        }

    event = {"Records": [kinesis("1", "acct-1"), kinesis("2", "acct-2"), kinesis("3", "acct-1")]}
    response = process_partial_response(
        event, record_handler, BatchProcessor(EventType.KinesisDataStreams), context
    )
    assert failed(response) == []
    assert keys == [("acct-1", 1), ("acct-2", 1), ("acct-1", 2)]


def test_dynamodb_stream_records_need_a_key_function(api: Api, context: Context) -> None:
    _state, environ = api
    calls: list[int] = []
    event = {
        "Records": [
            {
                "eventID": "e1",
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "awsRegion": "us-east-1",
                "dynamodb": {
                    "Keys": {"pk": {"S": "a"}},
                    "SequenceNumber": "1",
                    "StreamViewType": "KEYS_ONLY",
                },
            }
        ]
    }
    processor = BatchProcessor(EventType.DynamoDBStreams, raise_on_entire_batch_failure=False)
    response = process_partial_response(
        event, locked(environ=environ)(lambda r, t: calls.append(t)), processor, context
    )
    assert failed(response) == ["1"] and calls == []
    assert "eventSource 'aws:dynamodb'" in str(processor.exceptions[0][1])


def test_process_locked_batch_defaults_to_the_fifo_processor_skipping_the_group(
    api: Api, context: Context
) -> None:
    state, environ = api
    hold(state, environ, "g1")
    got: list[str] = []
    response = process_locked_batch(
        sqs([("m1", "g1"), ("m2", "g2"), ("m3", "g1")]),
        context,
        lambda record, token: got.append(record.message_id),
        environ=environ,
    )
    assert failed(response) == ["m1", "m3"] and got == ["m2"]
