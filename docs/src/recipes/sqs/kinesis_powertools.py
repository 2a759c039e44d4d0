"""A Kinesis consumer on Powertools' batch utility, a lock per partition key
(FLIGHTLOCK_GATE=off, ReportBatchItemFailures). The function's handler: <this module>.handler.
flightlock comes from the layer; aws-lambda-powertools from the function's package."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response

from flightlock.powertools import locked


class AfterAFailedRecord(Exception):
    """A record after a failed one of its batch: not run, reported failed with it."""


def process(record, token):
    """Your work on one record, under the lock of its partition key: the whole Kinesis record
    (`record.kinesis.partition_key`, `record.kinesis.sequence_number`,
    `record.kinesis.data_as_json()`) and the fencing token, to pass to what you write so a
    writer whose lock was lost is refused there."""


def consumer(work, wait_ms=200):
    # A batch whose first record is busy is answered as all failed, not as a function error.
    processor = BatchProcessor(event_type=EventType.KinesisDataStreams, raise_on_entire_batch_failure=False)
    locked_work = locked(wait_ms=wait_ms)(work)  # key: record.kinesis.partition_key

    def record_handler(record, lambda_context):
        # Lambda retries from the lowest failed sequence number, processed or not: after a
        # failure (a busy key, or work that raised), run nothing more of this batch.
        if processor.fail_messages:
            raise AfterAFailedRecord(record.kinesis.sequence_number)
        return locked_work(record, lambda_context)

    def handler(event, context):
        return process_partial_response(event, record_handler, processor, context)

    return handler


handler = consumer(process)
