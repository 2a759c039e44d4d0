"""moto's server, answering one DynamoDB request at a time (started by scripts/dynamodb-local).

moto checks a DynamoDB condition and then writes in two Python steps, with no lock between its
request threads: two concurrent conditional writes on one item can both pass their condition.
DynamoDB applies each conditional write atomically, and the lock's exclusion rests on that, so
against moto's threaded server the exclusion test lost updates (3 runs in 4 with a 6 s lease)
that DynamoDB Local and a single-threaded moto never showed. Here DynamoDB requests (those with
an `X-Amz-Target: DynamoDB_...` header) run one at a time; every other service is answered
concurrently, as by `moto_server`.

usage: python moto-serialized.py -H HOST -p PORT
"""

import argparse
import threading

from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

DYNAMODB = threading.Lock()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)

    def serialized(environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_"):
            return app(environ, start_response)
        with DYNAMODB:
            result = app(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()

    run_simple(args.host, args.port, serialized, threaded=True)


if __name__ == "__main__":
    main()
