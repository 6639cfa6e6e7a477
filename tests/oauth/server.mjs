// The OAuth 2.0 side of recast's tests of OAuth2 client credentials (tests/it/oauth.rs): an
// authorization server (oidc-provider) and a resource server that accepts a call only when the
// authorization server's introspection says its token is active. Each listens on 127.0.0.1, on the
// port given (0: any free one), and prints one JSON line when it listens: {"port": N}.
//
//   node server.mjs authorization PORT TTL_SECONDS
//   node server.mjs resource PORT INTROSPECTION_URL
//
// Both count what they receive; GET /test/counts answers the counts as JSON (the resource server's
// with the number of different tokens it accepted, and the last one). The authorization
// server also takes POST /test/revoke-all (every access token it issued is revoked, as its
// revocation endpoint would) and POST /test/delay?ms=N (each token answer waits N ms first).

import http from 'node:http';
import Provider from 'oidc-provider';

// The clients the authorization server knows. The resource server authenticates as `resource`
// to introspect tokens.
export const CLIENTS = [
  { client_id: 'basic-client', client_secret: 'basic-secret', token_endpoint_auth_method: 'client_secret_basic' },
  { client_id: 'post-client', client_secret: 'post-secret', token_endpoint_auth_method: 'client_secret_post' },
  { client_id: 'resource', client_secret: 'resource-secret', token_endpoint_auth_method: 'client_secret_basic' },
].map((client) => ({ ...client, grant_types: ['client_credentials'], redirect_uris: [], response_types: [], scope: 'read write' }));

const [mode, port, arg] = process.argv.slice(2);

function listening(server) {
  console.log(JSON.stringify({ port: server.address().port }));
}

function json(res, status, body, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

if (mode === 'authorization') {
  const ttl = Number(arg);
  const counts = { issued: 0, tokenRequests: 0, introspections: 0, revoked: 0 };
  const issued = new Map();
  let delay = 0;
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    clients: CLIENTS,
    scopes: ['read', 'write'],
    features: {
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      devInteractions: { enabled: false },
    },
    ttl: { ClientCredentials: () => ttl },
    cookies: { keys: ['recast-tests-only'] },
  });
  provider.on('client_credentials.saved', (token) => {
    counts.issued += 1;
    issued.set(token.jti, token);
  });
  provider.use(async (ctx, next) => {
    if (ctx.path === '/test/counts') {
      ctx.body = counts;
      return;
    }
    if (ctx.path === '/test/revoke-all' && ctx.method === 'POST') {
      for (const token of issued.values()) {
        await token.destroy();
        counts.revoked += 1;
      }
      issued.clear();
      ctx.body = counts;
      return;
    }
    if (ctx.path === '/test/delay' && ctx.method === 'POST') {
      delay = Number(ctx.query.ms);
      ctx.body = { delay };
      return;
    }
    if (ctx.path === '/token') {
      counts.tokenRequests += 1;
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
    }
    if (ctx.path === '/token/introspection') counts.introspections += 1;
    await next();
  });
  // The default key set is for development; the warnings it prints are expected here.
  const server = provider.listen(Number(port), '127.0.0.1', () => listening(server));
} else if (mode === 'resource') {
  const introspection = arg;
  const resource = CLIENTS.find((c) => c.client_id === 'resource');
  const basic = Buffer.from(`${resource.client_id}:${resource.client_secret}`).toString('base64');
  const counts = { calls: 0, accepted: 0, rejected: 0, tokens: [] };
  const server = http.createServer(async (req, res) => {
    if (req.url === '/test/counts') {
      return json(res, 200, { ...counts, tokens: new Set(counts.tokens).size, lastToken: counts.tokens.at(-1) ?? null });
    }
    counts.calls += 1;
    const auth = req.headers.authorization ?? '';
    const token = /^Bearer (.+)$/.exec(auth)?.[1];
    let active = null;
    if (token) {
      try {
        const answer = await fetch(introspection, {
          method: 'POST',
          headers: { authorization: `Basic ${basic}`, 'content-type': 'application/x-www-form-urlencoded' },
          body: new URLSearchParams({ token }),
        });
        active = await answer.json();
      } catch (e) {
        return json(res, 503, { error: `introspection failed: ${e}` });
      }
    }
    if (!active?.active) {
      counts.rejected += 1;
      return json(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token"' });
    }
    counts.accepted += 1;
    counts.tokens.push(token);
    return json(res, 200, { client: active.client_id, scope: active.scope ?? null, path: req.url, calls: counts.calls });
  });
  server.listen(Number(port), '127.0.0.1', () => listening(server));
} else {
  console.error('usage: node server.mjs authorization PORT TTL_SECONDS | resource PORT INTROSPECTION_URL');
  process.exit(2);
}

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
