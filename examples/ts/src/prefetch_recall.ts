// memsvc from a Node.js gateway: one Prefetch at call setup, one Recall mid-turn.
//
// The contract is loaded at run time from protos/memsvc/v1/memory.proto (no generated code).
//
//   npm ci && npm run build
//   node dist/prefetch_recall.js --address 127.0.0.1:50051 [--api-key KEY] [--user alice]
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "..", "protos");
// Deadline presets, as in memsvc.client: a voice turn can spare 200 ms, a chat turn 800 ms.
const VOICE_MS = 200;
const CHAT_MS = 800;

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

type Unary = (
  request: object,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response: any) => void,
) => grpc.ClientUnaryCall;

function call(
  client: grpc.Client,
  method: string,
  request: object,
  metadata: grpc.Metadata,
  deadlineMs: number,
): Promise<any> {
  const fn = (client as unknown as Record<string, Unary>)[method].bind(client);
  return new Promise((resolve, reject) => {
    fn(request, metadata, { deadline: Date.now() + deadlineMs }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

function metadataFor(apiKey: string): grpc.Metadata {
  const md = new grpc.Metadata();
  if (apiKey) md.set("x-api-key", apiKey);
  // One id per call: memsvc echoes it in the trailers and logs it on every line of the call.
  md.set("x-request-id", `ts-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`);
  return md;
}

async function main(): Promise<number> {
  const address = flag("address", "127.0.0.1:50051");
  const apiKey = flag("api-key", "");
  const userId = flag("user", "alice");

  const definition = protoLoader.loadSync(path.join(PROTO_ROOT, "memsvc/v1/memory.proto"), {
    includeDirs: [PROTO_ROOT],
    keepCase: true, // field names as in the proto: user_id, session_id, top_k
    longs: String,
    enums: String,
    defaults: true,
  });
  const loaded = grpc.loadPackageDefinition(definition) as any;
  const MemoryService = loaded.memsvc.v1.MemoryService as typeof grpc.Client;
  // One channel for the process, kept warm between calls (memsvc accepts a ping every 10 s).
  const client = new MemoryService(address, grpc.credentials.createInsecure(), {
    "grpc.keepalive_time_ms": 30000,
    "grpc.keepalive_timeout_ms": 5000,
    "grpc.keepalive_permit_without_calls": 1,
  });
  const scope = { user_id: userId };
  try {
    let started = Date.now();
    const packet = await call(
      client,
      "Prefetch",
      { scope, session_id: `ts-call-${Date.now()}`, hint: "dinner order" },
      metadataFor(apiKey),
      CHAT_MS,
    );
    console.log(
      `prefetch: ${Date.now() - started} ms, cache ${packet.cache}, ${packet.facts.length} fact(s), ` +
        `${packet.text.length} chars, degraded=${packet.degraded}`,
    );
    started = Date.now();
    const recall = await call(
      client,
      "Recall",
      { scope, query: "what is the caller allergic to", top_k: 3 },
      metadataFor(apiKey),
      VOICE_MS,
    );
    console.log(
      `recall: ${Date.now() - started} ms, ${recall.items.length} item(s), degraded=${recall.degraded}`,
    );
    for (const item of recall.items) {
      console.log(`  - [${item.type}] ${item.text} (score ${Number(item.score).toFixed(3)})`);
    }
    return 0;
  } catch (err) {
    const e = err as grpc.ServiceError;
    console.log(`memsvc call failed: ${grpc.status[e.code]} ${e.details}`);
    return 1;
  } finally {
    client.close();
  }
}

main().then((code) => process.exit(code));
