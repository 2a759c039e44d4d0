#!/bin/bash
# A custom runtime as in the AWS custom-runtime tutorial: a bash `bootstrap` that loops on the
# Runtime API with curl, one short-lived curl process per request. The handler is inline and
# behaves like functions/demo-python/handler.py (same event fields, same record lines):
#   {"seq": N, "sleepMs": MS}   work for MS ms (a `sleep` child), answer {"ok":true,...}
#   {"mode": "crash"}           exit the runtime in the middle of the invocation
#   {"mode": "timeout"}         sleep far past any function timeout
set -euo pipefail

api="http://${AWS_LAMBDA_RUNTIME_API}/2018-06-01/runtime"

record() { # what request-id seq
    [ -n "${DEMO_RECORD_FILE:-}" ] || return 0
    # One short line with >> (O_APPEND): lines of concurrent writers never interleave.
    printf '{"what":"%s","requestId":"%s","seq":%s,"env":"%s","ns":%s}\n' \
        "$1" "$2" "$3" "${DEMO_ENV_NAME:-}" "$(date +%s%N)" >>"${DEMO_RECORD_FILE}"
}

field() { # name event -> the number after "name": (or empty)
    printf '%s' "$2" | grep -oE "\"$1\" *: *-?[0-9]+" | head -1 | grep -oE -- '-?[0-9]+$' || true
}

while true; do
    headers="$(mktemp)"
    event="$(curl -sS -D "${headers}" "${api}/invocation/next")"
    request_id="$(grep -i '^Lambda-Runtime-Aws-Request-Id:' "${headers}" | tr -d '[:space:]' | cut -d: -f2)"
    rm -f "${headers}"
    seq="$(field seq "${event}")"
    seq="${seq:-null}"
    sleep_ms="$(field sleepMs "${event}")"
    record start "${request_id}" "${seq}"
    sleep "$(printf '%d.%03d' $((${sleep_ms:-0} / 1000)) $((${sleep_ms:-0} % 1000)))"
    case "${event}" in
        *'"mode":"crash"'*) exit 3 ;;
        *'"mode":"timeout"'*) sleep 3600 ;;
    esac
    record end "${request_id}" "${seq}"
    curl -sS -o /dev/null -X POST "${api}/invocation/${request_id}/response" \
        -d "{\"ok\":true,\"requestId\":\"${request_id}\",\"seq\":${seq}}"
done
