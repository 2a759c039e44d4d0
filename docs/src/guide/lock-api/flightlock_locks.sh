# Per-record locks through the flightlock layer's lock API from a bash handler: curl only.
# Source this file, set REQUEST_ID (the Lambda-Runtime-Aws-Request-Id header of the event the
# runtime fetched), then:
#
#   if token=$(lock_acquire order-7 0); then   # key, wait in ms (empty: FLIGHTLOCK_WAIT)
#       ...work, passing $token along...
#       lock_release order-7
#   fi                                         # status 1: busy; 2: refused (why: on stderr)
#
# Keys go into the JSON body as they are: keep them to characters JSON needs no escape for.

_lock_call() { # call body -> $_lock_status (HTTP) and $_lock_answer (JSON); 2 if curl failed
    local out
    # --noproxy '*': the API is on this machine, and the token must never reach an http_proxy.
    # Under SnapStart Lambda sets AWS_CONTAINER_AUTHORIZATION_TOKEN instead of AWS_SESSION_TOKEN.
    out=$(curl -sS --noproxy '*' -w '\n%{http_code}' -X POST \
        "http://${AWS_LAMBDA_RUNTIME_API}/flightlock/v1/invocations/${REQUEST_ID}/$1" \
        -H "X-Flightlock-Token: ${AWS_SESSION_TOKEN:-${AWS_CONTAINER_AUTHORIZATION_TOKEN:-}}" \
        -H 'Content-Type: application/json' \
        --data-binary "$2") || return 2
    _lock_status=${out##*$'\n'}
    _lock_answer=${out%$'\n'*}
}

lock_acquire() { # key [wait-ms] -> prints the fencing token; status 0 locked, 1 busy, 2 refused
    local body="{\"key\":\"$1\"}"
    [ -z "${2:-}" ] || body="{\"key\":\"$1\",\"waitMs\":$2}"
    _lock_call acquire "$body" || return 2
    if [ "$_lock_status" = 200 ]; then
        printf '%s\n' "$_lock_answer" | sed -n 's/.*"token":\([0-9]*\).*/\1/p'
        return 0
    fi
    case "$_lock_answer" in *'"error":"busy"'*) return 1 ;; esac
    echo "flightlock lock API: ${_lock_status} ${_lock_answer}" >&2
    return 2
}

lock_release() { # key -> status 0 released, 2 refused
    _lock_call release "{\"key\":\"$1\"}" || return 2
    [ "$_lock_status" = 200 ] && return 0
    echo "flightlock lock API: ${_lock_status} ${_lock_answer}" >&2
    return 2
}
