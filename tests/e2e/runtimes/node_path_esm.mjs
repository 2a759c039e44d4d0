// Lambda's managed Node.js runtimes (18 and later) resolve an ES module's bare import from the
// directories on NODE_PATH too, which is how a handler imports a layer's
// /opt/nodejs/node_modules package; Node's own ES module resolution ignores NODE_PATH, and so
// does the npm aws-lambda-ric that runs under the Runtime Interface Emulator here. Loaded with
// `node --import` (NODE_OPTIONS, set by the e2e harness for Node runtimes with the layer), this
// does what the managed runtime does: a bare specifier that Node does not find from the importing
// module is looked up in each NODE_PATH directory, in order. CommonJS `require` reads NODE_PATH
// itself.
import { register } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { isMainThread } from "node:worker_threads";

// The hooks run on a thread of their own, which loads this file again.
if (isMainThread) register(import.meta.url);

const bare = (specifier) => !/^(\.|\/|[a-zA-Z][a-zA-Z0-9+.-]*:)/.test(specifier);

export async function resolve(specifier, context, next) {
  try {
    return await next(specifier, context);
  } catch (e) {
    if (e?.code !== "ERR_MODULE_NOT_FOUND" || !bare(specifier)) throw e;
    for (const dir of (process.env.NODE_PATH ?? "").split(":").filter(Boolean)) {
      // Resolved as if imported from a module in `dir`: Node searches `dir` itself for packages.
      const parentURL = pathToFileURL(join(dir, "index.js")).href;
      try {
        return await next(specifier, { ...context, parentURL });
      } catch {
        // not in this directory
      }
    }
    throw e;
  }
}
