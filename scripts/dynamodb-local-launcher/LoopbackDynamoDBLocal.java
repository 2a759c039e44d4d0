// Loopback-only launcher for DynamoDB Local (flightlock dev/test tooling).
//
// Why this exists: DynamoDB Local's stock entry point
// (`java -jar DynamoDBLocal.jar`, i.e. software.amazon.dynamodb.services.local.main.ServerRunner;
// com.amazonaws.services.dynamodbv2.local.main.ServerRunner before DynamoDB Local 3.0) only has a
// `-port` option and its embedded Jetty server listens on every interface (0.0.0.0 / [::]).
// We want the local database reachable from this machine only, so this launcher builds the very
// same server the stock launcher builds and then pins its Jetty connector to 127.0.0.1 before
// starting it.
//
// How the stock server is put together (read with `javap -p -c`, DynamoDB Local 3.3.x):
//   ServerRunner.createServerFromCommandLineArgs(String[])        (public static)
//     -> parses the usual CLI flags (-inMemory, -port, -sharedDb, -disableTelemetry, ...),
//        configures telemetry, and returns
//        new DynamoDBProxyServer(port,
//              new LocalDynamoDBServerHandler(new LocalDynamoDBRequestHandler(...), cors))
//   DynamoDBProxyServer keeps the Jetty server in `private final org.eclipse.jetty.server.Server
//   server`, created with `new Server(port)`, which installs a single ServerConnector with no host
//   (= all interfaces). DynamoDBProxyServer.start() just calls server.start().
// So: create the server exactly like ServerRunner does, read the private `server` field by
// reflection (the only reflection used here), call ServerConnector.setHost("127.0.0.1") on its
// connector(s), then start it.
//
// Usage (the flags are the stock DynamoDB Local flags, passed through unchanged, plus our own
// -exitWhenStdinCloses):
//   java -Djava.library.path=<dir>/DynamoDBLocal_lib \
//        -cp <launcher-classes-dir>:<dir>/DynamoDBLocal.jar:<dir>/DynamoDBLocal_lib/* \
//        LoopbackDynamoDBLocal -inMemory -port 8000 -disableTelemetry [-sharedDb] [-exitWhenStdinCloses]
//
// -exitWhenStdinCloses: the server exits when its standard input reaches end of file. The
// testkit starts the server with a pipe as stdin and never writes to it; the kernel closes the
// pipe when the test process ends, however it ends (even SIGKILL), so no server outlives its
// tests, without a watcher process or signal handlers in the tests.

import java.io.IOException;
import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.List;

import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

public final class LoopbackDynamoDBLocal {
    /** The only address we ever listen on. Deliberately not configurable. */
    private static final String HOST = "127.0.0.1";

    private LoopbackDynamoDBLocal() {}

    /** Our own flag (see the header); DynamoDB Local never sees it. */
    private static final String EXIT_WHEN_STDIN_CLOSES = "-exitWhenStdinCloses";

    public static void main(String[] args) throws Exception {
        final List<String> stock = new ArrayList<>(List.of(args));
        if (stock.remove(EXIT_WHEN_STDIN_CLOSES)) {
            exitWhenStdinCloses();
        }
        // Same construction path as `java -jar DynamoDBLocal.jar` (ServerRunner.main), minus the
        // start: we must change the connector before Jetty binds its socket.
        final DynamoDBProxyServer proxy =
                ServerRunner.createServerFromCommandLineArgs(stock.toArray(new String[0]));
        if (proxy == null) {
            // e.g. -help / -version, or bad arguments: ServerRunner has already printed why.
            System.exit(2);
        }

        final Server jetty = jettyServerOf(proxy);
        final Connector[] connectors = jetty.getConnectors();
        if (connectors.length == 0) {
            fail("DynamoDB Local created a Jetty server without connectors; launcher needs updating");
        }
        for (Connector connector : connectors) {
            if (!(connector instanceof ServerConnector)) {
                fail("unexpected Jetty connector type " + connector.getClass().getName()
                        + "; refusing to start a server that might listen on all interfaces");
            }
            ((ServerConnector) connector).setHost(HOST);
        }

        // DynamoDBProxyServer.start() = jetty.start() + optional telemetry; on a bind failure it
        // prints "Could not start server on port ..." and stops Jetty instead of throwing, so check.
        proxy.start();
        if (!jetty.isStarted()) {
            fail("DynamoDB Local did not start (see the message above)");
        }

        // Stop Jetty cleanly on SIGTERM/SIGINT (the data is in memory, so nothing to flush).
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                proxy.stop();
            } catch (Exception ignored) {
                // Shutting down anyway.
            }
        }, "dynamodb-local-shutdown"));

        for (Connector connector : connectors) {
            ServerConnector sc = (ServerConnector) connector;
            System.out.println("LoopbackDynamoDBLocal: listening on http://" + sc.getHost() + ":"
                    + sc.getLocalPort());
        }
        System.out.flush();
        proxy.join();
    }

    /** Halts the JVM once stdin reaches end of file (the data is in memory: nothing to save). */
    private static void exitWhenStdinCloses() {
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() != -1) {
                    // Whatever is written is ignored; only the end matters.
                }
            } catch (IOException closed) {
                // A broken stdin ends the server too.
            }
            Runtime.getRuntime().halt(0);
        }, "exit-when-stdin-closes");
        watcher.setDaemon(true);
        watcher.start();
    }

    /** Reads DynamoDBProxyServer's private Jetty `server` field. */
    private static Server jettyServerOf(DynamoDBProxyServer proxy) throws ReflectiveOperationException {
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true); // same module (classpath), so no --add-opens needed
        return (Server) field.get(proxy);
    }

    private static void fail(String message) {
        System.err.println("LoopbackDynamoDBLocal: " + message);
        System.exit(1);
    }
}
