#!/usr/bin/env node
// A CRI client that shares nothing with koordnode: grpc-js on Node's own HTTP/2 stack, no
// proto files. Requests and responses are opaque bytes (identity serializers); the caller
// chooses the request bytes and judges the response bytes.
//
// Usage: node cri_client.js unix:///path/to/cri.sock < calls.json > results.json
//
// calls.json is a JSON list, performed one after the other on one channel:
//   {"path": "/runtime.v1.RuntimeService/Version",   gRPC method path
//    "request_b64": "...",                           request message, base64 ("" = empty message)
//    "kind": "unary" | "server_stream",              default "unary"
//    "deadline_ms": 5000,                            default 10000
//    "metadata": {"key": "value"},                   optional request metadata
//    "max_messages": 3}                              server_stream only: cancel after that many
//
// results.json is a JSON list, one object per call, in order:
//   {"code": 0, "code_name": "OK", "details": "",
//    "response_b64": "..." | null,                   unary: the response message (null on error)
//    "messages_b64": ["...", ...],                   server_stream: every message received
//    "header_keys": [...], "trailer_keys": [...]}    metadata keys the server sent, sorted
//
// Exit status: 0 when every call was performed (whatever its gRPC status), 2 on bad input.
'use strict';

const grpc = require('@grpc/grpc-js');

const DEFAULT_DEADLINE_MS = 10000;
const KINDS = new Set(['unary', 'server_stream']);
const CODE_NAMES = Object.fromEntries(
  Object.entries(grpc.status).filter(([, v]) => typeof v === 'number').map(([k, v]) => [v, k]),
);

const identity = (buf) => buf;

function fail(message) {
  process.stderr.write(`cri_client: ${message}\n`);
  process.exit(2);
}

function readStdin() {
  return new Promise((resolve, reject) => {
    const chunks = [];
    process.stdin.on('data', (c) => chunks.push(c));
    process.stdin.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    process.stdin.on('error', reject);
  });
}

function validateCalls(calls) {
  if (!Array.isArray(calls)) fail('stdin must hold a JSON list of calls');
  calls.forEach((call, i) => {
    if (call === null || typeof call !== 'object') fail(`call ${i}: not an object`);
    if (typeof call.path !== 'string' || !call.path.startsWith('/')) fail(`call ${i}: "path" must be "/pkg.Service/Method"`);
    const kind = call.kind ?? 'unary';
    if (!KINDS.has(kind)) fail(`call ${i}: "kind" must be one of ${[...KINDS].join(', ')}, not ${JSON.stringify(kind)}`);
    if (call.request_b64 !== undefined && typeof call.request_b64 !== 'string') fail(`call ${i}: "request_b64" must be a string`);
    if (call.deadline_ms !== undefined && !(Number.isFinite(call.deadline_ms) && call.deadline_ms > 0)) fail(`call ${i}: "deadline_ms" must be a positive number`);
    if (call.metadata !== undefined && (call.metadata === null || typeof call.metadata !== 'object')) fail(`call ${i}: "metadata" must be an object`);
    if (call.max_messages !== undefined && !(Number.isInteger(call.max_messages) && call.max_messages > 0)) fail(`call ${i}: "max_messages" must be a positive integer`);
  });
  return calls;
}

function requestMetadata(call) {
  const md = new grpc.Metadata();
  for (const [key, value] of Object.entries(call.metadata ?? {})) md.set(key, String(value));
  return md;
}

function metadataKeys(md) {
  return md ? Object.keys(md.getMap()).sort() : [];
}

function result(status, headers, extra) {
  return {
    code: status.code,
    code_name: CODE_NAMES[status.code] ?? String(status.code),
    details: status.details,
    header_keys: metadataKeys(headers),
    trailer_keys: metadataKeys(status.metadata),
    ...extra,
  };
}

// The 'status' event comes last (after the unary callback / the stream's 'end' or 'error'),
// so every call settles on it.
function unary(client, call) {
  return new Promise((resolve) => {
    let response = null;
    let headers = null;
    const request = Buffer.from(call.request_b64 ?? '', 'base64');
    const options = { deadline: Date.now() + (call.deadline_ms ?? DEFAULT_DEADLINE_MS) };
    const pending = client.makeUnaryRequest(call.path, identity, identity, request, requestMetadata(call), options,
      (err, value) => { if (!err) response = value; });
    pending.on('metadata', (md) => { headers = md; });
    pending.on('status', (status) => resolve(result(status, headers, {
      response_b64: response === null ? null : response.toString('base64'),
    })));
  });
}

function serverStream(client, call) {
  return new Promise((resolve) => {
    const messages = [];
    let headers = null;
    const request = Buffer.from(call.request_b64 ?? '', 'base64');
    const options = { deadline: Date.now() + (call.deadline_ms ?? DEFAULT_DEADLINE_MS) };
    const stream = client.makeServerStreamRequest(call.path, identity, identity, request, requestMetadata(call), options);
    stream.on('metadata', (md) => { headers = md; });
    stream.on('data', (msg) => {
      messages.push(msg.toString('base64'));
      if (call.max_messages !== undefined && messages.length >= call.max_messages) stream.cancel();
    });
    stream.on('error', () => {}); // the same status arrives on 'status'
    stream.on('status', (status) => resolve(result(status, headers, { messages_b64: messages })));
  });
}

async function main() {
  const target = process.argv[2];
  if (!target || !target.startsWith('unix:')) fail('usage: node cri_client.js unix:///path/to/socket < calls.json');
  let calls;
  try {
    calls = JSON.parse(await readStdin());
  } catch (err) {
    fail(`stdin is not valid JSON: ${err.message}`);
  }
  validateCalls(calls);

  // Kubelet's own limit for CRI messages is 16 MiB; grpc-js defaults to 4 MiB.
  const client = new grpc.Client(target, grpc.credentials.createInsecure(), {
    'grpc.max_receive_message_length': 16 * 1024 * 1024,
    'grpc.max_send_message_length': 16 * 1024 * 1024,
  });
  const results = [];
  for (const call of calls) {
    const kind = call.kind ?? 'unary';
    results.push(kind === 'unary' ? await unary(client, call) : await serverStream(client, call));
  }
  client.close();
  process.stdout.write(JSON.stringify(results) + '\n');
}

main().catch((err) => fail(err.stack || String(err)));
