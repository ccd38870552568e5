// hello-typescript: the smallest TypeScript tools bundle, one tool on the TypeScript SDK.
import { createServer, defineTool, facts, log, result, run, serveStdio, z } from "@mesh/sdk";

run(async () => {
  // The runtime's facts, read at start so that a bundle started outside the runtime says so at once.
  const here = facts();
  const server = createServer({ name: "hello-typescript", version: "0.1.0" });

  defineTool(
    server,
    "greet",
    {
      title: "Greet",
      description: "Say hello to someone by name.",
      input: { name: z.string().min(1).describe("who to greet") },
      output: { greeting: z.string() },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    ({ name }) => {
      const greeting = `Hello, ${name}! (typescript)`;
      return result(greeting, { greeting });
    },
  );

  await serveStdio(server);
  log.info("serving %s/%s on node %s", here.module, here.bundle, here.node);
});
