// index.mjs and index.cjs (and powertools.mjs and .cjs) are two hand-written copies of one API,
// so `import` and `require` users get the same thing: same exports, same constants, same
// behaviour (client.test.mjs and powertools.test.mjs run every test on both).
import { strict as assert } from "node:assert";
import { createRequire } from "node:module";
import { test } from "node:test";

import * as esm from "flightlock";
import * as esmPowertools from "flightlock/powertools";

const require = createRequire(import.meta.url);

const shape = (m) =>
  Object.fromEntries(
    Object.keys(m)
      .sort()
      .map((k) => {
        const v = m[k];
        if (typeof v !== "function") return [k, v];
        const proto = v.prototype ? Object.getOwnPropertyNames(v.prototype).sort() : [];
        const symbols = v.prototype ? Object.getOwnPropertySymbols(v.prototype).map(String) : [];
        return [k, { kind: typeof v, length: v.length, proto, symbols }];
      }),
  );

test("import and require give the same API", () => {
  assert.deepEqual(shape(require("flightlock")), shape(esm));
  assert.deepEqual(shape(require("flightlock/powertools")), shape(esmPowertools));
  assert.ok(Object.keys(esm).length >= 5 && Object.keys(esmPowertools).length >= 5);
});

test("the package resolves to the files its exports name", () => {
  assert.match(require.resolve("flightlock"), /node_modules\/flightlock\/index\.cjs$/);
  assert.match(import.meta.resolve("flightlock"), /node_modules\/flightlock\/index\.mjs$/);
  assert.match(import.meta.resolve("flightlock/powertools"), /node_modules\/flightlock\/powertools\.mjs$/);
});
