"""A bare Runtime API client for the end-to-end tests (stdlib only, no awslambdaric).

For each event it writes the raw event bytes to $RAW_DIR/<n>.event and the response headers it
received to $RAW_DIR/<n>.headers.json, then answers with the bytes of $RAW_DIR/response.bin.
With RAW_STREAM=1 it answers in Lambda's response-streaming mode: chunked, in 64 KiB pieces,
with the error trailers declared (and left empty), as a streaming runtime does.
"""

import http.client
import json
import os

api = os.environ["AWS_LAMBDA_RUNTIME_API"]
host, port = api.rsplit(":", 1)
raw_dir = os.environ["RAW_DIR"]
stream = os.environ.get("RAW_STREAM") == "1"

n = 0
while True:
    conn = http.client.HTTPConnection(host, int(port))
    conn.request("GET", "/2018-06-01/runtime/invocation/next")
    resp = conn.getresponse()
    event = resp.read()
    # Header names as they arrived (case included): the proxy must not change them.
    headers = dict(resp.getheaders())
    request_id = resp.getheader("Lambda-Runtime-Aws-Request-Id")
    n += 1
    with open(os.path.join(raw_dir, f"{n}.event"), "wb") as f:
        f.write(event)
    with open(os.path.join(raw_dir, f"{n}.headers.json"), "w") as f:
        json.dump(headers, f)
    with open(os.path.join(raw_dir, "response.bin"), "rb") as f:
        body = f.read()
    path = f"/2018-06-01/runtime/invocation/{request_id}/response"
    if stream:
        conn.putrequest("POST", path)
        conn.putheader("Lambda-Runtime-Function-Response-Mode", "streaming")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Trailer", "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body")
        conn.endheaders()
        for i in range(0, len(body), 65536):
            chunk = body[i : i + 65536]
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    else:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/octet-stream"})
    conn.getresponse().read()
    conn.close()
