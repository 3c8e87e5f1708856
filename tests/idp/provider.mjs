// A real OpenID Connect provider on loopback for the tests (the npm package oidc-provider, pinned in
// package.json as a development dependency). Configured by environment variables, set by
// tests/idp/__init__.py:
//   IDP_PORT          the port to listen on (127.0.0.1)
//   IDP_CLIENT        JSON: {client_id, client_secret, redirect_uris, post_logout_redirect_uris}
//   IDP_JWKS          JSON: {keys: [private RSA JWK]}: the test holds the signing key too, so that it
//                     can make tokens the provider could have signed (expired ones, for example)
//   IDP_ACCOUNTS      a JSON file, read at every sign-in: {"<login>": {claims...}}; a test changes a
//                     person's groups by writing it again
// Sign-in is the provider's development form: any password, but only the logins in IDP_ACCOUNTS
// exist. Consent is given once for the one client (a first-party portal asks no one). PKCE is
// required of every client.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const port = Number(process.env.IDP_PORT);
const issuer = `http://127.0.0.1:${port}`;
const client = JSON.parse(process.env.IDP_CLIENT);
const jwks = JSON.parse(process.env.IDP_JWKS);
const accounts = () => JSON.parse(readFileSync(process.env.IDP_ACCOUNTS, "utf8"));

const provider = new Provider(issuer, {
  clients: [
    {
      ...client,
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_post",
    },
  ],
  jwks,
  cookies: { keys: ["gpuportal-test-idp-cookie-key"] },
  claims: {
    openid: ["sub"],
    email: ["email", "email_verified"],
    profile: ["name", "given_name", "family_name", "preferred_username"],
    groups: ["groups"],
  },
  async findAccount(ctx, id) {
    const claims = accounts()[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope("openid email profile groups");
    await grant.save();
    return grant;
  },
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  ttl: { IdToken: 600, AccessToken: 600, Session: 3600, Interaction: 600, Grant: 3600 },
});
provider.proxy = false;
for (const event of ["end_session.error", "authorization.error", "grant.error", "server_error"]) {
  provider.on(event, (ctx, error) => console.error(event, error, error?.cause));
}
provider.listen(port, "127.0.0.1", () => console.log(`oidc provider ready at ${issuer}`));
