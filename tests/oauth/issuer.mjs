// An identity provider (oidc-provider) issuing JWT access tokens, for recast's tests of callers
// (tests/it/tokens.rs): client credentials with a resource indicator, signed RS256 by the first
// key of its set, its discovery document and key set where OpenID says. Listens on 127.0.0.1 on
// the port given (0: any free one) and prints one JSON line when it listens: {"port": N}.
//
//   node issuer.mjs PORT STATE_FILE [rotate]
//
// The keys are kept in STATE_FILE (made on the first start), so a provider started again on the
// same port and file is the same issuer with the same keys; with `rotate`, a new key is made and
// put first, so it signs from then on while the old ones stay in the set.
//
// GET /test/counts answers {"jwks": N, "discovery": N, "tokens": N}: what it was asked since it
// started.

import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, stateFile, rotate] = process.argv.slice(2);
if (!port || !stateFile) {
  console.error('usage: node issuer.mjs PORT STATE_FILE [rotate]');
  process.exit(2);
}

function newKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg: 'RS256', use: 'sig' };
}

let keys = existsSync(stateFile) ? JSON.parse(readFileSync(stateFile, 'utf8')) : [newKey()];
if (rotate === 'rotate') keys = [newKey(), ...keys];
writeFileSync(stateFile, JSON.stringify(keys));

const issuer = `http://127.0.0.1:${port}`;
const counts = { jwks: 0, discovery: 0, tokens: 0 };
const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'mobile',
      client_secret: 'mobile-secret',
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_basic',
      scope: 'orders:read',
    },
  ],
  scopes: ['orders:read'],
  jwks: { keys },
  features: {
    clientCredentials: { enabled: true },
    devInteractions: { enabled: false },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => 'https://orders.test/',
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'orders:read',
        audience: 'orders-api',
        accessTokenFormat: 'jwt',
        accessTokenTTL: 600,
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  cookies: { keys: ['recast-tests-only'] },
});
provider.use(async (ctx, next) => {
  if (ctx.path === '/test/counts') {
    ctx.body = counts;
    return;
  }
  if (ctx.path === '/jwks') counts.jwks += 1;
  if (ctx.path === '/.well-known/openid-configuration') counts.discovery += 1;
  if (ctx.path === '/token') counts.tokens += 1;
  await next();
});
const server = provider.listen(Number(port), '127.0.0.1', () => {
  console.log(JSON.stringify({ port: server.address().port }));
});

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
