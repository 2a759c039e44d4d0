"""A flightlock lock per record for Powertools for AWS Lambda's batch utility.

    from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
    from flightlock.powertools import locked

    processor = SqsFifoPartialProcessor(skip_group_on_error=True)

    @locked                                   # key: the record's MessageGroupId
    def record_handler(record, token):        # the whole record, and the lock's fencing token
        ...

    def handler(event, context):
        return process_partial_response(event, record_handler, processor, context)

Before the handler runs, the record's key is locked for this invocation (wait 0 by default);
after it, released. A busy key raises LockBusy, so Powertools reports the record as a batch item
failure and SQS delivers it again; the processor's own rules then fail what follows it
(SqsFifoPartialProcessor: the rest of the batch, or with skip_group_on_error the rest of that
group). The key is `key(record)` when given, else the SQS record's `attributes.MessageGroupId`
or the Kinesis record's `kinesis.partitionKey`; any other record needs `key=`.

This module imports aws_lambda_powertools only in `process_locked_batch`; `locked` works with
any processor that passes `lambda_context` to its record handler, as Powertools' do when
`process_partial_response` gets the context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from flightlock._locks import NOT_CONFIGURED, LambdaContext, LockApiUnavailable, Locks

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch import BasePartialBatchProcessor
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

R = TypeVar("R")
T = TypeVar("T")

__all__ = ["LockedRecordHandler", "RecordKeyError", "default_key", "locked", "process_locked_batch"]


class RecordKeyError(ValueError):
    """A record's lock key could not be had: the message names the record and what to pass."""


def _raw(record: object) -> Mapping[str, Any] | None:
    """The record as Lambda delivered it: Powertools' data classes keep it as `raw_event`."""
    raw = getattr(record, "raw_event", record)
    return raw if isinstance(raw, Mapping) else None


def _record_id(raw: Mapping[str, Any]) -> str:
    kinesis = raw.get("kinesis")
    sequence = kinesis.get("sequenceNumber") if isinstance(kinesis, Mapping) else None
    return str(raw.get("messageId") or raw.get("eventID") or sequence or "(no id)")


def default_key(record: object) -> str:
    """The lock key of an SQS FIFO record (its MessageGroupId) or a Kinesis record (its partition
    key). Anything else raises RecordKeyError saying to pass `key=`."""
    raw = _raw(record)
    if raw is None:
        raise RecordKeyError(
            f"a {type(record).__name__} record has no default lock key (a parsed model?): "
            "pass key=, a function from the record to its key"
        )
    source = raw.get("eventSource")
    if source == "aws:sqs":
        attributes = raw.get("attributes")
        group = attributes.get("MessageGroupId") if isinstance(attributes, Mapping) else None
        if not isinstance(group, str) or not group:
            raise RecordKeyError(
                f"SQS message {_record_id(raw)} has no attributes.MessageGroupId (a standard queue, "
                "not FIFO): pass key=, e.g. key=lambda r: json.loads(r.body)['orderId']"
            )
        return group
    if source == "aws:kinesis":
        kinesis = raw.get("kinesis")
        partition = kinesis.get("partitionKey") if isinstance(kinesis, Mapping) else None
        if not isinstance(partition, str) or not partition:
            raise RecordKeyError(f"Kinesis record {_record_id(raw)} has no kinesis.partitionKey: pass key=")
        return partition
    raise RecordKeyError(
        f"record {_record_id(raw)} (eventSource {source!r}) has no default lock key: pass key=, "
        "e.g. for DynamoDB Streams key=lambda r: r.dynamodb.keys['pk']"
    )


class LockedRecordHandler(Generic[R, T]):
    """A Powertools record handler that runs `handler(record, token)` under the record's lock.

    `key`: the record's lock key (default: `default_key`); `prefix` goes before it (to keep
    this consumer's keys apart from other users of the table); `wait_ms`: how long to wait for a
    busy key (default 0: fail the record at once, SQS delivers it again; None:
    FLIGHTLOCK_WAIT); `permits`: as the lock API's; `environ`: the environment to read
    (default os.environ).
    """

    def __init__(
        self,
        handler: Callable[[R, int], T],
        *,
        key: Callable[[R], str] | None = None,
        prefix: str = "",
        wait_ms: int | None = 0,
        permits: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.handler = handler
        self._key = key
        self._prefix = prefix
        self._wait_ms = wait_ms
        self._permits = permits
        self._environ = environ

    def key_of(self, record: R) -> str:
        """The lock key of `record` (prefix included)."""
        if self._key is None:
            return self._prefix + default_key(record)
        try:
            key = self._key(record)
        except Exception as e:
            raw = _raw(record)
            which = _record_id(raw) if raw is not None else type(record).__name__
            raise RecordKeyError(
                f"the key function {getattr(self._key, '__name__', self._key)!r} raised on record "
                f"{which}: {e!r}; fix it, or let it raise only for records that should fail"
            ) from e
        if not isinstance(key, str) or not key:
            raise RecordKeyError(f"the key function returned {key!r}; a lock key is a non-empty str")
        return self._prefix + key

    def __call__(self, record: R, lambda_context: LambdaContext | None = None) -> T:
        if lambda_context is None:
            raise LockApiUnavailable(
                None,
                NOT_CONFIGURED,
                "the record handler was called without lambda_context, and a lock is taken for "
                "an invocation: pass the handler's context to process_partial_response(event, "
                "record_handler, processor, context)",
            )
        key = self.key_of(record)
        locks = Locks(lambda_context, environ=self._environ)
        with locks.lock(key, self._wait_ms, permits=self._permits) as token:
            return self.handler(record, token)


@overload
def locked(handler: Callable[[R, int], T], /) -> LockedRecordHandler[R, T]: ...


@overload
def locked(
    *,
    key: Callable[[R], str] | None = None,
    prefix: str = "",
    wait_ms: int | None = 0,
    permits: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Callable[[Callable[[R, int], T]], LockedRecordHandler[R, T]]: ...


def locked(
    handler: Callable[[R, int], T] | None = None,
    /,
    *,
    key: Callable[[R], str] | None = None,
    prefix: str = "",
    wait_ms: int | None = 0,
    permits: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LockedRecordHandler[R, T] | Callable[[Callable[[R, int], T]], LockedRecordHandler[R, T]]:
    """`@locked` or `@locked(key=..., wait_ms=...)`: the record handler under a lock per record
    (see LockedRecordHandler)."""

    def wrap(h: Callable[[R, int], T]) -> LockedRecordHandler[R, T]:
        return LockedRecordHandler(
            h, key=key, prefix=prefix, wait_ms=wait_ms, permits=permits, environ=environ
        )

    return wrap if handler is None else wrap(handler)


def process_locked_batch(
    event: dict[str, Any],
    context: LambdaContext,
    record_handler: Callable[[Any, int], object],
    *,
    processor: BasePartialBatchProcessor | None = None,
    key: Callable[[Any], str] | None = None,
    prefix: str = "",
    wait_ms: int | None = 0,
    environ: Mapping[str, str] | None = None,
) -> PartialItemFailureResponse:
    """The whole batch handler: `record_handler(record, token)` for each record under its lock,
    by `processor` (default: SqsFifoPartialProcessor(skip_group_on_error=True)), answered as
    Powertools' partial batch response."""
    from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response

    if processor is None:
        processor = SqsFifoPartialProcessor(skip_group_on_error=True)
    handler = LockedRecordHandler(record_handler, key=key, prefix=prefix, wait_ms=wait_ms, environ=environ)
    return process_partial_response(event, handler, processor, context)  # type: ignore[arg-type]
