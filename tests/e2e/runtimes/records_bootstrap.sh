#!/bin/bash
# A bash + curl custom runtime (as tests/e2e/runtimes/curl_bootstrap.sh) whose handler locks one
# key per event with the guide's shell client (docs/src/guide/lock-api/flightlock_locks.sh,
# copied beside this file), for tests/e2e/tests/e2e/records.rs:
#   {"key": K, "seq": N, "sleepMs": MS}   lock K with wait 0; if locked, work MS ms, record the
#                                         interval, release; answer {"locked":true,"token":T} or
#                                         {"locked":false,"status":1 (busy) or 2 (refused)}
# With RECORDS_HANDLER_HTTP_PROXY set, the handler's environment gets it as http_proxy and
# HTTP_PROXY (records.rs points it at a port nothing answers, to show the guide's client never
# sends the token through a proxy); the runtime's own calls bypass it too. Only this process gets
# it: the extension's DynamoDB client would follow it.
set -euo pipefail
if [ -n "${RECORDS_HANDLER_HTTP_PROXY:-}" ]; then
    export http_proxy="${RECORDS_HANDLER_HTTP_PROXY}" HTTP_PROXY="${RECORDS_HANDLER_HTTP_PROXY}"
fi
cd "$(dirname "$0")"
# shellcheck source=/dev/null
. ./flightlock_locks.sh

api="http://${AWS_LAMBDA_RUNTIME_API}/2018-06-01/runtime"

field() { # name event -> the number after "name": (or empty)
    printf '%s' "$2" | grep -oE "\"$1\" *: *-?[0-9]+" | head -1 | grep -oE -- '-?[0-9]+$' || true
}

while true; do
    headers="$(mktemp)"
    event="$(curl -sS --noproxy "*" -D "${headers}" "${api}/invocation/next")"
    REQUEST_ID="$(grep -i '^Lambda-Runtime-Aws-Request-Id:' "${headers}" | tr -d '[:space:]' | cut -d: -f2)"
    rm -f "${headers}"
    key="$(printf '%s' "${event}" | grep -oE '"key" *: *"[^"]*"' | head -1 | sed 's/.*"\([^"]*\)"$/\1/' || true)"
    seq="$(field seq "${event}")"
    sleep_ms="$(field sleepMs "${event}")"
    sleep_ms="${sleep_ms:-0}"
    token=$(lock_acquire "${key}" 0) && status=0 || status=$?
    if [ "${status}" = 0 ]; then
        start="$(date +%s%N)"
        sleep "$(printf '%d.%03d' $((sleep_ms / 1000)) $((sleep_ms % 1000)))"
        end="$(date +%s%N)"
        if [ -n "${DEMO_RECORD_FILE:-}" ]; then
            printf '{"what":"record","entity":"%s","seq":%s,"token":%s,"start":%s,"end":%s,"env":"%s","pid":%s,"requestId":"%s"}\n' \
                "${key}" "${seq:-null}" "${token}" "${start}" "${end}" "${DEMO_ENV_NAME:-}" "$$" "${REQUEST_ID}" >>"${DEMO_RECORD_FILE}"
        fi
        lock_release "${key}"
        answer="{\"locked\":true,\"token\":${token}}"
    else
        answer="{\"locked\":false,\"status\":${status}}"
    fi
    curl -sS --noproxy "*" -o /dev/null -X POST "${api}/invocation/${REQUEST_ID}/response" -d "${answer}"
done
