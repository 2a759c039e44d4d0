"""An SQS FIFO consumer on Powertools' batch utility, a lock per message group
(FLIGHTLOCK_GATE=off, ReportBatchItemFailures). The function's handler: <this module>.handler.
flightlock comes from the layer; aws-lambda-powertools from the function's package."""

from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response

from flightlock.powertools import locked


def process(record, token):
    """Your work on one record, under the lock of its message group: the whole SQS record
    (`record.message_id` is SQS's idempotency key, `record.json_body` the message) and the
    fencing token, to pass to what you write so a writer whose lock was lost is refused there."""


def consumer(work, skip_group_on_error=True):
    processor = SqsFifoPartialProcessor(skip_group_on_error=skip_group_on_error)
    record_handler = locked(work)  # key: record.attributes.message_group_id

    def handler(event, context):
        return process_partial_response(event, record_handler, processor, context)

    return handler


handler = consumer(process)
